"""A workload's state machine. Every change of state goes through `workload_transition`,
which checks the move is allowed and records it as an event in the same transaction.

GPU occupancy is the existence of PodAllocation rows, not the state: the cycle creates
them on admission, and reconciliation deletes them (`workload_pods_released`) only once
the cluster confirms the pods are gone, so a GPU is never handed out twice while a
preempted or stopped pod is still shutting down.

    pending -> admitted -> running -> succeeded | failed | stopped
    admitted | running -> preempted -> (pods gone) -> pending, restart_count + 1

A requeued workload keeps its place in its queue: queued_at stays the time it was
submitted, as the engine's own replay (scheduling.engine.apply.apply_result) and the
simulator keep a victim's submit_time. Stamped again when its pods went, each victim went
behind the work it was evicted beside, the next cycle ordered (and placed) the queue
differently from the cycle that evicted, and that cost further evictions with nothing
arriving (issue 25; tests/scheduling/test_settle_portal.py).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.errors import GPUPoolError
from scheduling.models import FINISHED_STATES, Workload, WorkloadEvent, WorkloadState
from scheduling.signals import cycle_request

S = WorkloadState
ALLOWED: dict[str, set[str]] = {
    S.PENDING: {S.ADMITTED, S.STOPPED, S.FAILED},
    S.ADMITTED: {S.RUNNING, S.PREEMPTED, S.STOPPED, S.FAILED, S.SUCCEEDED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.STOPPED, S.PREEMPTED},
    S.PREEMPTED: {S.PENDING, S.STOPPED},
    S.SUCCEEDED: set(),
    S.FAILED: set(),
    S.STOPPED: set(),
}
_TIMESTAMP = {S.ADMITTED: "admitted_at", S.RUNNING: "started_at"}


class IllegalTransition(GPUPoolError):
    pass


def workload_event(
    workload: Workload, *, type: str, reason: str = "", message: str = ""
) -> WorkloadEvent:
    return WorkloadEvent.objects.create(
        workload=workload, type=type, reason=reason, message=message
    )


@transaction.atomic
def workload_transition(
    workload: Workload, to: str, *, reason: str, message: str = "", **fields: Any
) -> Workload:
    """Move a workload to state `to`, stamping the time and writing an event.

    `fields` are saved with it (exit_code, message, pending_reason...).
    """
    if to not in ALLOWED[workload.state]:
        raise IllegalTransition(f"{workload} cannot go from {workload.state} to {to}")
    now = timezone.now()
    workload.state = to
    if to in _TIMESTAMP:
        setattr(workload, _TIMESTAMP[to], now)
    if to in FINISHED_STATES:
        workload.finished_at = now
    for name, value in fields.items():
        setattr(workload, name, value)
    # Only what the move changed: a row holding a value its column cannot take back (one
    # planted out of range on SQLite) can still be stopped or failed.
    changed = {"state", "finished_at", *fields}
    if to in _TIMESTAMP:
        changed.add(_TIMESTAMP[to])
    workload.save(update_fields=sorted(changed))
    workload_event(workload, type=to, reason=reason, message=message)
    return workload


@transaction.atomic
def workloads_transition(
    moves: list[tuple[Workload, str, dict[str, Any]]], to: str, *, reason: str
) -> None:
    """Many workloads into state `to` at once (the cycle's admissions): the same checks
    and events as workload_transition, in one batched UPDATE and one INSERT.

    Each move is (workload, message, fields to save with it).
    """
    now = timezone.now()
    columns = {"state", "finished_at", *(f for _, _, fields in moves for f in fields)}
    if to in _TIMESTAMP:
        columns.add(_TIMESTAMP[to])
    for workload, _, fields in moves:
        if to not in ALLOWED[workload.state]:
            raise IllegalTransition(f"{workload} cannot go from {workload.state} to {to}")
        workload.state = to
        if to in _TIMESTAMP:
            setattr(workload, _TIMESTAMP[to], now)
        if to in FINISHED_STATES:
            workload.finished_at = now
        for name, value in fields.items():
            setattr(workload, name, value)
    workloads = [workload for workload, _, _ in moves]
    Workload.objects.bulk_update(workloads, sorted(columns), batch_size=200)
    WorkloadEvent.objects.bulk_create(
        WorkloadEvent(workload=wl, type=to, reason=reason, message=message)
        for wl, message, _ in moves
    )


def _requeue_message(workload: Workload) -> str:
    """Who stopped its pods, from the event that preempted it: GPUPool's cycle (with its
    cause), or the cluster (a pod deleted outside GPUPool, evicted by the kubelet, lost
    with its node: reconcile's PodLost words)."""
    cause = workload.events.filter(type=S.PREEMPTED).order_by("-created_at", "-id").first()
    if cause is None:
        return "Stopped by GPUPool; requeued."
    said = cause.message.rstrip(".")
    if cause.reason == "PodLost":
        return f"{said}; requeued."
    if not said:
        return f"Stopped by GPUPool ({cause.reason.removeprefix('Preempted:')}); requeued."
    return f"Stopped by GPUPool: {said}; requeued."


@transaction.atomic
def workload_pods_released(workload: Workload, *, message: str = "") -> Workload:
    """The cluster confirms every pod of the workload is gone: free its GPUs.

    A preempted workload goes back to the queue at its place (queued_at unchanged),
    keeping its checkpoint directory, and counts a restart so that it resumes from its
    checkpoint when admitted again.
    """
    workload.allocations.all().delete()
    # GPUs just came free: a waiting workload may start now rather than at the next beat.
    cycle_request()
    if workload.state == S.PREEMPTED:
        workload.restart_count += 1
        resume = (
            f" It will resume from {workload.checkpoint_dir}." if workload.checkpoint_dir else ""
        )
        workload_transition(
            workload,
            S.PENDING,
            reason="Requeued",
            message=(message or _requeue_message(workload)) + resume,
            restart_count=workload.restart_count,
            # The last run is over: its start must not count towards the next run's
            # runtime (max runtime, the list's runtime) while it waits or starts again.
            admitted_at=None,
            started_at=None,
        )
    return workload
