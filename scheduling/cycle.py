"""One scheduling cycle: lock, read the database, ask the engine, write its decisions.

Decisions are applied in one transaction; reconciliation is asked to act on the
affected clusters only once it commits. A GPU is never handed out twice, even for a
moment: an admission that lands on GPUs still held by evicted or stopped pods is held
back (the workload stays pending, saying what it waits for) until reconciliation
confirms those pods are gone; while any pod is still going away, the cycle starts no
new evictions, so it does not evict a second victim for the same beneficiary.

The cycle lock only saves work. What makes double allocation impossible is the
database: the cycle locks the rows of every node it may place on (SELECT ... FOR UPDATE,
in primary-key order) before it reads the snapshot, so a second cycle that runs without
the lock waits for the first to commit and then reads its allocations; and just before
writing, with the rows of the GPUs it touches locked (in (node, index) order), the new
allocations are checked against the allocations the database holds (`capacity_check`),
so a cycle that got past both can only fail (rolled back, recorded), never over-commit.

A row that cannot be turned into an engine request (a value out of range, planted in
the database or left by an older version) is failed with the reason, on its timeline and
in the audit log (`quarantine`), and the rest of the cycle runs.

Each cycle writes its CycleRun row first, as running, with its lock token: when a later
cycle holds the lock and finds a running row with another token, that worker died
mid-cycle, and the row is marked aborted.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DatabaseError, transaction
from django.db.models import F
from django.utils import timezone

from clusters.models import Gpu, Node, NodePool
from portal.audit import audit_log
from portal.tolerant import unreadable_columns
from portal.versioned import column_set
from scheduling import adapters, gpu_range
from scheduling.autoscale import autoscale_apply
from scheduling.elastic import resizes_apply
from scheduling.engine import types as t
from scheduling.engine.cycle import Engine, paused_gc
from scheduling.kept_rows import KEPT_NODES, KEPT_ROWS
from scheduling.lifecycle import workload_transition, workloads_transition
from scheduling.locks import Lease, cycle_lock
from scheduling.mig import mig_instances_apply
from scheduling.models import (
    ACTIVE_STATES,
    CycleRun,
    CycleState,
    PodAllocation,
    Workload,
    WorkloadKind,
    WorkloadState,
)
from scheduling.nominations import nominations_due, nominations_save, nominations_waiting
from scheduling.services import workload_stop
from scheduling.signals import clusters_changed
from scheduling.sweep_states import sweeps_update

logger = logging.getLogger(__name__)
# An eviction's event in words: {by} is the workload it made room for (project/name),
# {project} that workload's project, {detail} the engine's numbers.
EVICTION_TEXT = {
    t.EvictionReason.RECLAIM: "Reclaimed for project {project}'s guaranteed quota: {by} needs "
    "{detail}",
    t.EvictionReason.PREEMPT: "Preempted by higher-priority work: {by} ({detail})",
    t.EvictionReason.BORROWED: "Preempted to give back GPUs borrowed over the project's quota: "
    "{by}, within the guaranteed quota, needs {detail}",
    t.EvictionReason.CONSOLIDATE: "Moved to free a whole slot for {by} (defragmentation)",
    t.EvictionReason.STALE_GANG: "Stopped because its gang stayed below its minimum pods too "
    "long ({detail})",
}


class OvercommitRefused(RuntimeError):
    """The cycle's decisions would put more on a GPU than it holds: nothing is written."""


def cycle_run(now: datetime | None = None) -> CycleRun | None:
    """Run a cycle if no other is running; None when another worker holds the lock."""
    with cycle_lock() as lease:
        if not lease:
            logger.info("scheduling cycle skipped: another one is running")
            return None
        return run_locked(now or timezone.now(), lease)


def aborted_mark(holder: str) -> int:
    """Runs left `running` by other holders: their worker died mid-cycle (we hold the lock
    now, so theirs expired without renewal). Marked aborted; how many."""
    return (
        CycleRun.objects.filter(state=CycleState.RUNNING)
        .exclude(holder=holder)
        .update(
            state=CycleState.ABORTED,
            ok=False,
            error="Aborted: the worker running this cycle stopped (its lock expired without "
            "renewal); nothing it decided was written.",
        )
    )


def run_locked(now: datetime, lease: Lease | None = None) -> CycleRun:
    """One cycle; the caller holds the lock (or, in tests, deliberately does not)."""
    holder = lease.token if lease else ""
    if lease:
        aborted_mark(holder)
    run = CycleRun.objects.create(started_at=now, state=CycleState.RUNNING, holder=holder)
    started = time.perf_counter()
    clusters: set[int] = set()
    try:
        # The collector paused as the engine pauses it: with the rows and engine state kept
        # between cycles alive, each of the full passes a cycle's allocations trigger would
        # walk them all (at 1,000 nodes most of a steady cycle's CPU went there).
        with paused_gc(), transaction.atomic():
            nodes_lock()
            clusters |= max_runtime_enforce(now, run)
            clusters |= autoscale_apply(now)
            nominated = nominations_apply()
            clusters |= nominated.clusters
            read = adapters.read_snapshot()
            engine_started = time.perf_counter()
            clusters |= quarantine(read)
            run.quarantined = len(read.unrunnable)
            engine_version_check(run)
            result = schedule(read.snapshot, _config(read), now.timestamp())
            KEPT.version = run.pk
            run.engine_ms = (time.perf_counter() - engine_started) * 1000
            result = gpu_range.as_rows(read.workloads, result)  # a GPU range: one pod
            clusters |= decisions_apply(read, result, run)
            run.admitted += nominated.admitted
            sweeps_update()
            run.duration_ms = (time.perf_counter() - started) * 1000
            run.state = CycleState.OK
            run.save()
            transaction.on_commit(lambda: reconcile_later(clusters))
    except Exception as exc:
        # The cycle must leave a record even when it fails, for the admin page.
        logger.exception("scheduling cycle failed")
        # The transaction rolled back: the counters it set describe nothing that happened,
        # and the rows kept in this process may hold what it changed in memory.
        KEPT_ROWS.forget()
        KEPT_NODES.forget()
        run = CycleRun.objects.get(pk=run.pk)
        run.ok = False
        run.state = CycleState.FAILED
        run.error = "".join(traceback.format_exception_only(exc)).strip()
        run.error += "\n" + traceback.format_exc(limit=-6)
        run.duration_ms = (time.perf_counter() - started) * 1000
        run.save()
    return run


class KeptEngine:
    """The engine's state this process keeps between cycles, and the snapshot version it
    was left at: the id of the CycleRun whose snapshot it last scheduled."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.version: int | None = None


KEPT = KeptEngine()


def engine_version_check(run: CycleRun) -> None:
    """Rebuild the kept engine state when the snapshot's version jumped.

    Version: the id of the latest cycle before this one (CycleRun, any state). The kept
    state is diffed against each new snapshot (scheduling.engine.incremental), which is
    exact whatever changed; but when the last cycle was not this process's (another
    worker ran it, or this process has just started and keeps nothing), every decision
    that cycle wrote is news here, and building afresh costs no more than that diff and
    bounds what the diff must explain. Between two cycles of this process only the
    writes of users, reconciliation and inventory have happened: the diff applies them."""
    last = (
        CycleRun.objects.filter(pk__lt=run.pk).order_by("-pk").values_list("pk", flat=True)
    ).first()
    if last is None or last != KEPT.version:
        KEPT.engine.rebuild()


def schedule(snapshot: t.Snapshot, config: t.SchedulerConfig, now: float) -> t.CycleResult:
    """The engine's cycle over the state kept in this process (rebuilt when needed)."""
    return KEPT.engine.schedule(snapshot, config, now)


def nodes_lock(*, nowait: bool = False) -> None:
    """Lock every node row (in primary-key order, so two cycles cannot deadlock) until the
    cycle's transaction ends: an overlapping cycle waits here, then reads what this one
    wrote. SQLite has no row locks; it lets one write transaction at a time. `nowait`:
    raise DatabaseError at once where another transaction holds one."""
    rows = Node.objects.select_for_update(nowait=nowait).order_by("pk")
    list(rows.values_list("pk", flat=True))


def on_gpus_freed(sender: object, **kwargs: object) -> dict[int, set[int]]:
    """scheduling.signals.gpus_freed's receiver (connected in scheduling/apps.py): admit,
    in the releasing transaction, the nominations whose GPUs are free now, under the
    nodes' lock a cycle takes, and answer with the workloads admitted, by the cluster to
    reconcile for them.

    Only where the lock is free at once: a cycle holding it admits them itself at its start
    or, past that, the cycle the release requests does; a reconcile never waits on a cycle,
    and a cycle waits on it for the rest of its transaction only (the capacity check and
    the release's remaining writes)."""
    if not nominations_waiting():
        return {}
    try:
        with transaction.atomic():  # a savepoint: a lock not had leaves the caller's as it was
            nodes_lock(nowait=True)
            nominated = nominations_apply()
            admitted_at_release_count(nominated.by_cycle)
            return nominated.by_cluster
    except DatabaseError:
        logger.info("nominations left to the cycle: another transaction holds the nodes")
        return {}
    except OvercommitRefused:  # the cycle admits what fits, and says why the rest waits
        logger.exception("nominations left to the cycle")
        return {}


def quarantine(read: adapters.SnapshotRead) -> set[int]:
    """Fail each row that cannot be turned into an engine request, saying why, on its
    timeline and in the audit log. Values no column can hold again (NaN, infinity) are
    reset (_reset) so the row saves; the message keeps what was stored. The clusters where
    such a row has pods, to reconcile: they are deleted there, then its GPUs released."""
    clusters: set[int] = set()
    for wl, why in read.unrunnable.values():
        clusters |= set(wl.allocations.values_list("node__cluster_id", flat=True))
        before = {"state": wl.state, "cpu": str(wl.cpu), "gpus": str(wl.gpus), "pods": wl.pods}
        fields = {name: _reset(name) for name in _unsaveable(wl)}
        message = f"Cannot be scheduled: {why}. Submit it again with valid values."
        workload_transition(
            wl,
            WorkloadState.FAILED,
            reason="InvalidRequest",
            message=message,
            pending_reason="",
            **fields,
        )
        audit_log(
            actor=None,
            action="workload.quarantine",
            obj=wl,
            before=before,
            after={"state": wl.state, "reason": "InvalidRequest", "message": message},
            department=wl.project.department,
        )
        logger.warning("workload %s quarantined: %s", wl.pk, why)
    return clusters


def _unsaveable(wl: Workload) -> list[str]:
    """Columns holding a value no column can hold again (NaN, infinity), or a text SQLite
    held (loaded as a stand-in out of the column's range): reset, so the row saves."""
    names = [name for name in adapters.REQUEST_BOUNDS if not adapters.finite(getattr(wl, name))]
    return [*names, *(name for name in unreadable_columns(wl) if not name.endswith("_at"))]


def _reset(name: str) -> Any:
    """What a column no value of which can be saved again holds after quarantine: empty, or
    its default (the database's checks refuse 0 pods)."""
    field = Workload._meta.get_field(name)
    return None if field.null else field.get_default()


def _config(read: adapters.SnapshotRead) -> t.SchedulerConfig:
    placement = {
        name: t.PlacementStrategy(strategy)
        for name, strategy in NodePool.objects.values_list("name", "placement")
    }
    settled = not read.held_elsewhere
    return t.SchedulerConfig(
        placement=placement, reclaim=settled, preempt=settled, consolidate=settled
    )


def reconcile_later(cluster_ids: set[int]) -> None:
    """Tell the clusters app (which listens) to make each cluster match the database."""
    clusters_changed.send(sender=__name__, cluster_ids=sorted(cluster_ids))


def max_runtime_enforce(now: datetime, run: CycleRun) -> set[int]:
    """Stop active workloads that ran past their max runtime; their clusters' ids."""
    clusters: set[int] = set()
    # A sweep's limit is each trial's (they carry it): the sweep itself runs as long as
    # its trials take one after another, so it is never stopped for its own runtime.
    active = Workload.objects.filter(
        state__in=ACTIVE_STATES, max_runtime_s__isnull=False, admitted_at__isnull=False
    ).exclude(kind=WorkloadKind.HPO)
    for wl in active:
        if unreadable_columns(wl):  # a text in its runtime or dates: quarantined instead
            continue
        since = wl.started_at or wl.admitted_at
        if (now - since).total_seconds() < wl.max_runtime_s:
            continue
        # Through the stop service, as any stop: the audit row and the trials of a sweep.
        workload_stop(
            actor=None,
            workload=wl,
            reason="MaxRuntimeExceeded",
            message=f"Stopped after its maximum runtime of {wl.max_runtime_s} s.",
        )
        clusters |= set(wl.allocations.values_list("node__cluster_id", flat=True))
        run.stopped += 1
    return clusters


def decisions_apply(read: adapters.SnapshotRead, result: t.CycleResult, run: CycleRun) -> set[int]:
    """Evictions, then admissions, then pending reasons; the clusters to reconcile."""
    clusters, evicted = evictions_apply(read, result.evictions)
    capacity_check([t.Admission(r.workload_id, r.added) for r in result.resizes if r.added])
    resized, freed = resizes_apply(read, result.resizes, timezone.now())
    clusters |= resized
    blocked = read.held_devices | evicted | freed
    waiting: dict[str, str] = {}
    admissions, held_back = [], []
    for admission in result.admissions:
        why = _blocked_by(read, admission, blocked, result)
        if why:
            waiting[admission.workload_id] = why
            held_back.append(admission)
        else:
            admissions.append(admission)
    clusters |= admissions_apply(read, admissions)
    nominations_save(read.workloads, held_back, run.started_at, run.pk)
    reasons = {**result.pending_reasons, **read.throttled, **waiting}
    reasons_save(read, reasons)
    run.admitted = len(admissions)
    run.workloads = len(read.snapshot.workloads)
    run.nodes = len(read.snapshot.nodes)
    run.evicted = len(result.evictions)
    run.pending = len(reasons)
    run.shares = shares_of(read, result)
    run.pending_order = adapters.pending_order_of(result)
    return clusters


def evictions_apply(
    read: adapters.SnapshotRead, evictions: tuple[t.Eviction, ...]
) -> tuple[set[int], set[tuple[str, int]]]:
    """PREEMPTED transitions, one batch per reason (a few statements per kind, whatever
    the count); the clusters and devices of the evicted pods, from the rows read."""
    clusters: set[int] = set()
    devices: set[tuple[str, int]] = set()
    moves: dict[str, list[tuple[Workload, str, dict[str, Any]]]] = {}
    for eviction in evictions:
        wl = read.workloads[eviction.workload_id]
        allocations = read.placed[eviction.workload_id]
        clusters |= {read.nodes[adapters.engine_node_id(a.node_id)].cluster_id for a in allocations}
        devices |= adapters._devices(allocations)
        moves.setdefault(f"Preempted:{eviction.reason}", []).append(
            (wl, _eviction_message(read, eviction), {})
        )
    for reason, batch in moves.items():
        workloads_transition(batch, WorkloadState.PREEMPTED, reason=reason)
    return clusters, devices


def _eviction_message(read: adapters.SnapshotRead, eviction: t.Eviction) -> str:
    """The real cause in words, naming the work that needed the room and the numbers."""
    beneficiary = read.workloads.get(eviction.beneficiary or "")
    by = project = "another workload"
    if beneficiary is not None:
        project = beneficiary.project.name
        by = f"{project}/{beneficiary.name}"
    detail = eviction.detail or "room"  # every engine path gives one; a bare reason says this
    return EVICTION_TEXT[eviction.reason].format(by=by, project=project, detail=detail) + "."


def _blocked_by(
    read: adapters.SnapshotRead,
    admission: t.Admission,
    blocked: set[tuple[str, int]],
    result: t.CycleResult,
) -> str:
    """Why an admission must wait (GPUs still held by pods going away), or ''."""
    if any(e.workload_id == admission.workload_id for e in result.evictions):
        return "moved by defragmentation; waiting for its pods to stop before it is placed again"
    for pod in admission.pods:
        devices = pod.gpus if pod.shared_gpu is None else (pod.shared_gpu,)
        if any((pod.node_id, index) in blocked for index in devices):
            node = read.nodes[pod.node_id].name
            return f"GPUs chosen on node {node} are being freed by preempted pods; starts soon"
    return ""


class Nominated(NamedTuple):
    clusters: set[int]
    admitted: int
    by_cycle: Counter[int]  # admitted, per CycleRun id of the cycle that nominated them
    by_cluster: dict[int, set[int]]  # the workloads admitted, by cluster of their pods


def admitted_at_release_count(by_cycle: Counter[int]) -> None:
    """Count a reconcile's admissions on the rows of the cycles that decided them
    (CycleRun.admitted_at_release), where the cycles page shows them: that cycle's
    evictions made the room, and its row was written before the room came free."""
    for cycle, count in sorted(by_cycle.items()):
        CycleRun.objects.filter(pk=cycle).update(
            admitted_at_release=F("admitted_at_release") + count
        )


def nominations_apply() -> Nominated:
    """Admit nominated workloads (scheduling/nominations.py) whose GPUs are free now, where
    an earlier cycle placed them, before the snapshot is read: what the engine's own
    replay of that cycle would have running now. One whose GPUs are still taken waits,
    nominated, for a later cycle. Each is stamped admitted at the time of the cycle that
    placed it, as the engine's replay has it started: a later stamp would make this
    cycle judge it as work that has run for no time at all, unlike the replay."""
    due, nodes = nominations_due()
    admissions = capacity_fitting([n.admission for n in due], nodes)
    workloads = {str(n.workload.pk): n.workload for n in due}
    stamps = {str(n.workload.pk): n.at for n in due}
    clusters = admissions_write(nodes, workloads, admissions, stamps)
    cycles = {str(n.workload.pk): n.cycle for n in due}
    by_cycle = Counter(cycles[a.workload_id] for a in admissions if cycles[a.workload_id])
    by_cluster: dict[int, set[int]] = {}
    for admission in admissions:
        for pod in admission.pods:
            by_cluster.setdefault(nodes[pod.node_id].cluster_id, set()).add(
                int(admission.workload_id)
            )
    return Nominated(clusters, len(admissions), by_cycle, by_cluster)


def admissions_apply(read: adapters.SnapshotRead, admissions: list[t.Admission]) -> set[int]:
    return admissions_write(read.nodes, read.workloads, admissions)


def admissions_write(
    nodes: dict[str, Node],
    workloads: dict[str, Workload],
    admissions: list[t.Admission],
    stamps: dict[str, datetime] | None = None,
) -> set[int]:
    """Pod allocations and ADMITTED transitions for all admissions, in a few batched
    statements (a first cycle may admit thousands); a nomination is spent."""
    capacity_check(admissions)
    refused = mig_instances_apply(admissions)
    if refused:
        raise OvercommitRefused(refused)
    PodAllocation.objects.bulk_create(
        (
            PodAllocation(
                workload_id=int(admission.workload_id),
                pod_index=pod.pod,
                node_id=int(pod.node_id),
                gpu_indices=list(pod.gpus),
                shared_gpu_index=pod.shared_gpu,
                gpu_share=pod.share if pod.shared_gpu is not None else None,
                gpu_memory_mib=pod.gpu_memory_mib,
                mig_gpu_index=pod.mig_gpu,
                mig_profile=pod.mig_profile,
                mig_start=pod.mig_start if pod.mig_gpu is not None else None,
            )
            for admission in admissions
            for pod in admission.pods
        ),
        batch_size=500,
    )
    moves = []
    clusters: set[int] = set()
    for admission in admissions:
        placed = [nodes[pod.node_id] for pod in admission.pods]
        names = ", ".join(sorted({node.name for node in placed}))
        pool = placed[0].pool.name if placed else "-"
        fields = {
            "pending_reason": "",
            "cluster_id": placed[0].cluster_id if placed else None,
            "nominated": None,
        }
        if stamps:
            fields["admitted_at"] = stamps[admission.workload_id]
        moves.append(
            (workloads[admission.workload_id], f"Placed in pool {pool} on {names}.", fields)
        )
        clusters |= {node.cluster_id for node in placed}
    if moves:
        workloads_transition(moves, WorkloadState.ADMITTED, reason="Admitted")
    return clusters


def reasons_save(read: adapters.SnapshotRead, reasons: dict[str, str]) -> None:
    """Save what each pending workload waits for; only rows whose reason changed, in
    one statement per thousand rows. The rows kept for the next cycle are told their
    new version (they hold what was written), so it does not read them again; a row
    someone changed since it was read is not written, and is read again."""
    changed: dict[int, Workload] = {}
    for wid, reason in reasons.items():
        wl = read.workloads.get(wid)
        if wl is None or wl.state != WorkloadState.PENDING:
            continue
        text = reason[:1].upper() + reason[1:]
        if wl.pending_reason != text:
            wl.pending_reason = text
            changed[wl.pk] = wl
    written = column_set(
        Workload,
        "pending_reason",
        {pk: wl.pending_reason for pk, wl in changed.items()},
        expected={pk: wl.version for pk, wl in changed.items()},
    )
    for pk, version in written.items():
        changed[pk].version = version
        KEPT_ROWS.written(changed[pk])


def shares_of(read: adapters.SnapshotRead, result: t.CycleResult) -> list[dict[str, Any]]:
    """Per queue, pool and resource: the fair share and allocation this cycle settled on."""
    names = {q.id: q.name for q in read.snapshot.queues}
    keys = sorted(set(result.fair_shares) | set(result.allocations))
    return [
        {
            "queue": queue,
            "name": names.get(queue, queue),
            "pool": pool,
            "resource": str(resource),
            "fair_share": round(result.fair_shares.get((queue, pool, resource), 0.0), 3),
            "allocated": round(result.allocations.get((queue, pool, resource), 0.0), 3),
        }
        for queue, pool, resource in keys
    ]


def capacity_check(admissions: list[t.Admission]) -> None:
    """Refuse (raise OvercommitRefused) admissions that, with the allocations the database
    holds now, would put a GPU in two hands: a whole GPU taken twice or already shared, a
    shared GPU given whole, or shares or memory beyond the GPU's."""
    capacity = Capacity.held(admissions)
    for admission in admissions:
        capacity.take(admission)


def capacity_fitting(
    admissions: list[t.Admission], nodes: dict[str, Node] | None = None
) -> list[t.Admission]:
    """The admissions that fit beside what the database holds and the ones before them,
    each whole or not at all, in one read (capacity_check's rules); also beside what pods
    GPUPool did not bind hold on `nodes` (by engine id, as read), when given: nominations
    were placed by an earlier cycle, before such pods may have come."""
    foreign = {node.pk: node.foreign_gpus for node in (nodes or {}).values()}
    capacity = Capacity.held(admissions, foreign=foreign if nodes is not None else None)
    fitting = []
    for admission in admissions:
        try:
            capacity.take(admission)
        except OvercommitRefused:
            continue
        fitting.append(admission)
    return fitting


def _alloc_devices(alloc: PodAllocation) -> set[int]:
    """The devices an allocation holds, of any kind (whole, shared, MIG, given back)."""
    held = {int(i) for i in [*alloc.gpu_indices, *alloc.releasing_gpu_indices]}
    for index in (alloc.shared_gpu_index, alloc.mig_gpu_index):
        if index is not None:
            held.add(int(index))
    return held


class Capacity:
    """Who holds each GPU of some nodes: whole (by whom) or shared (shares and memory)."""

    def __init__(self, memory: dict[tuple[int, int], int]) -> None:
        self.memory = memory
        self.whole: dict[tuple[int, int], str] = {}
        self.shared: dict[tuple[int, int], list[tuple[float, int]]] = {}
        # With foreign use known: per node, how many of its GPUs not in MIG mode pods GPUPool did
        # not bind leave to it, and the devices its allocations hold there (any kind).
        self.room: dict[int, int] = {}
        self.devices: dict[int, set[int]] = {}
        self.mig: set[tuple[int, int]] = set()

    @classmethod
    def held(
        cls, admissions: list[t.Admission], *, foreign: dict[int, int] | None = None
    ) -> Capacity:
        """The GPUs of the admissions' nodes and the allocations on them, as the database
        holds them now; with `foreign` (Node.foreign_gpus by node id), also how many GPUs
        pods GPUPool did not bind hold there."""
        nodes = {int(pod.node_id) for admission in admissions for pod in admission.pods}
        if not nodes:
            return cls({})
        # The GPU rows of those nodes, locked in a stable order until the cycle commits: a
        # second cycle writing to them waits, then sees these allocations when it re-checks.
        gpus = list(
            Gpu.objects.select_for_update().filter(node_id__in=nodes).order_by("node_id", "index")
        )
        capacity = cls({(gpu.node_id, gpu.index): gpu.memory_mib for gpu in gpus})
        if foreign is not None:
            capacity.room = {node: -foreign.get(node, 0) for node in nodes}
            capacity.mig = {(gpu.node_id, gpu.index) for gpu in gpus if gpu.mig_enabled}
            for gpu in gpus:
                capacity.room[gpu.node_id] += not gpu.mig_enabled
        for alloc in PodAllocation.objects.filter(node_id__in=nodes):
            capacity.devices.setdefault(alloc.node_id, set()).update(_alloc_devices(alloc))
            # What is held already is counted, not judged.
            if alloc.shared_gpu_index is None:
                for index in alloc.gpu_indices:
                    capacity.whole[(alloc.node_id, int(index))] = (
                        f"held by workload {alloc.workload_id}"
                    )
            else:
                share = (float(alloc.gpu_share or 0), alloc.gpu_memory_mib)
                capacity.shared.setdefault((alloc.node_id, alloc.shared_gpu_index), []).append(
                    share
                )
        return capacity

    def take(self, admission: t.Admission) -> None:
        """Count the admission's pods, or raise OvercommitRefused and count none of them."""
        who = f"workload {admission.workload_id}"
        whole: dict[tuple[int, int], str] = {}
        shared: dict[tuple[int, int], list[tuple[float, int]]] = {}
        for pod in admission.pods:
            node = int(pod.node_id)
            if pod.shared_gpu is None:
                for index in pod.gpus:
                    key = (node, int(index))
                    self._check(key, who, None, whole, shared)
                    whole[key] = who
            else:
                key = (node, pod.shared_gpu)
                parts = shared.setdefault(key, list(self.shared.get(key, ())))
                parts.append((float(pod.share), pod.gpu_memory_mib))
                self._check(key, who, parts, whole, shared)
        self._check_room(whole, shared)
        self.whole.update(whole)
        self.shared.update(shared)
        for node, index in [*whole, *shared]:
            self.devices.setdefault(node, set()).add(index)

    def _check_room(
        self, whole: dict[tuple[int, int], str], shared: dict[tuple[int, int], list]
    ) -> None:
        """With foreign use known: the admission's devices, beside what GPUPool holds, fit in what
        pods GPUPool did not bind leave (a nomination made before they came must wait)."""
        for node in {n for n, _ in [*whole, *shared]} & self.room.keys():
            used = self.devices.get(node, set()) | {i for n, i in [*whole, *shared] if n == node}
            used = {i for i in used if (node, i) not in self.mig}
            if len(used) > self.room[node]:
                raise OvercommitRefused(
                    f"node {node}: {len(used)} GPUs for GPUPool, but pods it did not bind "
                    f"leave it {max(self.room[node], 0)}"
                )

    def _check(
        self,
        key: tuple[int, int],
        who: str,
        parts: list[tuple[float, int]] | None,
        whole: dict[tuple[int, int], str],
        shared: dict[tuple[int, int], list[tuple[float, int]]],
    ) -> None:
        if key not in self.memory:
            raise OvercommitRefused(f"GPU {key} does not exist")
        taken = whole.get(key) or self.whole.get(key)
        if taken or (parts is None and (key in self.shared or key in shared)):
            raise OvercommitRefused(
                f"GPU {key}: {who} would take it, but it is {taken or 'shared'}"
            )
        if parts is not None and (
            sum(p for p, _ in parts) > 1 + 1e-9 or sum(m for _, m in parts) > self.memory[key]
        ):
            raise OvercommitRefused(f"GPU {key} would be shared beyond its capacity by {who}")
