"""The workload and allocation rows a cycle reads, kept between cycles of one process.

Each cycle reads only (id, version) of every workload the snapshot may hold (pending
ones, and any with allocations) and of every allocation: a few integers per row. A
workload whose version, allocations' versions or project name differ from what was
kept, or which is new, is read again in full with its allocations; the others are taken
from what was kept, with the engine workload already made from them (the same object,
which the engine's kept state recognises at no cost). Versions are written by the same
statement as each change (portal/versioned.py), so what a cycle keeps never hides a
committed change: a change committed after the version list was read is either read
with its row (the row carries its own version, kept with it) or seen next cycle.

Nothing here is trusted across a failed cycle: `forget()` drops it all, and the next
cycle reads everything again (as the first one of a process does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Q

from clusters.models import Cluster, Gpu, MigInstance, Node, NodePool
from scheduling.engine import types as t
from scheduling.models import PodAllocation, Workload, WorkloadKind, WorkloadState

CHUNK = 2000  # ids per IN (...) list: well under SQLite's limit on parameters
Pairs = tuple[tuple[int, int], ...]  # (row id, version), by id


@dataclass
class Row:
    """One workload as last read: its row, its allocations and what it converts to."""

    wl: Workload
    allocations: list[PodAllocation]  # by pod index
    key: tuple[int, Pairs, str]  # (version, allocations' versions, project name)
    # What _convert made of it, once asked: an engine workload or why it cannot be one.
    converted: t.Workload | None = None
    problem: str = ""
    done: bool = False


@dataclass
class KeptRows:
    rows: dict[int, Row] = field(default_factory=dict)
    reads: int = 0  # full reads of workload rows, for tests and the bench
    fresh_reads: int = 0  # times everything was read again

    def forget(self) -> None:
        self.rows.clear()

    def written(self, wl: Workload) -> None:
        """The cycle wrote this kept row itself and holds what it wrote (only the row's
        version and fields the conversion does not read): keep it at its new version.
        If the cycle's transaction rolls back, the cycle forgets every kept row."""
        row = self.rows.get(wl.pk)
        if row is not None and row.wl is wl:
            row.key = (wl.version, *row.key[1:])

    def refresh(self, names: dict[int, str]) -> dict[int, Row]:
        """Bring the kept rows to the database's state, given every project's name by
        id (a workload's engine name holds it); every row the snapshot may hold, by
        workload id (any order)."""
        allocs: dict[int, list[tuple[int, int]]] = {}
        for wid, pk, version in PodAllocation.objects.values_list("workload_id", "pk", "version"):
            allocs.setdefault(wid, []).append((pk, version))
        # Holders, and pending rows (those with allocations are holders): a superset of
        # what the snapshot takes (holders_and_pending picks from it), with no join.
        holding = Q(pk__in=PodAllocation.objects.values("workload_id"))
        pending = Q(state=WorkloadState.PENDING) & ~Q(kind=WorkloadKind.HPO)
        wanted = dict(Workload.objects.filter(holding | pending).values_list("pk", "version"))
        wanted.update((wid, None) for wid in allocs.keys() - wanted.keys())  # read in full
        stale = []
        for wid, version in wanted.items():
            row = self.rows.get(wid)
            if row is None or row.key != (
                version,
                tuple(sorted(allocs.get(wid, ()))),
                names.get(row.wl.project_id),
            ):
                stale.append(wid)
        for wid in self.rows.keys() - wanted.keys():
            del self.rows[wid]
        if not self.rows:
            self.fresh_reads += 1
        self._read(stale)
        return self.rows

    def _read(self, ids: list[int]) -> None:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            by_workload: dict[int, list[PodAllocation]] = {}
            for alloc in PodAllocation.objects.filter(workload_id__in=chunk).order_by(
                "workload_id", "pod_index"
            ):
                by_workload.setdefault(alloc.workload_id, []).append(alloc)
            found = Workload.objects.filter(pk__in=chunk).select_related("parent", "project")
            for wl in found:
                mine = by_workload.get(wl.pk, [])
                key = (wl.version, tuple(sorted((a.pk, a.version) for a in mine)), wl.project.name)
                self.rows[wl.pk] = Row(wl, mine, key)
            self.reads += len(chunk)
            for wid in set(chunk) - {wl.pk for wl in found}:
                self.rows.pop(wid, None)  # gone between the two reads


def holders_and_pending(rows: Iterable[Row]) -> tuple[list[Row], list[Row]]:
    """Rows with allocations (by id), and pending rows without (by id), from kept rows as
    read_snapshot's queries would have selected them."""
    holders, pending = [], []
    for row in sorted(rows, key=lambda row: row.wl.pk):
        if row.allocations:
            holders.append(row)
        elif row.wl.state == WorkloadState.PENDING and row.wl.kind != WorkloadKind.HPO:
            pending.append(row)
    return holders, pending


@dataclass
class NodeRow:
    """One node as last read: its row with its GPUs and their MIG instances attached
    (`gpu_list`, `mig_list`, as adapters._nodes makes them), and the engine node made
    from it with the allocations on it at the time."""

    node: Node
    key: tuple[int, Pairs, Pairs]  # (version, GPUs' versions, MIG instances' versions)
    made: t.Node | None = None
    made_from: tuple = ()  # what `made` depends on beyond the row: see adapters


@dataclass
class KeptNodes:
    rows: dict[int, NodeRow] = field(default_factory=dict)
    pools: dict[int, NodePool] = field(default_factory=dict)  # every pool, as last read
    reads: int = 0

    def forget(self) -> None:
        self.rows.clear()

    def refresh(self) -> list[NodeRow]:
        """Nodes of enabled clusters that belong to a pool, by id, with their cluster and
        pool rows as they are now; only nodes whose row, GPUs or MIG instances changed
        are read again."""
        clusters = {c.pk: c for c in Cluster.objects.filter(enabled=True)}
        pools = self.pools = {p.pk: p for p in NodePool.objects.all()}
        wanted = dict(
            Node.objects.filter(cluster_id__in=clusters, pool__isnull=False)
            .order_by("pk")
            .values_list("pk", "version")
        )
        gpu_node: dict[int, int] = {}
        gpus: dict[int, list[tuple[int, int]]] = {}
        for node_id, pk, version in Gpu.objects.values_list("node_id", "pk", "version"):
            gpu_node[pk] = node_id
            gpus.setdefault(node_id, []).append((pk, version))
        migs: dict[int, list[tuple[int, int]]] = {}
        for gpu_id, pk, version in MigInstance.objects.values_list("gpu_id", "pk", "version"):
            migs.setdefault(gpu_node.get(gpu_id, 0), []).append((pk, version))
        for pk in self.rows.keys() - wanted.keys():
            del self.rows[pk]
        stale = [
            pk
            for pk, version in wanted.items()
            if pk not in self.rows
            or self.rows[pk].key
            != (version, tuple(sorted(gpus.get(pk, ()))), tuple(sorted(migs.get(pk, ()))))
        ]
        for start in range(0, len(stale), CHUNK):
            self._read(stale[start : start + CHUNK])
        rows = []
        for pk in sorted(wanted):
            row = self.rows.get(pk)
            if row is None:
                continue  # gone between the two reads
            row.node.cluster = clusters[row.node.cluster_id]
            row.node.pool = pools[row.node.pool_id]
            rows.append(row)
        return rows

    def _read(self, ids: list[int]) -> None:
        instances: dict[int, list[MigInstance]] = {}
        for inst in MigInstance.objects.filter(gpu__node_id__in=ids).order_by("gpu_id", "start"):
            instances.setdefault(inst.gpu_id, []).append(inst)
        gpus: dict[int, list[Gpu]] = {}
        for gpu in Gpu.objects.filter(node_id__in=ids).order_by("node_id", "index"):
            gpu.mig_list = instances.get(gpu.pk, [])
            gpus.setdefault(gpu.node_id, []).append(gpu)
        for node in Node.objects.filter(pk__in=ids):
            node.gpu_list = gpus.get(node.pk, [])
            key = (
                node.version,
                tuple(sorted((g.pk, g.version) for g in node.gpu_list)),
                tuple(sorted((i.pk, i.version) for g in node.gpu_list for i in g.mig_list)),
            )
            self.rows[node.pk] = NodeRow(node, key)
            self.reads += 1


KEPT_ROWS = KeptRows()
KEPT_NODES = KeptNodes()
