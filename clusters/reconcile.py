"""Reconciliation: make a cluster hold the pods the database says, and read phases back.

Level-triggered and idempotent: each pass compares the whole desired set with the whole
observed set, so a lost message or a crashed worker is repaired by the next pass, and a
second pass with nothing new changes nothing.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters.backends import (
    Backend,
    BackendUnreachable,
    PodPhase,
    PodStatus,
    ReconcileReport,
    get_backend,
    pod_name,
)
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
from scheduling.lifecycle import workload_pods_released, workload_transition
from scheduling.models import ACTIVE_STATES, PodAllocation, Workload, WorkloadState
from scheduling.policies import termination_grace_periods
from scheduling.signals import cycle_request

if TYPE_CHECKING:
    from collections.abc import Iterable

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
    errors: list[str] = field(default_factory=list)


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


def cluster_reconcile(cluster: Cluster, *, backend: Backend | None = None) -> PassResult:
    """One pass, and a second at once when the first finished workloads, so that their
    pods are deleted and their GPUs released without waiting for the next beat tick."""
    backend = backend or get_backend(cluster)
    result = reconcile_pass(cluster, backend)
    if result.reachable and result.finished:
        second = reconcile_pass(cluster, backend)
        result.created += second.created
        result.deleted += second.deleted
        result.released += second.released
        result.transitions += second.transitions
        result.errors += second.errors
    return result


def reconcile_pass(cluster: Cluster, backend: Backend) -> PassResult:
    """1. observe the cluster; 2. requeue workloads whose pods vanished (node lost);
    3. create missing pods, delete pods nobody wants; 4. record phases and endpoints;
    5. release workloads whose pods are all gone; 6. move states from the phases seen."""
    result = PassResult()
    allocations = _allocations(cluster)
    try:
        observed = backend.pod_statuses()
        by_workload = _group(allocations)
        with transaction.atomic():
            _refresh_states(by_workload)
            _requeue_lost(by_workload, observed, result)
        graces = workload_grace_periods(allocations)
        mig_errors = mig_sync(cluster, backend)
        wanted = [a for a in allocations if _runs(a.workload) and not a.releasing]
        desired = pod_specs_for(wanted, cluster, graces)
        report = backend.reconcile(
            desired, grace_period_s=grace_period_s(cluster), grace_periods=graces
        )
    except BackendUnreachable as exc:
        cluster_mark_unreachable(cluster, str(exc))
        result.reachable = False
        result.errors.append(str(exc))
        return result
    result.created, result.deleted = len(report.created), len(report.deleted)
    result.errors += report.errors + mig_errors
    _record_mps_devices(cluster, report)
    _name_gpu_oom(allocations, report, backend)
    # One transaction for what was observed: readers never see half a pass, and on
    # SQLite a thousand transitions cost one commit, not a thousand.
    with transaction.atomic():
        _refresh_states(by_workload)
        _record_statuses(allocations, report)
        _restarted(by_workload, report)
        _given_back(by_workload, report)
        _release_finished(by_workload, report, result)
        _apply_phases(by_workload, report, result)
        # The nodes' MIG errors too (NVML refused a placement): the cluster's error to see.
        cluster_mark_contacted(cluster, "; ".join(report.errors + mig_errors))
    return result


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


def _allocations(cluster: Cluster) -> list[PodAllocation]:
    allocations = list(
        PodAllocation.objects.filter(node__cluster=cluster)
        .select_related(
            "workload", "workload__project", "workload__submitted_by", "workload__workspace", "node"
        )
        .order_by("workload_id", "pod_index")
    )
    # One Workload instance per workload, so a transition is seen by all of its pods.
    shared: dict[int, Workload] = {}
    for allocation in allocations:
        allocation.workload = shared.setdefault(allocation.workload_id, allocation.workload)
    return allocations


def _runs(workload: Workload) -> bool:
    """Whether its pods should run now: active, and not restarting with a new size."""
    return workload.state in ACTIVE_STATES and not workload.restarting


def _restarted(by_workload: dict[int, list[PodAllocation]], report: ReconcileReport) -> None:
    """An elastic job restarting with a new size: once all its old pods are gone, its
    pods are created again (next pass) with the new rank and world size."""
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if workload.restarting and not any(_name(a) in report.statuses for a in allocations):
            workload.restarting = False
            workload.save(update_fields=["restarting"])
            for allocation in allocations:
                allocation.backend_ref = allocation.phase = ""
                allocation.releasing_gpu_indices = []  # a GPU range's given-back GPUs: free
            PodAllocation.objects.bulk_update(
                allocations, ["backend_ref", "phase", "releasing_gpu_indices"]
            )


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
    rows = Workload.objects.select_related("project").select_for_update(of=("self",))
    fresh = rows.in_bulk(list(by_workload))
    for workload_id, allocations in list(by_workload.items()):
        workload = fresh.get(workload_id)
        if workload is None:  # deleted meanwhile; its pods are orphans the next pass removes
            del by_workload[workload_id]
            continue
        for allocation in allocations:
            allocation.workload = workload


def _requeue_lost(
    by_workload: dict[int, list[PodAllocation]], observed: dict[str, PodStatus], result: PassResult
) -> None:
    """A pod created before that the cluster no longer lists, or that its node pushed out
    (evicted, node lost), was lost with its node: preempt the workload so that it is
    requeued, never recreated silently on a node that may be gone."""
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if not _runs(workload):
            continue
        lost = [a for a in allocations if not a.releasing and _lost(a, observed.get(_name(a)))]
        if lost:
            names = ", ".join(sorted({a.node.name for a in lost}))
            workload_transition(
                workload, S.PREEMPTED, reason="PodLost", message=f"Pods lost on {names}."
            )
            result.transitions.append(f"{workload.pk}:preempted")
            result.finished += 1


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
        phase = "Terminating" if status.terminating else (status.reason or str(status.phase))
        phase = phase[: PodAllocation._meta.get_field("phase").max_length]
        ports = status.ports or allocation.ports
        new = (phase, status.endpoint or allocation.endpoint, status.backend_ref, ports)
        if new != (allocation.phase, allocation.endpoint, allocation.backend_ref, allocation.ports):
            allocation.phase, allocation.endpoint, allocation.backend_ref, allocation.ports = new
            changed.append(allocation)
    if changed:
        PodAllocation.objects.bulk_update(changed, ["phase", "endpoint", "backend_ref", "ports"])


def _release_finished(
    by_workload: dict[int, list[PodAllocation]], report: ReconcileReport, result: PassResult
) -> None:
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if workload.state in ACTIVE_STATES:
            continue
        if any(_name(a) in report.statuses for a in allocations):
            continue  # still shutting down: its GPUs stay taken
        workload_pods_released(workload)  # also asks for a cycle: GPUs came free
        result.released += 1


def _apply_phases(
    by_workload: dict[int, list[PodAllocation]], report: ReconcileReport, result: PassResult
) -> None:
    for allocations in by_workload.values():
        workload = allocations[0].workload
        if not _runs(workload):
            continue
        running = [a for a in allocations if not a.releasing]
        statuses = [report.statuses.get(_name(a)) for a in running]
        seen = [s for s in statuses if s is not None]
        if _workload_from_phases(workload, seen, len(running)):
            result.transitions.append(f"{workload.pk}:{workload.state}")
            if workload.state not in ACTIVE_STATES:
                result.finished += 1


def _workload_from_phases(workload: Workload, statuses: list[PodStatus], expected: int) -> bool:
    """Failed if any pod failed; succeeded when all did; running when all run."""
    failed = [s for s in statuses if s.phase == PodPhase.FAILED]
    if failed:
        first = failed[0]
        message = first.message or f"Pod {first.pod_index} exited with code {first.exit_code}."
        reason = OOM_REASON if first.reason == OOM_REASON else "PodFailed"
        workload_transition(
            workload, S.FAILED, reason=reason, message=message, exit_code=first.exit_code
        )
        return True
    if not statuses or len(statuses) < expected:
        return False
    if all(s.phase == PodPhase.SUCCEEDED for s in statuses):
        workload_transition(workload, S.SUCCEEDED, reason="Completed", exit_code=0)
        return True
    running = all(s.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) for s in statuses)
    if running and workload.state == S.ADMITTED:
        workload_transition(workload, S.RUNNING, reason="Started", message="All pods run.")
        return True
    return False


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
