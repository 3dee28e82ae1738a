"""Deleting what is older than the retention settings."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from clusters.metrics import conf
from clusters.metrics.models import (
    AllocationInterval,
    GpuProcessSample,
    GpuSample,
    Resolution,
)
from clusters.metrics.rollup import USAGE_TABLES


def metrics_retention(now: dt.datetime | None = None) -> dict[str, int]:
    """Raw samples after RAW_DAYS, minute rows after MINUTE_DAYS, hour rows and closed
    allocation intervals after HOUR_DAYS. Returns rows deleted per kind."""
    now = now or timezone.now()
    raw = now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_RAW_DAYS"))
    minute = now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_MINUTE_DAYS"))
    hour = now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_HOUR_DAYS"))
    deleted = {
        "samples": GpuSample.objects.filter(ts__lt=raw).delete()[0],
        "process_samples": GpuProcessSample.objects.filter(ts__lt=raw).delete()[0],
        "intervals": AllocationInterval.objects.filter(ended_at__lt=hour).delete()[0],
    }
    for resolution, cutoff in ((Resolution.MINUTE, minute), (Resolution.HOUR, hour)):
        for table in USAGE_TABLES:
            name = f"{table._meta.model_name}_{resolution}"
            deleted[name] = table.objects.filter(resolution=resolution, bucket__lt=cutoff).delete()[
                0
            ]
    return deleted
