"""Hour roll-up: sums of the minute rows, for whole hours the minute roll-up has finished."""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.db.models import Max, Min, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from clusters.metrics.models import (
    USAGE_SUMS,
    GpuUsage,
    PoolUsage,
    ProjectUsage,
    Resolution,
    RollupMark,
    WorkloadUsage,
)
from clusters.metrics.rollup import HOUR, claim_mark, floor_hour, replace_rows

KEYS: dict[type, tuple[tuple[str, ...], dict]] = {
    WorkloadUsage: (
        (
            "workload_id",
            "project_id",
            "department_id",
            "user_id",
            "pool_id",
            "cluster_id",
            "gpu_model",
        ),
        {name: Sum(name) for name in USAGE_SUMS},
    ),
    ProjectUsage: (
        ("project_id", "department_id", "pool_id"),
        {**{name: Sum(name) for name in USAGE_SUMS}, "quota_s": Sum("quota_s")},
    ),
    PoolUsage: (
        ("pool_id", "cluster_id"),
        {**{name: Sum(name) for name in USAGE_SUMS}, "capacity_s": Sum("capacity_s")},
    ),
    GpuUsage: (
        ("node_id", "gpu_index"),
        {
            "util_sum": Sum("util_sum"),
            "util_max": Max("util_max"),
            "mem_used_sum": Sum("mem_used_sum"),
            "mem_total_mib": Max("mem_total_mib"),
            "samples": Sum("samples"),
        },
    ),
}


def hour_rows(table: type, start: dt.datetime, end: dt.datetime) -> list:
    keys, sums = KEYS[table]
    grouped = (
        table.objects.filter(resolution=Resolution.MINUTE, bucket__gte=start, bucket__lt=end)
        .annotate(hour=TruncHour("bucket", tzinfo=dt.UTC))  # UTC hours, whatever TIME_ZONE
        .values(*keys, "hour")
        .annotate(**{f"sum_{name}": expr for name, expr in sums.items()})
    )
    return [
        table(
            resolution=Resolution.HOUR,
            bucket=row["hour"],
            **{key: row[key] for key in keys},
            **{name: row[f"sum_{name}"] or 0 for name in sums},
        )
        for row in grouped
    ]


def rollup_hours(now: dt.datetime | None = None) -> int:
    """Roll up whole hours whose minutes are final; returns how many hours were done."""
    now = now or timezone.now()
    minute_mark = RollupMark.objects.filter(name="minute").first()
    if minute_mark is None:
        return 0
    limit = floor_hour(minute_mark.done_until)
    oldest = WorkloadUsage.objects.aggregate(t=Min("bucket"))["t"]
    default = floor_hour(min(oldest, limit)) if oldest else limit
    with transaction.atomic():
        mark = claim_mark("hour", default)
        start, end = mark.done_until, limit
        if end <= start:
            return 0
        rows = {table: hour_rows(table, start, end) for table in KEYS}
        replace_rows(Resolution.HOUR, start, end, rows)
        mark.done_until = end
        mark.save(update_fields=["done_until"])
    return int((end - start) / HOUR)
