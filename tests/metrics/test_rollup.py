"""Roll-ups on hand-made data: every expected number is worked out in the comments."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import Sum

from clusters.metrics.allocations import allocations_sync
from clusters.metrics.hourly import rollup_hours
from clusters.metrics.models import (
    AllocationInterval,
    GpuUsage,
    PoolUsage,
    ProjectUsage,
    QuotaRecord,
    Resolution,
    RollupMark,
    WorkloadUsage,
)
from clusters.metrics.rollup import rollup_minutes
from clusters.metrics.selectors import usage_series
from clusters.metrics.services import samples_ingest
from portal.models import ProjectQuota
from tests.metrics.helpers import T0, allocate, every, make_node, make_workload, sample

pytestmark = pytest.mark.django_db
MIN = dt.timedelta(minutes=1)
UTILS = {0: 100.0, 1: 50.0, 2: 0.0, 3: 40.0}  # per GPU, constant over the ten minutes


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.GPUPOOL_METRICS_RAW_DAYS = 100_000  # hand-made data lives in the past
    settings.GPUPOOL_METRICS_ROLLUP_LAG_S = 60
    settings.GPUPOOL_METRICS_IDLE_PCT = 1.0
    settings.GPUPOOL_METRICS_IDLE_MINUTES = 5


@pytest.fixture
def scene(org):
    """Ten minutes on a 4-GPU node, samples every 10 s:
    - `big` (ml-detect, quota 2) holds GPUs 0, 1, 2 the whole time: 100 %, 50 %, 0 %.
    - `small` (ml-vision, quota 4) holds half of GPU 3 (40 %) from minute 2:30.
    """
    node = make_node(org.pool)
    big = make_workload(org.project_a2, org.dept_admin, "big")
    small = make_workload(org.project_a, org.researcher, "small", gpus="0.5")
    allocate(big, node, [0, 1, 2], at=T0)
    allocate(small, node, shared_gpu_index=3, share=0.5, at=T0 + 2.5 * MIN)
    allocations_sync(T0)
    AllocationInterval.objects.update(ended_at=T0 + 10 * MIN)
    samples_ingest(
        [
            sample(node, gpu, ts, util)
            for ts in every(T0, T0 + 10 * MIN)
            for gpu, util in UTILS.items()
        ]
    )
    return node, big, small


def totals(table, **filters):
    fields = ("allocated_s", "used_s", "idle_s", "over_quota_s")
    sums = table.objects.filter(**filters).aggregate(**{f: Sum(f) for f in fields})
    return tuple(round(sums[f] or 0, 6) for f in fields)


def test_minute_rollup_sums_allocated_used_idle_and_over_quota_seconds(scene):
    _, big, small = scene
    assert rollup_minutes(now=T0 + 12 * MIN) == 11  # minutes 0..10 are final at 10:12

    # big: 3 GPUs x 600 s = 1800 allocated; used 600 x (1 + 0.5 + 0) = 900; GPU 2 has been
    # at 0 % for five minutes from minute 4 on, so minutes 4..9 are idle: 6 x 60 = 360;
    # ml-detect deserves 2 GPUs, holds 3: 60 s over quota per minute = 600.
    assert totals(WorkloadUsage, workload_id=big.pk) == (1800, 900, 360, 600)
    # small: half a GPU from 2:30 = 0.5 x 450 s = 225; used 40 % of that = 90; never idle,
    # ml-vision deserves 4 GPUs: never over quota.
    assert totals(WorkloadUsage, workload_id=small.pk) == (225, 90, 0, 0)
    assert WorkloadUsage.objects.get(workload_id=small.pk, bucket=T0 + 2 * MIN).allocated_s == 15


def test_project_and_pool_series_add_up_the_workloads(scene, org):
    rollup_minutes(now=T0 + 12 * MIN)

    assert totals(ProjectUsage, project_id=org.project_a2.pk) == (1800, 900, 360, 600)
    assert totals(ProjectUsage, project_id=org.project_a.pk) == (225, 90, 0, 0)
    assert totals(PoolUsage, pool_id=org.pool.pk) == (2025, 990, 360, 600)
    # The deserved quota is recorded per minute the project held GPUs: 2 GPUs x 60 s.
    row = ProjectUsage.objects.get(project_id=org.project_a2.pk, bucket=T0)
    assert row.quota_s == 120
    # Capacity is written for every minute, including those after the work ended.
    assert PoolUsage.objects.filter(pool_id=org.pool.pk).count() == 11
    assert PoolUsage.objects.get(pool_id=org.pool.pk, bucket=T0 + 10 * MIN).capacity_s == 240


def test_utilisation_is_a_ratio_of_sums_not_an_average_of_percentages(scene, org):
    rollup_minutes(now=T0 + 12 * MIN)
    pool = PoolUsage.objects.filter(pool_id=org.pool.pk).aggregate(
        used=Sum("used_s"), allocated=Sum("allocated_s")
    )
    # big runs at 50 %, small at 40 %: the mean of the two would be 45 %, but big held
    # eight times more GPU-seconds, so the pool's utilisation is 990 / 2025 = 48.9 %.
    assert pool["used"] / pool["allocated"] == pytest.approx(0.48889, abs=1e-4)


def test_gpu_series_keep_sums_and_maxima_per_gpu_minute(scene):
    node, _, _ = scene
    rollup_minutes(now=T0 + 12 * MIN)
    row = GpuUsage.objects.get(node_id=node.pk, gpu_index=1, bucket=T0 + 3 * MIN)
    assert (row.samples, row.util_sum, row.util_max) == (6, 300, 50)


def test_hour_rollup_equals_the_sum_of_its_minutes(scene, org):
    _, big, _ = scene
    rollup_minutes(now=T0 + 62 * MIN)  # minutes up to 11:01 are final
    assert rollup_hours() == 1

    hour = WorkloadUsage.objects.get(resolution=Resolution.HOUR, workload_id=big.pk)
    assert (hour.bucket, hour.allocated_s, hour.used_s, hour.idle_s) == (T0, 1800, 900, 360)
    pool_hour = PoolUsage.objects.get(resolution=Resolution.HOUR, pool_id=org.pool.pk)
    assert (pool_hour.capacity_s, pool_hour.allocated_s) == (4 * 3600, 2025)


def test_hours_are_utc_hours_whatever_the_sites_time_zone(scene, settings):
    _, big, _ = scene
    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+5:30: its hours start at half past in UTC
    rollup_minutes(now=T0 + 62 * MIN)
    rollup_hours()
    hours = WorkloadUsage.objects.filter(resolution=Resolution.HOUR, workload_id=big.pk)
    assert [(h.bucket, h.allocated_s) for h in hours] == [(T0, 1800)]


def test_a_projects_series_drops_to_zero_between_its_busy_spells(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    first = allocate(work, node, [0, 1], at=T0)
    allocations_sync(T0)
    AllocationInterval.objects.filter(pod_allocation_id=first.pk).update(ended_at=T0 + 2 * MIN)
    second = allocate(work, node, [0, 1], at=T0 + 5 * MIN, pod_index=1)
    allocations_sync(T0 + 5 * MIN)
    AllocationInterval.objects.filter(pod_allocation_id=second.pk).update(ended_at=T0 + 7 * MIN)
    rollup_minutes(now=T0 + 10 * MIN)  # minutes up to 10:09 are final

    _, rows = usage_series("24h", T0 + 10 * MIN, project_id=org.project_a.pk)
    by_minute = {r["bucket"]: r["allocated"] for r in rows}
    assert [by_minute[T0 + m * MIN] for m in range(9)] == [2, 2, 0, 0, 0, 2, 2, 0, 0]
    assert max(by_minute) == T0 + 8 * MIN  # nothing after the last finished minute
    assert min(by_minute) == T0 + 10 * MIN - dt.timedelta(hours=24)
    assert len(rows) == 24 * 60 - 1


def test_rollup_runs_are_idempotent(scene):
    _, big, _ = scene
    rollup_minutes(now=T0 + 12 * MIN)
    RollupMark.objects.filter(name="minute").update(done_until=T0)
    rollup_minutes(now=T0 + 12 * MIN)
    assert totals(WorkloadUsage, workload_id=big.pk) == (1800, 900, 360, 600)
    assert WorkloadUsage.objects.filter(workload_id=big.pk).count() == 10


def test_late_samples_rewind_the_watermark_and_are_counted(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    allocate(work, node, [0], at=T0)
    allocations_sync(T0)
    rollup_minutes(now=T0 + 5 * MIN)
    assert totals(WorkloadUsage, workload_id=work.pk)[1] == 0  # no samples yet: nothing used

    # The agent was cut off and now sends its buffer: 80 % during minutes 0..3.
    samples_ingest([sample(node, 0, ts, 80.0) for ts in every(T0, T0 + 4 * MIN)])
    assert RollupMark.objects.get(name="minute").done_until == T0
    rollup_minutes(now=T0 + 5 * MIN)
    assert totals(WorkloadUsage, workload_id=work.pk)[:2] == (240, 192)


def test_a_gpu_without_samples_is_neither_used_nor_idle(org):
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    allocate(work, node, [0], at=T0)
    allocations_sync(T0)
    rollup_minutes(now=T0 + 8 * MIN)
    assert totals(WorkloadUsage, workload_id=work.pk) == (420, 0, 0, 0)


def test_over_quota_and_deserved_seconds_use_the_quota_in_force_at_each_minute(scene, org):
    _, big, _ = scene
    # ml-detect's quota was 2 GPUs until 10:05 and 3 from then on.
    QuotaRecord.objects.filter(kind="project", owner_id=org.project_a2.pk).update(
        valid_from=T0 - 60 * MIN
    )
    quota = ProjectQuota.objects.get(project=org.project_a2)
    quota.gpus = 3
    quota.save()
    QuotaRecord.objects.filter(kind="project", owner_id=org.project_a2.pk, gpus=3).update(
        valid_from=T0 + 5 * MIN
    )
    rollup_minutes(now=T0 + 12 * MIN)

    # big holds 3 GPUs: 1 over a quota of 2 for minutes 0..4 (5 x 60 s), none over 3 after.
    assert totals(WorkloadUsage, workload_id=big.pk) == (1800, 900, 360, 300)
    deserved = dict(
        ProjectUsage.objects.filter(project_id=org.project_a2.pk).values_list("bucket", "quota_s")
    )
    assert deserved[T0 + 4 * MIN] == 120 and deserved[T0 + 5 * MIN] == 180
