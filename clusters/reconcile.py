"""Reconciliation: make a cluster hold the pods the database says, and read phases back.

Level-triggered and idempotent: each pass compares the whole desired set with the whole
observed set, so a lost message or a crashed worker is repaired by the next pass, and a
second pass with nothing new changes nothing.

Two kinds of pass (issue 25). A full pass builds every pod's spec and hands the backend
the whole desired set. A targeted pass, on backends that can take part of it
(`Backend.partial_reconcile`), compares instead: one statement reads every allocation's
recorded phase and workload state, the observed pods are matched against it, and only
the workloads that need work (a pod missing, lost, terminating or unwanted, a phase that
moved, a state that stopped, restarted or gave pods back) are loaded and acted on as a
full pass would; the other pods are kept as they are, their specs never built. A pass with
nothing changed thus issues a fixed number of statements, and one after a cycle builds the
specs of the workloads it admitted or evicted only. The full pass stays as the safety net,
at most every `GPUPOOL_RECONCILE_FULL_EVERY_S` per cluster (and first after a cluster was
unreachable): it also repairs what the comparison does not look at (the shared GPUs' MPS
devices, a backend's own objects).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from clusters.backends import (
    Backend,
    BackendUnreachable,
    PodChanges,
    PodPhase,
    PodStatus,
    ReconcileReport,
    get_backend,
    pod_name,
)
from clusters.backends.cgroups import MEMORY_OOM_REASON
from clusters.lost import lost_message, nodes_present
from clusters.mig import mig_sync
from clusters.models import Cluster, Gpu
from clusters.podspecs import pod_specs_for
from clusters.sharing import (
    OOM_LOG_LINES,
    OOM_REASON,
    allocation_mps,
    died_of_gpu_oom,
    oom_message,
)
from portal.versioned import (
    Sums,
    SumsOf,
    bucket_of,
    bucket_sums,
    buckets_moved,
    column_set,
    in_buckets,
    new_version,
    sums_fold,
    sums_keep,
)
from scheduling.lifecycle import (
    nominated_admit,
    workload_transition,
    workloads_pods_released,
    workloads_transition,
)
from scheduling.models import ACTIVE_STATES, PodAllocation, Workload, WorkloadState
from scheduling.policies import termination_grace_periods
from scheduling.signals import clusters_reconcile, cycle_request
from scheduling.stored import addresses_problem

if TYPE_CHECKING:
    from collections.abc import Iterable

    from django.db.models import Model

log = logging.getLogger(__name__)
S = WorkloadState


@dataclass(slots=True)
class PassResult:
    reachable: bool = True
    created: int = 0
    deleted: int = 0
    transitions: list[str] = field(default_factory=list)
    finished: int = 0  # workloads that left ADMITTED/RUNNING in this pass
    released: int = 0
    nominated: int = 0  # admitted here onto GPUs this pass released (pods to make)
    # The workloads this pass acted on (a targeted pass: those that needed work) and those
    # it admitted here: all a second pass at once may find to do (cluster_reconcile).
    acted: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    full: bool = True  # a full pass (every spec built), else a targeted one
    # Rows a targeted pass read to find its work: pods (the backend's) and allocations
    # compared. Driven by changes (`Compared`), they follow what changed, not the cluster.
    pods_read: int = 0
    allocations_read: int = 0


@dataclass(slots=True)
class Compared:
    """What this process's last targeted pass of one cluster compared (issue 25): the sums
    (`portal.versioned.bucket_sums`, by workload id) of exactly the allocation rows it
    read, with their workloads' versions, and the buckets to compare again although none
    of their rows moved (a workload it acted on or left needing work: its pods made or
    going, a state moved). The next pass compares only the buckets whose sums moved, whose
    pods moved (`Backend.pod_changes`) or that are to be compared again: `_needs_work`
    reads nothing else, so a workload outside them needs no work now as it needed none
    then. Taken out while a pass runs and put back only when it ends well: a pass that
    fails, or a full pass, leaves none, and the next one compares every allocation."""

    sums: dict[int, Sums] = field(default_factory=dict)
    again: set[int] = field(default_factory=set)


_compared: dict[int, Compared] = {}  # by cluster id, in this process


def grace_period_s(cluster: Cluster) -> int:
    """The cluster's default time from SIGTERM to SIGKILL; a policy may set its own."""
    default = getattr(settings, "GPUPOOL_POD_GRACE_PERIOD_S", 30)
    return int(cluster.config.get("grace_period_s", default))


def workload_grace_periods(allocations: Iterable[PodAllocation]) -> dict[int, int]:
    """Workload id -> its policy's grace period (project, else department), for the
    workloads whose policy sets one; the rest get the cluster's `grace_period_s`."""
    projects = {a.workload.project_id: a.workload.project for a in allocations}
    by_project = termination_grace_periods(projects.values())
    return {
        a.workload_id: by_project[a.workload.project_id]
        for a in allocations
        if a.workload.project_id in by_project
    }


def full_pass_due(cluster: Cluster) -> bool:
    """Whether this cluster's next pass is the full one: the first in
    `GPUPOOL_RECONCILE_FULL_EVERY_S`, claimed with cache.add (atomic on Redis) so that one
    worker among many makes it."""
    every = settings.GPUPOOL_RECONCILE_FULL_EVERY_S
    return every <= 0 or cache.add(_full_key(cluster), "1", every)


def full_pass_next(cluster: Cluster) -> None:
    """Make this cluster's next pass the full one."""
    cache.delete(_full_key(cluster))


def _full_key(cluster: Cluster) -> str:
    return f"gpupool:reconcile-full:{cluster.pk}"


def cluster_reconcile(
    cluster: Cluster, *, backend: Backend | None = None, full: bool | None = None
) -> PassResult:
    """One pass, and a second at once when the first finished workloads, so that their
    pods are deleted and their GPUs released without waiting for the next beat tick, or
    admitted work onto GPUs it released, so that its pods are made. The second looks at
    those workloads only (`PassResult.acted`), not at every allocation again: anything
    else that changed meanwhile was asked a reconcile of its own by whoever changed it.
    `full`: None lets `full_pass_due` choose."""
    try:
        backend = backend or get_backend(cluster)
    except BackendUnreachable as exc:  # a config no backend can be made of
        cluster_mark_unreachable(cluster, str(exc))
        full_pass_next(cluster)
        return PassResult(reachable=False, errors=[str(exc)])
    full = full_pass_due(cluster) if full is None else full
    result = reconcile_pass(cluster, backend, full=full)
    if not result.reachable:
        full_pass_next(cluster)  # back in reach: a full pass first
    if result.reachable and (result.finished or result.nominated):
        # after a full pass, every workload was acted on: the second reads them all anyway
        only = None if result.full else result.acted
        second = reconcile_pass(cluster, backend, full=False, only=only)
        if second.nominated:  # its own release admitted more here: one more pass, later
            clusters_reconcile([cluster.pk])
        result.created += second.created
        result.deleted += second.deleted
        result.released += second.released
        result.pods_read += second.pods_read
        result.allocations_read += second.allocations_read
        result.transitions += second.transitions
        result.errors += second.errors
    return result


def reconcile_pass(
    cluster: Cluster, backend: Backend, *, full: bool = True, only: set[int] | None = None
) -> PassResult:
    """1. observe the cluster; 2. requeue workloads whose pods vanished (node lost);
    3. create missing pods, delete pods nobody wants; 4. record phases and endpoints;
    5. release workloads whose pods are all gone; 6. move states from the phases seen.
    Not `full` (and the backend can): steps 2-6 for the workloads that need work only,
    and with `only`, only among those workloads (every other pod stays as it is)."""
    full = full or not backend.partial_reconcile
    result = PassResult(full=full)
    compared = _compared.pop(cluster.pk, None)  # back when this pass ends well
    try:
        native_errors = _native_intake(cluster, backend)
        changes = None if full else backend.pod_changes()
        observed = backend.pod_statuses() if changes is None else changes.statuses
        result.pods_read = len(observed) if changes is None else changes.read
        if full:  # every allocation read: what a targeted pass kept is not trusted after
            allocations, subset, compared, changed = _allocations(cluster), {}, None, []
        else:
            changed, kept, compared = _targeted(cluster, observed, changes, compared, only, result)
            allocations = _allocations(cluster, changed)
            subset = {"keep": kept, "observed": observed}
        by_workload = _group(allocations)
        result.acted |= set(by_workload)
        missing = [a for a in allocations if _runs(a.workload) and _gone(a, observed)]
        present = nodes_present(backend, missing)  # outside the transaction: a cluster call
        with transaction.atomic():
            _refresh_states(by_workload)
            _requeue_lost(by_workload, observed, present, result)
        graces = workload_grace_periods(allocations)
        mig_errors = mig_sync(cluster, backend)
        wanted = [a for a in allocations if _runs(a.workload) and not a.releasing]
        unbuilt: dict[str, PodStatus] = {}  # one bad row fails its workload, not the pass
        desired = pod_specs_for(wanted, cluster, graces, unbuilt=unbuilt)
        report = backend.reconcile(
            desired, grace_period_s=grace_period_s(cluster), grace_periods=graces, **subset
        )
    except BackendUnreachable as exc:
        cluster_mark_unreachable(cluster, str(exc))
        result.reachable = False
        result.errors.append(str(exc))
        return result
    report.statuses.update(unbuilt)
    result.created, result.deleted = len(report.created), len(report.deleted)
    result.errors += report.errors + mig_errors + native_errors
    _record_mps_devices(cluster, report)
    _name_gpu_oom(allocations, report, backend)
    # One transaction for what was observed: readers never see half a pass, and on
    # SQLite a thousand transitions cost one commit, not a thousand.
    with transaction.atomic():
        _refresh_states(by_workload)
        # The acted allocations as they are before this pass writes them, locked with their
        # workloads until it commits: what it then reads of them is its own writes alone.
        before = None if compared is None else _stamps_locked(by_workload)
        _record_observed(cluster, allocations, by_workload, report, result)
        # The nodes' MIG errors too (NVML refused a placement): the cluster's error to see.
        cluster_mark_contacted(cluster, "; ".join(report.errors + mig_errors + native_errors))
        if before is not None:
            pods_wanted = subset["keep"] | {spec.name for spec in desired}
            unacted = {bucket_of(w) for w in changed if w not in by_workload}
            _fold_own_writes(compared, before, report, pods_wanted, unacted, only)
    if compared is not None:  # this pass ended well: the next compares from here
        _compared[cluster.pk] = compared
    return result


def _targeted(
    cluster: Cluster,
    observed: dict[str, PodStatus],
    changes: PodChanges | None,
    compared: Compared | None,
    only: set[int] | None,
    result: PassResult,
) -> tuple[list[int], frozenset[str], Compared | None]:
    """A targeted pass's work: the workloads that need it, the pods to keep, and what to
    keep of this comparison for the next pass (`Compared`; None: nothing, and the next pass
    compares every allocation). Where the backend tells which pods changed, only the
    buckets where pods or allocation rows moved are compared; else all of them."""
    if changes is None:  # the pods cannot tell: compare all, keep nothing
        changed, kept, _ = _needing_work(cluster, observed, result, only)
        return changed, kept, None
    if only is not None:  # a second pass among some workloads: the moved pods wait
        changed, kept, _ = _needing_work(cluster, observed, result, only)
        if compared is not None:  # its own work: `_fold_own_writes`
            compared.again |= changes.moved
        return changed, kept, compared
    rows = PodAllocation.objects.filter(node__cluster=cluster)
    buckets = None
    if compared is not None:
        moved = buckets_moved(bucket_sums(rows, "workload_id", _STAMPS[1:]), compared.sums)
        buckets = moved | changes.moved | compared.again
    read = SumsOf()
    changed, kept, again = _needing_work(cluster, observed, result, buckets=buckets, sums=read)
    if compared is None:
        compared = Compared()
        sums_keep(compared.sums, read.of(read.sums))
    else:
        sums_keep(compared.sums, read.of(buckets or ()))
    compared.again = again
    return changed, kept, compared


def _record_observed(
    cluster: Cluster,
    allocations: list[PodAllocation],
    by_workload: dict[int, list[PodAllocation]],
    report: ReconcileReport,
    result: PassResult,
) -> None:
    """Steps 4-6, in the pass's last transaction: phases and endpoints recorded, workloads
    whose pods are all gone released (and what was nominated onto their GPUs admitted),
    states moved."""
    _record_waits(by_workload, report)
    _record_statuses(allocations, report)
    freed = _restarted(by_workload, report)
    _given_back(by_workload, report)
    freed |= _release_finished(by_workload, report, result)
    if freed:
        _nominated_admit(cluster, result)
    _apply_phases(by_workload, report, result)


def _record_waits(by_workload: dict[int, list[PodAllocation]], report: ReconcileReport) -> None:
    """What the pods of each admitted workload wait for where the backend holds them back
    (`ReconcileReport.waiting`: a native sharer waiting for its GPU's MPS daemon, in its
    pod's own words), kept in its `pending_reason` for the pages, the API and the CLI
    (`scheduling.selectors.workload_why`), and cleared once none waits (bound, or its
    workload stopped or preempted: its pods are no longer wanted, nor held back). Written
    only where it changed, one statement per thousand rows; the rows are this transaction's
    (`_refresh_states` locked them). A pending workload's reason is the cycle's."""
    changed: dict[int, tuple[Workload, str]] = {}
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if workload.state == S.PENDING:
            continue
        # Its first pod held back, in that pod's words ("" once none is: bound, or stopped).
        said = (report.waiting.get(_name(a)) for a in allocations)
        text = next((words for words in said if words), "")
        if workload.pending_reason != text:
            changed[workload.pk] = (workload, text)
    if not changed:
        return
    written = column_set(
        Workload,
        "pending_reason",
        {pk: text for pk, (_, text) in changed.items()},
        expected={pk: workload.version for pk, (workload, _) in changed.items()},
    )
    for pk, version in written.items():
        workload, text = changed[pk]
        workload.pending_reason, workload.version = text, version


def _stamps_locked(by_workload: dict[int, list[PodAllocation]]) -> dict[int, tuple]:
    """(workload id, *`_STAMPS`) of these workloads' allocation rows, by primary key, each
    row locked (where the database can; on SQLite the transaction keeps other writers out)."""
    rows = PodAllocation.objects.filter(workload_id__in=list(by_workload))
    locked = rows.select_for_update(of=("self",)).order_by("pk")
    return {row[1]: row for row in locked.values_list("workload_id", *_STAMPS)}


def _fold_own_writes(
    compared: Compared,
    before: dict[int, tuple],
    report: ReconcileReport,
    wanted: frozenset[str] | set[str],
    unacted: set[int],
    only: set[int] | None,
) -> None:
    """Fold what this pass wrote of the allocations it acted on into `compared`, so that the
    next pass does not compare them again: their sums move from `before` (read locked, in
    this transaction) to what they hold now, and their buckets are compared again only
    where a workload still needs work as things stand now (a pod to make, to see go, a
    phase to record) or one was not acted on. Only those rows move the kept sums: anything
    another writer did in their buckets, before or after, still moves the bucket. Rows this
    pass made (a nominated workload's) are not folded: they move their bucket's sums."""
    change = SumsOf()
    for workload_id, *stamps in before.values():
        change.remove(workload_id, *stamps)
    rows = PodAllocation.objects.filter(pk__in=list(before)).values_list(*_INDEX, *_STAMPS)
    by_workload: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        by_workload[row[0]].append(row)
        change.add(row[0], *row[len(_INDEX) :])
    sums_fold(compared.sums, change)
    statuses = report.statuses
    still = {
        bucket_of(workload_id)
        for workload_id, rows in by_workload.items()
        if _needs_work(rows, [statuses.get(pod_name(workload_id, row[1])) for row in rows])
    }
    left = {
        bucket_of(status.workload_id) for name, status in statuses.items() if name not in wanted
    }
    if only is None:  # what this pass compared is all the next needs again
        compared.again = still | left | unacted
    else:  # a pass among some workloads: what it saw move and did not compare stays
        compared.again |= still | left | unacted


def _native_intake(cluster: Cluster, backend: Backend) -> list[str]:
    """Pods made outside GPUPool that name its scheduler become workloads (a backend that
    can list them: Kubernetes), before the pass compares pods (clusters/native.py)."""
    if not hasattr(backend, "native_pods"):
        return []
    from clusters.native import native_sync  # noqa: PLC0415 - Kubernetes clusters only

    return native_sync(cluster, backend)  # type: ignore[arg-type]


def _record_mps_devices(cluster: Cluster, report: ReconcileReport) -> None:
    """Keep each shared GPU's MPS device for the node agents (the pods endpoint). Never
    cleared: whether a daemon runs follows the GPU's allocations, not this field."""
    if not report.mps_devices:
        return
    nodes = {node for node, _ in report.mps_devices}
    changed = []
    for gpu in Gpu.objects.filter(node__cluster=cluster, node__name__in=nodes).select_related(
        "node"
    ):
        device = report.mps_devices.get((gpu.node.name, gpu.index))
        if device is not None and device != gpu.mps_device:
            gpu.mps_device = device
            changed.append(gpu)
    if changed:
        Gpu.objects.bulk_update(changed, ["mps_device"])


def _name_gpu_oom(
    allocations: list[PodAllocation], report: ReconcileReport, backend: Backend
) -> None:
    """A sharer that failed of its own CUDA out-of-memory (its log says so: MPS refused it
    past its limit) fails with that as its reason. Read once, as its workload fails."""
    for allocation in allocations:
        status = report.statuses.get(_name(allocation))
        if (
            status is None
            or status.phase != PodPhase.FAILED
            or allocation.shared_gpu_index is None
            or allocation.workload.state not in ACTIVE_STATES
        ):
            continue
        try:
            logs = backend.pod_logs(status.name, status.namespace, tail_lines=OOM_LOG_LINES)
        except Exception as exc:  # any backend's error: the plain failure still stands
            log.warning("logs of failed sharer %s unreadable: %s", status.name, exc)
            continue
        if died_of_gpu_oom(status.exit_code, logs):
            memory = (
                Gpu.objects.filter(node_id=allocation.node_id, index=allocation.shared_gpu_index)
                .values_list("memory_mib", flat=True)
                .first()
            )
            status.reason = OOM_REASON
            status.message = oom_message(allocation_mps(allocation, memory or 0))


_WORKLOAD_RELATED = ("project", "submitted_by", "workspace")


def _allocations(cluster: Cluster, workload_ids: list[int] | None = None) -> list[PodAllocation]:
    """The cluster's allocations, or those of `workload_ids` only."""
    rows = PodAllocation.objects.filter(node__cluster=cluster)
    if workload_ids is not None:
        if not workload_ids:
            return []
        rows = rows.filter(workload_id__in=workload_ids)
    allocations = list(rows.select_related("node").order_by("workload_id", "pod_index"))
    # One Workload instance per workload, so a transition is seen by all of its pods: read
    # once each, not once per pod (a row of 49 fields, six of them JSON). One deleted
    # since the first read took its allocations with it: theirs are left out, as a read
    # made a moment later would have.
    workloads = Workload.objects.select_related(*_WORKLOAD_RELATED).in_bulk(
        sorted({allocation.workload_id for allocation in allocations})
    )
    kept = [a for a in allocations if a.workload_id in workloads]
    for allocation in kept:
        allocation.workload = workloads[allocation.workload_id]
    return kept


def _runs(workload: Workload) -> bool:
    """Whether its pods should run now: active, and not restarting with a new size."""
    return _runs_as(workload.state, workload.restarting)


def _runs_as(state: str, restarting: bool) -> bool:
    return state in ACTIVE_STATES and not restarting


# What the targeted pass reads of every allocation: one statement, no model instances.
_INDEX = (
    "workload_id",
    "pod_index",
    "releasing",
    "phase",
    "endpoint",
    "backend_ref",
    "ports",
    "workload__state",
    "workload__restarting",
)


# What moves a bucket's sums: an allocation added, removed or written, or its workload.
_STAMPS = ("pk", "version", "workload__version")


def _needing_work(
    cluster: Cluster,
    observed: dict[str, PodStatus],
    result: PassResult,
    only: set[int] | None = None,
    *,
    buckets: set[int] | None = None,
    sums: SumsOf | None = None,
) -> tuple[list[int], frozenset[str], set[int]]:
    """The workloads a full pass would act on (create, delete, requeue, release, record or
    move), by comparing every allocation's recorded phase and workload state with the pods
    observed; the names of the pods that stay as they are (the other workloads'); and the
    buckets of what does not (workloads to act on, pods nobody wants). `only`: among these
    workloads alone, every pod of the others staying as it is. `buckets`: among the
    workloads of these buckets alone, every pod outside them staying as it is. `sums`:
    the allocation rows read are added up there."""
    rows_read = PodAllocation.objects.filter(node__cluster=cluster)
    if only is not None:
        rows_read = rows_read.filter(workload_id__in=sorted(only))
    if buckets is not None:
        rows_read = in_buckets(rows_read, "workload_id", buckets)
    by_workload: dict[int, list[tuple]] = defaultdict(list)
    for row in rows_read.values_list(*_INDEX, *_STAMPS):
        by_workload[row[0]].append(row)
        if sums is not None:
            sums.add(row[0], *row[len(_INDEX) :])
    result.allocations_read += sum(map(len, by_workload.values()))
    changed, keep, acting = [], [], []
    for workload_id, rows in by_workload.items():
        names = [pod_name(workload_id, row[1]) for row in rows]
        if _needs_work(rows, [observed.get(name) for name in names]):
            changed.append(workload_id)
            acting += names
        else:
            keep += names
    if only is not None:
        return changed, frozenset(observed.keys() - set(acting)), set()
    if buckets is None and sums is None:  # nothing kept for a next pass (and a pod's
        return changed, frozenset(keep), set()  # workload id may be unknown: Kubernetes)
    again = {bucket_of(workload_id) for workload_id in changed}
    kept = set(keep)
    for name, status in observed.items():
        bucket = bucket_of(status.workload_id)
        if buckets is not None and bucket not in buckets:
            kept.add(name)  # as the pass that compared its bucket left it
        elif name not in kept:
            again.add(bucket)  # a pod nobody wants: deleted, and seen to go
    return changed, frozenset(kept), again


def _needs_work(rows: list[tuple], statuses: list[PodStatus | None]) -> bool:
    """One workload's index rows (`_INDEX`, then `_STAMPS`) and its pods' statuses, in
    the same order."""
    state, restarting = rows[0][7], rows[0][8]
    if not _runs_as(state, restarting):
        return True  # its pods go, or it is released
    for row, status in zip(rows, statuses, strict=True):
        _, _, releasing, phase, endpoint, ref, ports = row[:7]
        if releasing or status is None or status.lost or status.stuck or status.terminating:
            return True  # given back, to create, lost, or going
        if status.incomplete:
            return True  # its Binding or Service to make again
        if _observed_fields(status, endpoint, ports) != (phase, endpoint, ref, ports):
            return True  # a phase, endpoint or port to record
    return _next_state(state, statuses, len(rows)) is not None  # type: ignore[arg-type]


def _restarted(by_workload: dict[int, list[PodAllocation]], report: ReconcileReport) -> bool:
    """An elastic job restarting with a new size: once all its old pods are gone, its
    pods are created again (next pass) with the new rank and world size. Whether GPUs a
    GPU range gave back came free."""
    freed = False
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if workload.restarting and not any(_name(a) in report.statuses for a in allocations):
            workload.restarting = False
            workload.save(update_fields=["restarting"])
            for allocation in allocations:
                freed = freed or bool(allocation.releasing_gpu_indices)
                allocation.backend_ref = allocation.phase = ""
                allocation.releasing_gpu_indices = []  # a GPU range's given-back GPUs: free
            PodAllocation.objects.bulk_update(
                allocations, ["backend_ref", "phase", "releasing_gpu_indices"]
            )
    return freed


def _given_back(by_workload: dict[int, list[PodAllocation]], report: ReconcileReport) -> None:
    """Pods an elastic workload gave back are gone: their GPUs are free now."""
    gone = [
        a
        for allocations in by_workload.values()
        for a in allocations
        if a.releasing and _name(a) not in report.statuses
    ]
    if gone:
        PodAllocation.objects.filter(pk__in=[a.pk for a in gone]).delete()
        for allocations in by_workload.values():
            allocations[:] = [a for a in allocations if a not in gone]
        cycle_request()


def _name(allocation: PodAllocation) -> str:
    return pod_name(allocation.workload_id, allocation.pod_index)


def _group(allocations: Iterable[PodAllocation]) -> dict[int, list[PodAllocation]]:
    groups: dict[int, list[PodAllocation]] = defaultdict(list)
    for allocation in allocations:
        groups[allocation.workload_id].append(allocation)
    return groups


def _refresh_states(by_workload: dict[int, list[PodAllocation]]) -> None:
    """The cycle or a user may have changed a workload while the cluster was being called
    (preempted it, stopped it): act on its state in the database now, locked (where the
    database can) until this transaction ends, never on the copy read at the start."""
    # What the pod specs read of each workload comes along (its submitter, its workspace):
    # not a statement per workload when they are built.
    rows = Workload.objects.select_related(*_WORKLOAD_RELATED).select_for_update(of=("self",))
    fresh = rows.in_bulk(list(by_workload))
    for workload_id, allocations in list(by_workload.items()):
        workload = fresh.get(workload_id)
        if workload is None:  # deleted meanwhile; its pods are orphans the next pass removes
            del by_workload[workload_id]
            continue
        for allocation in allocations:
            allocation.workload = workload


def _requeue_lost(
    by_workload: dict[int, list[PodAllocation]],
    observed: dict[str, PodStatus],
    present: set[str] | None,
    result: PassResult,
) -> None:
    """A pod created before that the cluster no longer lists (deleted by someone, or gone
    with its node), or that its node pushed out (evicted by the kubelet, node lost): preempt
    the workload so that it is requeued, never recreated silently on a node that may be
    gone; the event says who stopped it (`clusters.lost`). `present`: the cluster's nodes."""
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if not _runs(workload):
            continue
        seen = [(a, observed.get(_name(a))) for a in allocations if not a.releasing]
        lost = [(a, status) for a, status in seen if _lost(a, status)]
        if lost:
            message = lost_message(lost, present)
            workload_transition(workload, S.PREEMPTED, reason="PodLost", message=message)
            result.transitions.append(f"{workload.pk}:preempted")
            result.finished += 1


def _gone(allocation: PodAllocation, observed: dict[str, PodStatus]) -> bool:
    """Created before, wanted still, and no longer listed."""
    return (
        bool(allocation.backend_ref)
        and not allocation.releasing
        and (_name(allocation) not in observed)
    )


def _lost(allocation: PodAllocation, status: PodStatus | None) -> bool:
    """Created before (it has a backend_ref) and now gone, pushed out by its node, or
    stuck terminating on a node that does not answer."""
    if status is None:
        return bool(allocation.backend_ref)
    return status.lost or status.stuck


def _record_statuses(allocations: list[PodAllocation], report: ReconcileReport) -> None:
    changed = []
    for allocation in allocations:
        status = report.statuses.get(_name(allocation))
        if status is None:
            continue
        new = _observed_fields(status, allocation.endpoint, allocation.ports)
        if new != (allocation.phase, allocation.endpoint, allocation.backend_ref, allocation.ports):
            allocation.phase, allocation.endpoint, allocation.backend_ref, allocation.ports = new
            changed.append(allocation)
    _update_each(PodAllocation, changed, ["phase", "endpoint", "backend_ref", "ports"])


def _update_each(model: type[Model], rows: list[Model], fields: list[str]) -> None:
    """Save `fields` of each row: one UPDATE by primary key, all sent in one executemany.
    (bulk_update's CASE WHEN expressions cost about 2 ms of Python per pod created, more
    than everything else a pass does for it.)"""
    if not rows:
        return
    meta = model._meta
    if any(field.name == "version" for field in meta.fields):
        # A versioned row (portal/versioned.py) changes its version with every write, or
        # the cycle's kept rows would never see this one change (scheduling/kept_rows.py).
        for row in rows:
            row.version = new_version()
        fields = [*fields, "version"]
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(column.column)} = %s" for column in columns)
    sql = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {quote(meta.pk.column)} = %s"
    params = [
        [c.get_db_prep_save(getattr(row, c.attname), connection) for c in columns] + [row.pk]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _observed_fields(status: PodStatus, endpoint: str, ports: dict) -> tuple:
    """(phase, endpoint, backend_ref, ports) as an allocation records `status`; `endpoint`
    and `ports`: what it holds now, kept where the status tells none (ports another writer
    left misshapen are not: the database's CHECK would refuse the whole pass's write)."""
    phase = "Terminating" if status.terminating else (status.reason or str(status.phase))
    phase = phase[: PodAllocation._meta.get_field("phase").max_length]
    kept = {} if addresses_problem(ports) else ports
    return (phase, status.endpoint or endpoint, status.backend_ref, status.ports or kept)


def _release_finished(
    by_workload: dict[int, list[PodAllocation]], report: ReconcileReport, result: PassResult
) -> bool:
    """Workloads that stopped running and whose pods are all gone give their GPUs back,
    all in one batch (a cycle's victims come here together). Whether any did."""
    released = [
        allocations[0].workload
        for allocations in by_workload.values()
        if allocations[0].workload.state not in ACTIVE_STATES
        # still shutting down: its GPUs stay taken
        and not any(_name(a) in report.statuses for a in allocations)
    ]
    workloads_pods_released(released)  # also asks for a cycle: GPUs came free
    result.released += len(released)
    return bool(released)


def _nominated_admit(cluster: Cluster, result: PassResult) -> None:
    """GPUs came free (pods gone, or a GPU range's given-back GPUs): the work a cycle
    nominated onto them is admitted at once (scheduling.lifecycle.nominated_admit). This
    cluster's pods for it are made by the next pass; other clusters are reconciled."""
    admitted = nominated_admit()
    here = admitted.pop(cluster.pk, set())
    result.nominated += bool(here)
    result.acted |= here
    clusters_reconcile(set(admitted))


def _apply_phases(
    by_workload: dict[int, list[PodAllocation]], report: ReconcileReport, result: PassResult
) -> None:
    """Each workload's next state from its pods' phases; the moves to one state written
    together."""
    moves: dict[str, list[tuple[Workload, dict[str, Any]]]] = defaultdict(list)
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if not _runs(workload):
            continue
        running = [a for a in allocations if not a.releasing]
        statuses = [report.statuses.get(_name(a)) for a in running]
        seen = [s for s in statuses if s is not None]
        state = _next_state(workload.state, seen, len(running))
        if state is not None:
            moves[state].append((workload, _move_of(state, seen)))
    for state, batch in moves.items():
        for reason, same in _by_reason(batch).items():
            workloads_transition(
                [(workload, move.pop("message", ""), move) for workload, move in same],
                state,
                reason=reason,
            )
        for workload, _ in batch:
            result.transitions.append(f"{workload.pk}:{workload.state}")
            if workload.state not in ACTIVE_STATES:
                result.finished += 1


def _by_reason(
    batch: list[tuple[Workload, dict[str, Any]]],
) -> dict[str, list[tuple[Workload, dict[str, Any]]]]:
    groups: dict[str, list[tuple[Workload, dict[str, Any]]]] = defaultdict(list)
    for workload, move in batch:
        groups[move.pop("reason")].append((workload, move))
    return groups


def _next_state(state: str, statuses: list[PodStatus], expected: int) -> str | None:
    """Failed if any pod failed; succeeded when all did; running when all run; None: stays."""
    if any(s.phase == PodPhase.FAILED for s in statuses):
        return S.FAILED
    if not statuses or len(statuses) < expected:
        return None
    if all(s.phase == PodPhase.SUCCEEDED for s in statuses):
        return S.SUCCEEDED
    running = all(s.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) for s in statuses)
    return S.RUNNING if running and state == S.ADMITTED else None


def _move_of(state: str, statuses: list[PodStatus]) -> dict[str, Any]:
    """The reason, message and fields of a move to `state` (`_next_state`'s answer)."""
    if state == S.FAILED:
        first = next(s for s in statuses if s.phase == PodPhase.FAILED)
        message = first.message or f"Pod {first.pod_index} exited with code {first.exit_code}."
        # Out of memory: on its GPU (MPS), or past its cgroup's limit (the local backend).
        reason = first.reason if first.reason in (OOM_REASON, MEMORY_OOM_REASON) else "PodFailed"
        return {"reason": reason, "message": message, "exit_code": first.exit_code}
    if state == S.SUCCEEDED:
        return {"reason": "Completed", "exit_code": 0}
    return {"reason": "Started", "message": "All pods run."}


def cluster_mark_unreachable(cluster: Cluster, error: str) -> None:
    log.warning("cluster %s unreachable: %s", cluster.name, error)
    Cluster.objects.filter(pk=cluster.pk).update(reachable=False, last_error=error[:2000])
    cluster.reachable, cluster.last_error = False, error


def cluster_mark_contacted(cluster: Cluster, error: str = "") -> None:
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(
        reachable=True, last_contact_at=now, last_error=error[:2000]
    )
    cluster.reachable, cluster.last_contact_at, cluster.last_error = True, now, error
