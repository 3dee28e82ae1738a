"""Allocation intervals: a lasting record of which pod held which GPUs, and when.

PodAllocation rows are deleted when pods are released, so usage history needs its own
table. Intervals open when a PodAllocation is saved for the first time and close when it
is deleted (signals, exact to the second); `allocations_sync` repairs whatever the signals
missed (bulk writes, a crash between the two), using the allocation's own created_at.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction
from django.utils import timezone

from clusters.metrics.models import AllocationInterval
from clusters.models import Gpu
from scheduling.models import PodAllocation

log = logging.getLogger(__name__)


def _share(allocation: PodAllocation, gpu_memory: int) -> tuple[list[int], float]:
    """The GPU indices a pod holds and the share of each: whole GPUs are 1.0 each."""
    if allocation.gpu_indices:
        return [int(i) for i in allocation.gpu_indices], 1.0
    if allocation.shared_gpu_index is None:
        return [], 0.0
    if allocation.gpu_share is not None:
        share = float(allocation.gpu_share)
    elif allocation.gpu_memory_mib and gpu_memory:
        share = min(1.0, allocation.gpu_memory_mib / gpu_memory)
    else:
        share = 1.0
    return [allocation.shared_gpu_index], share


def _first_gpu(allocation: PodAllocation) -> int | None:
    return allocation.gpu_indices[0] if allocation.gpu_indices else allocation.shared_gpu_index


def interval_for(
    allocation: PodAllocation, gpus: dict[tuple[int, int], Gpu] | None = None
) -> AllocationInterval:
    """An unsaved open interval describing `allocation`; `gpus`: the GPU rows by (node id,
    index) when the caller read them, else one query for its GPU's model."""
    workload = allocation.workload
    first = _first_gpu(allocation)
    if gpus is None:
        gpu = Gpu.objects.filter(node_id=allocation.node_id, index=first).first()
    else:
        gpu = gpus.get((allocation.node_id, first))  # type: ignore[arg-type]
    indices, share = _share(allocation, gpu.memory_mib if gpu else 0)
    return AllocationInterval(
        pod_allocation_id=allocation.pk,
        workload_id=workload.pk,
        pod_index=allocation.pod_index,
        project_id=workload.project_id,
        department_id=workload.project.department_id,
        user_id=workload.submitted_by_id,
        cluster_id=allocation.node.cluster_id,
        node_id=allocation.node_id,
        pool_id=allocation.node.pool_id,
        gpu_model=gpu.model if gpu else "",
        gpu_indices=indices,
        share=share,
        started_at=allocation.created_at or timezone.now(),
    )


def interval_open(allocation: PodAllocation) -> None:
    if not AllocationInterval.objects.filter(pod_allocation_id=allocation.pk).exists():
        interval_for(allocation).save()


def interval_close(pod_allocation_id: int, at: dt.datetime | None = None) -> int:
    return AllocationInterval.objects.filter(
        pod_allocation_id=pod_allocation_id, ended_at__isnull=True
    ).update(ended_at=at or timezone.now())


def allocations_sync(now: dt.datetime | None = None) -> tuple[int, int]:
    """Make open intervals match current PodAllocations; returns (opened, closed)."""
    now = now or timezone.now()
    with transaction.atomic():
        current = PodAllocation.objects.select_related("workload__project", "node")
        by_id = {allocation.pk: allocation for allocation in current}
        known = set(
            AllocationInterval.objects.filter(pod_allocation_id__in=list(by_id)).values_list(
                "pod_allocation_id", flat=True
            )
        )
        missing = [interval_for(a) for pk, a in by_id.items() if pk not in known]
        AllocationInterval.objects.bulk_create(missing)
        closed = (
            AllocationInterval.objects.filter(ended_at__isnull=True)
            .exclude(pod_allocation_id__in=list(by_id))
            .update(ended_at=now)
        )
    return len(missing), closed


def intervals_close(allocation_ids: list[int], at: dt.datetime) -> None:
    """What on_allocation_deleted does for each of these allocations (about to be deleted
    together), in five statements for all: their open intervals closed, and a whole
    closed interval written for each that had none open."""
    rows = AllocationInterval.objects.filter(pod_allocation_id__in=allocation_ids)
    open_ = set(rows.filter(ended_at__isnull=True).values_list("pod_allocation_id", flat=True))
    if open_:
        rows.filter(pod_allocation_id__in=open_, ended_at__isnull=True).update(ended_at=at)
    missing = [pk for pk in allocation_ids if pk not in open_]
    if not missing:
        return
    allocations = list(
        PodAllocation.objects.filter(pk__in=missing).select_related("workload__project", "node")
    )
    gpus = {
        (gpu.node_id, gpu.index): gpu
        for gpu in Gpu.objects.filter(node_id__in={a.node_id for a in allocations})
    }
    intervals = []
    for allocation in allocations:
        interval = interval_for(allocation, gpus)
        interval.ended_at = at
        intervals.append(interval)
    AllocationInterval.objects.bulk_create(intervals)


def on_allocations_releasing(sender: Any, allocation_ids: list[int], at: Any, **_: Any) -> None:
    """scheduling.signals.allocations_releasing's receiver (connected in apps.py)."""
    intervals_close(allocation_ids, at)


def on_allocation_saved(sender: Any, instance: PodAllocation, created: bool, **kwargs: Any) -> None:
    if created and not kwargs.get("raw"):
        interval_open(instance)


def on_allocation_deleted(sender: Any, instance: PodAllocation, **kwargs: Any) -> None:
    """Close the pod's interval; the cycle bulk-creates allocations (no post_save), so a pod
    admitted and released between two syncs gets its whole interval written here."""
    now = timezone.now()
    if interval_close(instance.pk, now):
        return
    try:
        interval = interval_for(instance)
    except ObjectDoesNotExist:  # its workload went first; nothing left to attribute it to
        log.warning("allocation %s released without a workload; usage not recorded", instance.pk)
        return
    interval.ended_at = now
    interval.save()
