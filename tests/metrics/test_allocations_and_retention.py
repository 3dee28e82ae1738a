from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusters.metrics.allocations import allocations_sync
from clusters.metrics.models import AllocationInterval, GpuSample, Resolution, WorkloadUsage
from clusters.metrics.retention import metrics_retention
from clusters.metrics.services import samples_ingest
from scheduling.lifecycle import workloads_pods_released
from scheduling.models import PodAllocation
from tests.metrics.helpers import T0, allocate, make_node, make_workload, sample

pytestmark = pytest.mark.django_db


def test_admission_opens_an_interval_and_release_closes_it(org):
    node = make_node(org.pool, model="H100")
    work = make_workload(org.project_a, org.researcher)
    allocation = allocate(work, node, [1, 2], at=T0)

    interval = AllocationInterval.objects.get()
    assert interval.pod_allocation_id == allocation.pk
    assert (interval.workload_id, interval.project_id, interval.department_id) == (
        work.pk, org.project_a.pk, org.dept_a.pk
    )  # fmt: skip
    assert (interval.user_id, interval.pool_id, interval.gpu_model) == (
        org.researcher.pk, org.pool.pk, "H100"
    )  # fmt: skip
    assert (interval.gpu_indices, interval.gpus, interval.ended_at) == ([1, 2], 2.0, None)

    before = timezone.now()
    allocation.delete()
    interval.refresh_from_db()
    assert interval.ended_at >= before


def test_sync_opens_intervals_bulk_writes_missed_at_their_admission_time(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    allocate(work, node, [0], at=T0)
    AllocationInterval.objects.all().delete()  # as if written with bulk_create

    assert allocations_sync(T0 + dt.timedelta(minutes=5)) == (1, 0)
    assert AllocationInterval.objects.get().started_at == T0
    assert allocations_sync(T0 + dt.timedelta(minutes=5)) == (0, 0)


def test_sync_closes_intervals_whose_allocation_vanished_without_a_signal(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    allocate(work, node, [0], at=T0)
    PodAllocation.objects.all()._raw_delete(PodAllocation.objects.db)  # no signals

    assert allocations_sync(T0 + dt.timedelta(minutes=3)) == (0, 1)
    assert AllocationInterval.objects.get().ended_at == T0 + dt.timedelta(minutes=3)


def test_a_memory_share_counts_as_that_fraction_of_the_gpu(org):
    node = make_node(org.pool)  # 81920 MiB GPUs
    work = make_workload(org.project_a, org.researcher, gpu_request="memory")
    allocation = PodAllocation.objects.create(
        workload=work, pod_index=0, node=node, shared_gpu_index=0, gpu_memory_mib=20480
    )
    interval = AllocationInterval.objects.get(pod_allocation_id=allocation.pk)
    assert (interval.gpu_indices, interval.share) == ([0], 0.25)


def test_retention_deletes_only_what_is_older_than_each_setting(settings, org):
    settings.GPUPOOL_METRICS_RAW_DAYS = 7
    settings.GPUPOOL_METRICS_MINUTE_DAYS = 30
    settings.GPUPOOL_METRICS_HOUR_DAYS = 400
    now = T0 + dt.timedelta(days=60)
    node = make_node(org.pool)
    samples_ingest(
        [
            sample(node, 0, now - dt.timedelta(days=8), 1),
            sample(node, 0, now - dt.timedelta(days=6), 1),
        ]
    )
    usage = {"workload_id": 1, "project_id": 1, "department_id": 1}
    for resolution, days in [("minute", 31), ("minute", 29), ("hour", 401), ("hour", 399)]:
        WorkloadUsage.objects.create(
            resolution=resolution, bucket=now - dt.timedelta(days=days), **usage
        )

    deleted = metrics_retention(now)

    assert deleted["samples"] == 1
    assert GpuSample.objects.get().ts == now - dt.timedelta(days=6)
    assert deleted["workloadusage_minute"] == 1
    assert deleted["workloadusage_hour"] == 1
    kept = WorkloadUsage.objects.order_by("resolution").values_list("resolution", flat=True)
    assert list(kept) == [Resolution.HOUR, Resolution.MINUTE]


def test_a_bulk_created_allocation_released_before_any_sync_still_leaves_its_interval(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    PodAllocation.objects.bulk_create(
        [PodAllocation(workload=work, pod_index=0, node=node, gpu_indices=[0, 1])]
    )
    assert not AllocationInterval.objects.exists()  # bulk_create sends no post_save

    PodAllocation.objects.filter(workload=work).delete()

    interval = AllocationInterval.objects.get()
    assert (interval.workload_id, interval.gpus) == (work.pk, 2.0)
    assert interval.started_at <= interval.ended_at


def _interval_rows(workloads) -> list[tuple]:
    """Each interval of these workloads as the reports read it (ids and times left out)."""
    rows = AllocationInterval.objects.filter(workload_id__in=[w.pk for w in workloads])
    return sorted(
        (
            [w.pk for w in workloads].index(row.workload_id),
            row.pod_index,
            row.project_id,
            row.department_id,
            row.user_id,
            row.node_id,
            row.pool_id,
            row.gpu_model,
            row.gpu_indices,
            row.share,
            row.started_at is not None,
            row.ended_at is not None and row.ended_at >= row.started_at,
        )
        for row in rows
    )


def test_workloads_released_together_leave_the_intervals_one_release_at_a_time_leaves(org):
    """workloads_pods_released closes every interval in a few statements, not through a
    post_delete per allocation: an interval left open, one never opened (bulk-created
    allocation, memory share), and one closed already (a new, whole one is written)."""
    node = make_node(org.pool, model="H100")

    def make_set(tag: str) -> list:
        opened, bulk, shared = (
            make_workload(org.project_a, org.researcher, f"{tag}-{n}") for n in range(3)
        )
        allocate(opened, node, [0, 1], at=T0)
        allocate(opened, node, [2], at=T0, pod_index=1)
        PodAllocation.objects.bulk_create(
            [
                PodAllocation(workload=bulk, pod_index=0, node=node, gpu_indices=[3]),
                PodAllocation(
                    workload=shared, pod_index=0, node=node, shared_gpu_index=1,
                    gpu_memory_mib=20480,
                ),
            ]
        )  # fmt: skip
        AllocationInterval.objects.filter(workload_id=opened.pk, pod_index=1).update(ended_at=T0)
        return [opened, bulk, shared]

    one_by_one, together = make_set("one"), make_set("together")
    for allocation in PodAllocation.objects.filter(workload__in=one_by_one):
        allocation.delete()
    workloads_pods_released(together)

    assert not PodAllocation.objects.exists()
    assert not AllocationInterval.objects.filter(ended_at__isnull=True).exists()
    assert _interval_rows(together) == _interval_rows(one_by_one)
    assert len(_interval_rows(together)) == 5  # 2 + the closed one written again + 1 + 1
