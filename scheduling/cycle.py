"""One scheduling cycle: lock, read the database, ask the engine, write its decisions.

Decisions are applied in one transaction; reconciliation is asked to act on the
affected clusters only once it commits. A GPU is never handed out twice, even for a
moment: an admission that lands on GPUs still held by evicted or stopped pods is held
back (the workload stays pending, saying what it waits for) until reconciliation
confirms those pods are gone; while any pod is still going away, the cycle starts no
new evictions, so it does not evict a second victim for the same beneficiary.
"""

from __future__ import annotations

import logging
import time
import traceback
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters.models import NodePool
from scheduling import adapters
from scheduling.engine import schedule
from scheduling.engine import types as t
from scheduling.lifecycle import workload_transition, workloads_transition
from scheduling.locks import cycle_lock
from scheduling.models import (
    ACTIVE_STATES,
    CycleRun,
    PodAllocation,
    Workload,
    WorkloadKind,
    WorkloadState,
)
from scheduling.sweep_states import sweeps_update

logger = logging.getLogger(__name__)
EVICTION_TEXT = {
    t.EvictionReason.RECLAIM: "to give GPUs back to a project under its deserved quota",
    t.EvictionReason.PREEMPT: "for higher-priority work in the same project",
    t.EvictionReason.CONSOLIDATE: "to move it and free a whole slot (defragmentation)",
    t.EvictionReason.STALE_GANG: "because its gang stayed below its minimum pods too long",
}


def cycle_run(now: datetime | None = None) -> CycleRun | None:
    """Run a cycle if no other is running; None when another worker holds the lock."""
    with cycle_lock() as acquired:
        if not acquired:
            logger.info("scheduling cycle skipped: another one is running")
            return None
        return _run_locked(now or timezone.now())


def _run_locked(now: datetime) -> CycleRun:
    run = CycleRun(started_at=now)
    started = time.perf_counter()
    clusters: set[int] = set()
    try:
        with transaction.atomic():
            clusters |= max_runtime_enforce(now, run)
            read = adapters.read_snapshot()
            engine_started = time.perf_counter()
            result = schedule(read.snapshot, _config(read), now.timestamp())
            run.engine_ms = (time.perf_counter() - engine_started) * 1000
            clusters |= decisions_apply(read, result, run)
            sweeps_update()
            run.duration_ms = (time.perf_counter() - started) * 1000
            run.save()
            transaction.on_commit(lambda: reconcile_later(clusters))
    except Exception as exc:
        # The cycle must leave a record even when it fails, for the admin page.
        logger.exception("scheduling cycle failed")
        run.ok = False
        run.error = "".join(traceback.format_exception_only(exc)).strip()
        run.error += "\n" + traceback.format_exc(limit=-6)
        run.duration_ms = (time.perf_counter() - started) * 1000
        run.pk = None
        run.save()
    return run


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
    """Ask the clusters app to make each cluster match the database (when it can)."""
    # Imported late: clusters.tasks imports the scheduling models and lifecycle.
    from clusters.tasks import reconcile_cluster  # noqa: PLC0415

    for cluster_id in sorted(cluster_ids):
        reconcile_cluster.delay(cluster_id)


def max_runtime_enforce(now: datetime, run: CycleRun) -> set[int]:
    """Stop active workloads that ran past their max runtime; their clusters' ids."""
    # Imported here: services -> tasks -> this module.
    from scheduling.services import workload_stop  # noqa: PLC0415

    clusters: set[int] = set()
    # A sweep's limit is each trial's (they carry it): the sweep itself runs as long as
    # its trials take one after another, so it is never stopped for its own runtime.
    active = Workload.objects.filter(
        state__in=ACTIVE_STATES, max_runtime_s__isnull=False, admitted_at__isnull=False
    ).exclude(kind=WorkloadKind.HPO)
    for wl in active:
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
    blocked = read.held_devices | evicted
    waiting: dict[str, str] = {}
    admissions = []
    for admission in result.admissions:
        why = _blocked_by(read, admission, blocked, result)
        if why:
            waiting[admission.workload_id] = why
        else:
            admissions.append(admission)
    clusters |= admissions_apply(read, admissions)
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
    clusters: set[int] = set()
    devices: set[tuple[str, int]] = set()
    for eviction in evictions:
        wl = read.workloads[eviction.workload_id]
        allocations = list(wl.allocations.all())
        clusters |= {read.nodes[adapters.engine_node_id(a.node_id)].cluster_id for a in allocations}
        devices |= adapters._devices(allocations)
        workload_transition(
            wl,
            WorkloadState.PREEMPTED,
            reason=f"Preempted:{eviction.reason}",
            message=_eviction_message(read, eviction),
        )
    return clusters, devices


def _eviction_message(read: adapters.SnapshotRead, eviction: t.Eviction) -> str:
    text = f"Preempted {EVICTION_TEXT[eviction.reason]}"
    beneficiary = read.workloads.get(eviction.beneficiary or "")
    if beneficiary is not None:
        text += f": room for {beneficiary.project.name}/{beneficiary.name}"
    if eviction.detail:
        text += f" ({eviction.detail})"
    return text + "."


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


def admissions_apply(read: adapters.SnapshotRead, admissions: list[t.Admission]) -> set[int]:
    """Pod allocations and ADMITTED transitions for all admissions, in a few batched
    statements (a first cycle may admit thousands)."""
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
            )
            for admission in admissions
            for pod in admission.pods
        ),
        batch_size=500,
    )
    moves = []
    clusters: set[int] = set()
    for admission in admissions:
        nodes = [read.nodes[pod.node_id] for pod in admission.pods]
        names = ", ".join(sorted({node.name for node in nodes}))
        pool = nodes[0].pool.name if nodes else "-"
        fields = {"pending_reason": "", "cluster_id": nodes[0].cluster_id if nodes else None}
        moves.append(
            (read.workloads[admission.workload_id], f"Placed in pool {pool} on {names}.", fields)
        )
        clusters |= {node.cluster_id for node in nodes}
    if moves:
        workloads_transition(moves, WorkloadState.ADMITTED, reason="Admitted")
    return clusters


def reasons_save(read: adapters.SnapshotRead, reasons: dict[str, str]) -> None:
    """Save what each pending workload waits for; only rows whose reason changed."""
    changed = []
    for wid, reason in reasons.items():
        wl = read.workloads.get(wid)
        if wl is None or wl.state != WorkloadState.PENDING:
            continue
        text = reason[:1].upper() + reason[1:]
        if wl.pending_reason != text:
            wl.pending_reason = text
            changed.append(wl)
    Workload.objects.bulk_update(changed, ["pending_reason"], batch_size=500)


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
