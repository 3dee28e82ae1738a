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

from collections import defaultdict
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.errors import GPUPoolError
from portal.versioned import new_version
from scheduling.models import (
    FINISHED_STATES,
    PodAllocation,
    Workload,
    WorkloadEvent,
    WorkloadState,
)
from scheduling.signals import allocations_releasing, cycle_request, gpus_freed

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
    _update_grouped([workload for workload, _, _ in moves], sorted(columns))
    WorkloadEvent.objects.bulk_create(
        WorkloadEvent(workload=wl, type=to, reason=reason, message=message)
        for wl, message, _ in moves
    )


def _update_grouped(workloads: list[Workload], columns: list[str]) -> None:
    """Save `columns` of each workload: one `UPDATE ... WHERE id IN` per distinct set of
    values (a batch's moves mostly write the same ones: the same state, time and reason),
    with one new version per statement. bulk_update's CASE expression per row and column
    costs more Python than the rest of a transition; it stays for a batch whose values
    mostly differ."""
    groups: dict[Any, list[Workload]] = defaultdict(list)
    for workload in workloads:
        values = tuple(getattr(workload, name) for name in columns)
        try:
            hash(values)
            key: Any = values
        except TypeError:  # a JSON value (dict, list): equal values print alike
            key = repr(values)
        groups[key].append(workload)
    if len(groups) > 1 + len(workloads) // 10:
        Workload.objects.bulk_update(workloads, columns, batch_size=200)
        return
    for same in groups.values():
        version = new_version()
        written = {name: getattr(same[0], name) for name in columns}
        Workload.objects.filter(pk__in=[w.pk for w in same]).update(**written, version=version)
        for workload in same:
            workload.version = version


def workload_pods_released(workload: Workload, *, message: str = "") -> Workload:
    """The cluster confirms every pod of the workload is gone: free its GPUs
    (`workloads_pods_released` of one)."""
    workloads_pods_released([workload], message=message)
    return workload


@transaction.atomic
def workloads_pods_released(workloads: list[Workload], *, message: str = "") -> None:
    """The cluster confirms every pod of these workloads is gone: free their GPUs, in a
    few statements for all of them (a reconcile releases a cycle's victims together).

    A preempted workload goes back to the queue at its place (queued_at unchanged),
    keeping its checkpoint directory, and counts a restart so that it resumes from its
    checkpoint when admitted again.
    """
    if not workloads:
        return
    gone = PodAllocation.objects.filter(workload_id__in=[w.pk for w in workloads])
    ids = list(gone.values_list("pk", flat=True))
    if ids:
        # In place of a post_delete per row (and Django's delete collector, which loads
        # every row first): nothing references an allocation, and the receivers of
        # allocations_releasing record what they keep of them before the rows go.
        allocations_releasing.send(sender=PodAllocation, allocation_ids=ids, at=timezone.now())
        gone._raw_delete(gone.db)
    # GPUs just came free: a waiting workload may start now rather than at the next beat.
    cycle_request()
    preempted = [workload for workload in workloads if workload.state == S.PREEMPTED]
    causes = _stopped_by(preempted) if not message else {}
    requeued = [
        (
            workload,
            _requeue_message(workload, message or causes[workload.pk]),
            _requeue_fields(workload),
        )
        for workload in preempted
    ]
    if requeued:
        workloads_transition(requeued, S.PENDING, reason="Requeued")


def nominated_admit() -> dict[int, set[int]]:
    """Once a reconcile has released GPUs, admit in its transaction the workloads an
    earlier cycle placed on them (scheduling/nominations.py), as the next cycle would
    first thing: the work a reclaim was for starts at this reconcile, not one cycle later.
    The workloads admitted, by the cluster they were admitted on, to reconcile (their pods
    to make)."""
    clusters: dict[int, set[int]] = {}
    for _, admitted in gpus_freed.send(sender=__name__):
        for cluster, workloads in (admitted or {}).items():
            clusters.setdefault(cluster, set()).update(workloads)
    return clusters


def _requeue_message(workload: Workload, message: str) -> str:
    resume = f" It will resume from {workload.checkpoint_dir}." if workload.checkpoint_dir else ""
    return message + resume


def _stopped_by(workloads: list[Workload]) -> dict[int, str]:
    """Who stopped each one's pods, from the event that preempted it (one statement for
    the batch): GPUPool's cycle (with its cause), or the cluster (a pod deleted outside
    GPUPool, evicted by the kubelet, lost with its node: reconcile's PodLost words)."""
    said: dict[int, str] = {w.pk: "Stopped by GPUPool; requeued." for w in workloads}
    events = WorkloadEvent.objects.filter(workload_id__in=list(said), type=S.PREEMPTED).order_by(
        "workload_id", "-created_at", "-id"
    )
    seen: set[int] = set()
    for cause in events:
        if cause.workload_id in seen:
            continue
        seen.add(cause.workload_id)
        text = cause.message.rstrip(".")
        if cause.reason == "PodLost":
            said[cause.workload_id] = f"{text}; requeued."
        elif not text:
            why = cause.reason.removeprefix("Preempted:")
            said[cause.workload_id] = f"Stopped by GPUPool ({why}); requeued."
        else:
            said[cause.workload_id] = f"Stopped by GPUPool: {text}; requeued."
    return said


def _requeue_fields(workload: Workload) -> dict[str, Any]:
    return {
        "restart_count": workload.restart_count + 1,
        # The last run is over: its start must not count towards the next run's runtime
        # (max runtime, the list's runtime) while it waits or starts again.
        "admitted_at": None,
        "started_at": None,
    }
