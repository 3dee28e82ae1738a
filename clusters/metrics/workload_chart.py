"""A workload's GPUs over its life: utilisation and memory per GPU it held, and the
processes on them now.

Short lives are drawn from raw samples, longer ones from the per-GPU minute or hour
roll-ups (raw samples are deleted after a few days).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.db.models import Max, Q
from django.utils import timezone

from clusters.metrics import conf
from clusters.metrics.models import (
    AllocationInterval,
    GpuProcessSample,
    GpuSample,
    GpuUsage,
    Resolution,
)
from clusters.models import Node
from scheduling.models import Workload

MAX_POINTS = 1500
Series = dict[str, list[tuple[str, float, float]]]


def _condition(intervals: list[AllocationInterval], now: dt.datetime, ts: str) -> Q:
    condition = Q(pk__in=[])
    for iv in intervals:
        window = {f"{ts}__gte": iv.started_at, f"{ts}__lte": iv.ended_at or now}
        condition |= Q(node_id=iv.node_id, gpu_index__in=iv.gpu_indices, **window)
    return condition


def _thin(points: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    step = max(1, len(points) // MAX_POINTS)
    return points[::step]


def workload_series(workload: Workload, now: dt.datetime | None = None) -> Series:
    now = now or timezone.now()
    intervals = list(AllocationInterval.objects.filter(workload_id=workload.pk))
    if not intervals:
        return {}
    start = min(iv.started_at for iv in intervals)
    end = max(iv.ended_at or now for iv in intervals)
    names = dict(
        Node.objects.filter(pk__in={iv.node_id for iv in intervals}).values_list("id", "name")
    )
    raw_kept = start >= now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_RAW_DAYS"))
    series: Series = defaultdict(list)
    if raw_kept and end - start <= dt.timedelta(hours=3):
        rows = GpuSample.objects.filter(_condition(intervals, now, "ts")).order_by("ts")
        for r in rows.values_list("node_id", "gpu_index", "ts", "util_pct", "mem_used_mib"):
            series[f"{names.get(r[0], r[0])}/gpu{r[1]}"].append((r[2].isoformat(), r[3], r[4]))
    else:
        # Minute rows for lives up to a week while they are kept; hour rows otherwise.
        minute_kept = start >= now - dt.timedelta(days=conf.get("GPUPOOL_METRICS_MINUTE_DAYS"))
        short = end - start <= dt.timedelta(days=7)
        resolution = Resolution.MINUTE if minute_kept and short else Resolution.HOUR
        rows = GpuUsage.objects.filter(
            _condition(intervals, now, "bucket"), resolution=resolution, samples__gt=0
        ).order_by("bucket")
        for r in rows.values_list(
            "node_id", "gpu_index", "bucket", "util_sum", "mem_used_sum", "samples"
        ):
            point = (r[2].isoformat(), round(r[3] / r[5], 1), round(r[4] / r[5]))
            series[f"{names.get(r[0], r[0])}/gpu{r[1]}"].append(point)
    return {name: _thin(points) for name, points in series.items()}


def current_processes(
    workload: Workload, now: dt.datetime | None = None, minutes: int = 5
) -> list[dict]:
    """The processes the agent last saw on the GPUs the workload holds now (within the
    last minutes), largest first: its own, and on a shared GPU the others' (shown as
    another workload's, never by name) or unknown ones (not started by GPUPool)."""
    now = now or timezone.now()
    held = list(AllocationInterval.objects.filter(workload_id=workload.pk, ended_at=None))
    if not held:
        return []
    gpus = Q(pk__in=[])
    for iv in held:
        gpus |= Q(node_id=iv.node_id, gpu_index__in=iv.gpu_indices)
    recent = GpuProcessSample.objects.filter(gpus, ts__gte=now - dt.timedelta(minutes=minutes))
    last = {
        (r["node_id"], r["gpu_index"]): r["ts"]
        for r in recent.values("node_id", "gpu_index").annotate(ts=Max("ts"))
    }
    names = dict(Node.objects.filter(pk__in={n for n, _ in last}).values_list("id", "name"))
    found = []
    for row in recent.values("node_id", "gpu_index", "ts", "pid", "used_mib", "workload_id"):
        if last.get((row["node_id"], row["gpu_index"])) != row["ts"]:
            continue
        owner = row["workload_id"]
        found.append({
            "gpu": f"{names.get(row['node_id'], row['node_id'])}/gpu{row['gpu_index']}",
            "pid": row["pid"], "used_mib": row["used_mib"], "ts": row["ts"],
            "whose": "this workload" if owner == workload.pk
            else ("another workload" if owner else "not GPUPool's"),
        })  # fmt: skip
    return sorted(found, key=lambda p: (-p["used_mib"], p["gpu"], p["pid"]))
