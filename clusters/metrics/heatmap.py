"""The nodes heat map: utilisation of every GPU (rows) over time (columns)."""

from __future__ import annotations

import datetime as dt

from django.db.models import Sum

from clusters.metrics import charts
from clusters.metrics.models import GpuUsage, Resolution
from clusters.models import Gpu

RANGES = {
    "1h": (dt.timedelta(hours=1), Resolution.MINUTE),
    "24h": (dt.timedelta(hours=24), Resolution.MINUTE),
    "7d": (dt.timedelta(days=7), Resolution.HOUR),
}


def range_key(value: str | None) -> str:
    return value if value in RANGES else "1h"


def figure(range_name: str, now: dt.datetime, pool_ids: list[int] | None = None) -> dict:
    span, resolution = RANGES[range_key(range_name)]
    gpus = Gpu.objects.select_related("node__cluster").order_by(
        "node__cluster__name", "node__name", "index"
    )
    if pool_ids:
        gpus = gpus.filter(node__pool_id__in=pool_ids)
    rows = {(g.node_id, g.index): f"{g.node.cluster.name}/{g.node.name}/gpu{g.index}" for g in gpus}
    usage = (
        GpuUsage.objects.filter(resolution=resolution, bucket__gte=now - span)
        .filter(node_id__in={node for node, _ in rows})
        .values("node_id", "gpu_index", "bucket")
        .annotate(u=Sum("util_sum"), n=Sum("samples"))
    )
    buckets = sorted({u["bucket"] for u in usage})
    column = {b: i for i, b in enumerate(buckets)}
    row_of = {key: i for i, key in enumerate(rows)}
    z: list[list[float | None]] = [[None] * len(buckets) for _ in rows]
    for u in usage:
        key = (u["node_id"], u["gpu_index"])
        if key in row_of and u["n"]:
            z[row_of[key]][column[u["bucket"]]] = round(u["u"] / u["n"], 1)
    x = [b.isoformat() for b in buckets]
    return charts.heatmap_figure(x, list(rows.values()), z, f"GPU utilisation, last {range_name}")
