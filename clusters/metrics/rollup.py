"""Roll raw samples and allocation intervals up into per-workload, project, pool and GPU series.

Every number stored is a sum of GPU-seconds (allocated, used = utilisation x share x
seconds, idle, over quota) so that any grouping adds rows up and divides only at the end:
percentages are never averaged. A minute is final once it is GPUPOOL_METRICS_ROLLUP_LAG_S
old; samples that arrive later rewind the watermark (`rollup_rewind`) and the affected
minutes are computed again. Windows are rewritten whole, so every run is idempotent.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from clusters.metrics import conf
from clusters.metrics.allocations import allocations_sync
from clusters.metrics.models import (
    USAGE_SUMS,
    AllocationInterval,
    GpuSample,
    GpuUsage,
    PoolUsage,
    ProjectUsage,
    QuotaRecord,
    Resolution,
    RollupMark,
    WorkloadUsage,
)
from clusters.metrics.quota_history import QuotaTimeline, quota_history_sync, timeline
from clusters.models import Gpu, NodePool

MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
USAGE_TABLES = (WorkloadUsage, ProjectUsage, PoolUsage, GpuUsage)


def floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def floor_hour(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


@dataclass(slots=True)
class GpuMinute:
    util_sum: float
    samples: int
    util_max: float
    mem_sum: float
    mem_total: int

    @property
    def util(self) -> float:
        """Time-weighted utilisation of the minute, 0..1 (samples are evenly spaced)."""
        return self.util_sum / self.samples / 100.0 if self.samples else 0.0


@dataclass(slots=True)
class Sums:
    allocated_s: float = 0.0
    used_s: float = 0.0
    idle_s: float = 0.0
    over_quota_s: float = 0.0

    def add(self, other: Sums) -> None:
        self.allocated_s += other.allocated_s
        self.used_s += other.used_s
        self.idle_s += other.idle_s
        self.over_quota_s += other.over_quota_s


GpuKey = tuple[int, int, dt.datetime]  # node, gpu index, minute


def gpu_minutes(start: dt.datetime, end: dt.datetime) -> dict[GpuKey, GpuMinute]:
    rows = (
        GpuSample.objects.filter(ts__gte=start, ts__lt=end)
        .annotate(minute=TruncMinute("ts", tzinfo=dt.UTC))
        .values("node_id", "gpu_index", "minute")
        .annotate(
            u=Sum("util_pct"), n=Count("id"), mx=Max("util_pct"),
            mem=Sum("mem_used_mib"), tot=Max("mem_total_mib"),
        )
    )  # fmt: skip
    return {
        (r["node_id"], r["gpu_index"], r["minute"]): GpuMinute(
            r["u"] or 0.0, r["n"], r["mx"] or 0.0, float(r["mem"] or 0), r["tot"] or 0
        )
        for r in rows
    }


def overlaps(
    interval: AllocationInterval, start: dt.datetime, end: dt.datetime
) -> Iterator[tuple[dt.datetime, float]]:
    """(minute, seconds held in that minute) for each minute of [start, end) the pod held."""
    lo = max(start, interval.started_at)
    hi = min(end, interval.ended_at or end)
    minute = floor_minute(lo)
    while minute < hi:
        seconds = (min(hi, minute + MINUTE) - max(lo, minute)).total_seconds()
        if seconds > 0:
            yield minute, seconds
        minute += MINUTE


@dataclass
class Window:
    """One roll-up pass over whole minutes [start, end)."""

    start: dt.datetime
    end: dt.datetime
    stats: dict[GpuKey, GpuMinute] = field(default_factory=dict)
    idle_pct: float = 1.0
    idle_minutes: int = 5

    def is_idle(self, node_id: int, gpu: int, minute: dt.datetime) -> bool:
        """Idle = the GPU reported ~0 % in this minute and each of the minutes before it."""
        for back in range(self.idle_minutes):
            stat = self.stats.get((node_id, gpu, minute - back * MINUTE))
            if stat is None or stat.util_max > self.idle_pct:
                return False
        return True

    def gpu_sums(
        self, interval: AllocationInterval, gpu: int
    ) -> Iterator[tuple[dt.datetime, Sums]]:
        for minute, seconds in overlaps(interval, self.start, self.end):
            held = seconds * interval.share
            stat = self.stats.get((interval.node_id, gpu, minute))
            used = held * stat.util if stat else 0.0
            idle = held if self.is_idle(interval.node_id, gpu, minute) else 0.0
            yield minute, Sums(held, used, idle)


WorkloadKey = tuple[int, int, int, int | None, int | None, int | None, str, dt.datetime]


def workload_sums(window: Window) -> dict[WorkloadKey, Sums]:
    """Sums per (workload, project, department, user, pool, cluster, GPU model, minute)."""
    intervals = AllocationInterval.objects.filter(started_at__lt=window.end).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=window.start)
    )
    out: dict[WorkloadKey, Sums] = defaultdict(Sums)
    for iv in intervals:
        for gpu in iv.gpu_indices:
            for minute, sums in window.gpu_sums(iv, int(gpu)):
                key = (iv.workload_id, iv.project_id, iv.department_id, iv.user_id,
                       iv.pool_id, iv.cluster_id, iv.gpu_model, minute)  # fmt: skip
                out[key].add(sums)
    return out


def apply_over_quota(
    per_workload: dict[WorkloadKey, Sums], quota: QuotaTimeline
) -> dict[tuple, tuple[Sums, float]]:
    """Project sums per (project, department, pool, minute) with over-quota GPU-seconds
    against the quota in force at that minute, shared back to the project's workloads in
    proportion to what each held."""
    projects: dict[tuple, Sums] = defaultdict(Sums)
    for (_, project, dept, _, pool, _, _, minute), sums in per_workload.items():
        projects[(project, dept, pool, minute)].add(sums)
    out = {}
    for key, sums in projects.items():
        project, _, pool, minute = key
        deserved = quota.at((QuotaRecord.PROJECT, project, pool), minute) * MINUTE.total_seconds()
        sums.over_quota_s = max(0.0, sums.allocated_s - deserved)
        out[key] = (sums, deserved)
    for (_, project, dept, _, pool, _, _, minute), sums in per_workload.items():
        total, _ = out[(project, dept, pool, minute)]
        if total.allocated_s > 0:
            sums.over_quota_s = total.over_quota_s * sums.allocated_s / total.allocated_s
    return out


def pool_capacity() -> dict[int | None, tuple[float, int | None]]:
    """GPUs per pool now (history of inventory is not kept) and the pool's cluster."""
    clusters = dict(NodePool.objects.values_list("id", "cluster_id"))
    counts = dict(
        Gpu.objects.values("node__pool_id")
        .annotate(n=Count("id"))
        .values_list("node__pool_id", "n")
    )
    pools = set(clusters) | set(counts)
    return {pool: (float(counts.get(pool, 0)), clusters.get(pool)) for pool in pools}


def minute_rows(window: Window) -> dict[type, list]:
    """Every minute-resolution row of the window, not yet saved."""
    per_workload = workload_sums(window)
    per_project = apply_over_quota(per_workload, timeline(QuotaRecord.PROJECT))
    pools: dict[tuple, Sums] = defaultdict(Sums)
    for (_, _, pool, minute), (sums, _) in per_project.items():
        pools[(pool, minute)].add(sums)
    return {
        WorkloadUsage: workload_rows(per_workload),
        ProjectUsage: project_rows(per_project),
        PoolUsage: pool_rows(window, pools),
        GpuUsage: gpu_rows(window),
    }


def _sums_fields(s: Sums) -> dict[str, float]:
    return {name: getattr(s, name) for name in USAGE_SUMS}


def workload_rows(per_workload: dict[WorkloadKey, Sums]) -> list[WorkloadUsage]:
    return [
        WorkloadUsage(
            resolution=Resolution.MINUTE,
            bucket=minute,
            workload_id=wid,
            project_id=project,
            department_id=dept,
            user_id=user,
            pool_id=pool,
            cluster_id=cluster,
            gpu_model=model,
            **_sums_fields(s),
        )
        for (wid, project, dept, user, pool, cluster, model, minute), s in per_workload.items()
    ]


def project_rows(per_project: dict[tuple, tuple[Sums, float]]) -> list[ProjectUsage]:
    return [
        ProjectUsage(
            resolution=Resolution.MINUTE,
            bucket=minute,
            project_id=project,
            department_id=dept,
            pool_id=pool,
            quota_s=deserved,
            **_sums_fields(s),
        )
        for (project, dept, pool, minute), (s, deserved) in per_project.items()
    ]


def gpu_rows(window: Window) -> list[GpuUsage]:
    return [
        GpuUsage(
            resolution=Resolution.MINUTE,
            bucket=minute,
            node_id=node,
            gpu_index=gpu,
            util_sum=st.util_sum,
            util_max=st.util_max,
            mem_used_sum=st.mem_sum,
            mem_total_mib=st.mem_total,
            samples=st.samples,
        )
        for (node, gpu, minute), st in window.stats.items()
        if window.start <= minute < window.end
    ]


def pool_rows(window: Window, pools: dict[tuple, Sums]) -> list[PoolUsage]:
    """A row for every pool and minute, so capacity is charted even when nothing runs."""
    rows = []
    for pool, (gpus, cluster) in pool_capacity().items():
        minute = window.start
        while minute < window.end:
            s = pools.get((pool, minute), Sums())
            rows.append(PoolUsage(
                resolution=Resolution.MINUTE, bucket=minute, pool_id=pool, cluster_id=cluster,
                capacity_s=gpus * 60, allocated_s=s.allocated_s, used_s=s.used_s,
                idle_s=s.idle_s, over_quota_s=s.over_quota_s,
            ))  # fmt: skip
            minute += MINUTE
    return rows


def replace_rows(resolution: str, start: dt.datetime, end: dt.datetime, rows: dict) -> None:
    for table in USAGE_TABLES:
        table.objects.filter(resolution=resolution, bucket__gte=start, bucket__lt=end).delete()
        table.objects.bulk_create(rows.get(table, []), batch_size=2000)


def claim_mark(name: str, default: dt.datetime) -> RollupMark:
    """Lock the watermark row: one roll-up of a kind at a time, the next waits and re-reads."""
    RollupMark.objects.get_or_create(name=name, defaults={"done_until": default})
    return RollupMark.objects.select_for_update().get(name=name)


def first_data(now: dt.datetime) -> dt.datetime:
    """Where a fresh installation starts: its oldest sample or interval, within retention."""
    oldest = [
        GpuSample.objects.aggregate(t=Min("ts"))["t"],
        AllocationInterval.objects.aggregate(t=Min("started_at"))["t"],
    ]
    found = [t for t in oldest if t is not None]
    horizon = now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_RAW_DAYS"))
    return floor_minute(max(min(found), horizon)) if found else floor_minute(now)


def rollup_minutes(now: dt.datetime | None = None) -> int:
    """Roll up the next whole minutes that are final; returns how many minutes were done."""
    now = now or timezone.now()
    allocations_sync(now)
    quota_history_sync(now)
    limit = floor_minute(now - dt.timedelta(seconds=conf.get("GPUPOOL_METRICS_ROLLUP_LAG_S")))
    with transaction.atomic():
        mark = claim_mark("minute", first_data(now))
        start = mark.done_until
        end = min(limit, start + conf.get("GPUPOOL_METRICS_ROLLUP_MAX_MINUTES") * MINUTE)
        if end <= start:
            return 0
        idle_minutes = conf.get("GPUPOOL_METRICS_IDLE_MINUTES")
        window = Window(
            start,
            end,
            gpu_minutes(start - (idle_minutes - 1) * MINUTE, end),
            conf.get("GPUPOOL_METRICS_IDLE_PCT"),
            idle_minutes,
        )
        replace_rows(Resolution.MINUTE, start, end, minute_rows(window))
        mark.done_until = end
        mark.save(update_fields=["done_until"])
    return int((end - start) / MINUTE)


def rollup_rewind(oldest: dt.datetime, now: dt.datetime | None = None) -> None:
    """Samples older than the watermark arrived (an agent caught up): redo from there."""
    oldest = max(oldest, conf.raw_horizon(now or timezone.now()))
    for name, floor in (("minute", floor_minute), ("hour", floor_hour)):
        RollupMark.objects.filter(name=name, done_until__gt=floor(oldest)).update(
            done_until=floor(oldest)
        )
