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

from scheduling.engine import types as t
from scheduling.models import PodAllocation, Workload, WorkloadKind, WorkloadState

CHUNK = 2000  # ids per IN (...) list: well under SQLite's limit on parameters
AllocKey = tuple[tuple[int, int], ...]  # (allocation id, version), by id


@dataclass
class Row:
    """One workload as last read: its row, its allocations and what it converts to."""

    wl: Workload
    allocations: list[PodAllocation]  # by pod index
    key: tuple[int, AllocKey, str]  # (version, allocations' versions, project name)
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


KEPT_ROWS = KeptRows()
