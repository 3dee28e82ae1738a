"""Reads for dashboards: GPUs now, series over time, idle workloads, pending demand.

Series come from the roll-up tables and are sums of GPU-seconds per bucket; dividing by
the bucket's length gives average GPUs, and used / allocated gives utilisation.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Avg, Count, Max, Min, QuerySet, Sum
from django.utils import timezone

from clusters.metrics import conf
from clusters.metrics.models import GpuSample, PoolUsage, ProjectUsage, Resolution, RollupMark
from clusters.models import Cluster, Gpu, Node, NodePool
from portal.models import Project
from scheduling.models import GpuRequestKind, PodAllocation, Workload, WorkloadState

RANGES: dict[str, tuple[dt.timedelta, str]] = {
    "24h": (dt.timedelta(hours=24), Resolution.MINUTE),
    "7d": (dt.timedelta(days=7), Resolution.HOUR),
    "30d": (dt.timedelta(days=30), Resolution.HOUR),
}
BUCKET_S = {Resolution.MINUTE: 60.0, Resolution.HOUR: 3600.0}
LIVE_WINDOW = dt.timedelta(minutes=2)


def range_key(value: str | None) -> str:
    return value if value in RANGES else "24h"


def allocation_gpus(allocation: PodAllocation, gpu_memory: dict[tuple[int, int], int]) -> float:
    """GPUs a pod holds: whole GPUs count 1 each, a shared GPU its share (or memory share)."""
    if allocation.gpu_indices:
        return float(len(allocation.gpu_indices))
    if allocation.shared_gpu_index is None:
        return 0.0
    if allocation.gpu_share is not None:
        return float(allocation.gpu_share)
    total = gpu_memory.get((allocation.node_id, allocation.shared_gpu_index), 0)
    return min(1.0, allocation.gpu_memory_mib / total) if total else 1.0


@dataclass
class PoolNow:
    cluster: str
    pool: str
    pool_id: int | None
    total: int = 0
    allocated: float = 0.0
    # Busy GPU-equivalents (sum of utilisation) on GPUs some pod holds, and on the others:
    # work outside GPUPool or a pod that outlived its allocation shows in the second.
    used: float = 0.0
    used_unallocated: float = 0.0

    @property
    def allocated_pct(self) -> float:
        return 100.0 * self.allocated / self.total if self.total else 0.0

    @property
    def used_pct(self) -> float:
        """Utilisation of the allocated GPUs."""
        return 100.0 * min(self.used, self.allocated) / self.allocated if self.allocated else 0.0


def latest_utilisation(now: dt.datetime) -> dict[tuple[int, int], float]:
    """Each GPU's mean utilisation (0..1) over the last two minutes of samples."""
    rows = (
        samples_between(now - LIVE_WINDOW, now)
        .values("node_id", "gpu_index")
        .annotate(u=Avg("util_pct"))
        .values_list("node_id", "gpu_index", "u")
    )
    return {(node, gpu): (u or 0.0) / 100.0 for node, gpu, u in rows}


def samples_between(since: dt.datetime, until: dt.datetime) -> QuerySet[GpuSample]:
    return GpuSample.objects.filter(ts__gte=since, ts__lte=until)


def held_gpus(allocation: PodAllocation) -> list[int]:
    """The GPU indices a pod holds on its node, whole or shared."""
    if allocation.gpu_indices:
        return [int(index) for index in allocation.gpu_indices]
    return [] if allocation.shared_gpu_index is None else [allocation.shared_gpu_index]


def gpus_now(now: dt.datetime | None = None) -> list[PoolNow]:
    """Per cluster and node pool: GPUs in total, allocated (by PodAllocation) and busy,
    busy split by whether the GPU is allocated."""
    now = now or timezone.now()
    nodes = {
        n["id"]: n for n in Node.objects.values("id", "cluster__name", "pool_id", "pool__name")
    }
    memory: dict[tuple[int, int], int] = {}
    rows: dict[tuple[str, int | None], PoolNow] = {}

    def row(node_id: int) -> PoolNow:
        n = nodes[node_id]
        key = (n["cluster__name"], n["pool_id"])
        if key not in rows:
            rows[key] = PoolNow(n["cluster__name"], n["pool__name"] or "(no pool)", n["pool_id"])
        return rows[key]

    for node_id, index, mem in Gpu.objects.values_list("node_id", "index", "memory_mib"):
        memory[(node_id, index)] = mem
        row(node_id).total += 1
    held: set[tuple[int, int]] = set()
    for allocation in PodAllocation.objects.only(
        "node_id", "gpu_indices", "shared_gpu_index", "gpu_share", "gpu_memory_mib"
    ):
        row(allocation.node_id).allocated += allocation_gpus(allocation, memory)
        held.update((allocation.node_id, index) for index in held_gpus(allocation))
    _add_busy(now, held, nodes, row)
    return sorted(rows.values(), key=lambda r: (r.cluster, r.pool))


def _add_busy(
    now: dt.datetime,
    held: set[tuple[int, int]],
    nodes: Container[int],
    row: Callable[[int], PoolNow],
) -> None:
    """Add each known node's GPUs' recent utilisation to its pool's row, allocated GPUs
    apart from the rest."""
    for (node_id, index), util in latest_utilisation(now).items():
        if node_id not in nodes:
            continue
        if (node_id, index) in held:
            row(node_id).used += util
        else:
            row(node_id).used_unallocated += util


def pool_series(
    range_name: str, now: dt.datetime, pool_ids: list[int] | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """(resolution, rows of bucket, capacity/allocated/used GPUs averaged over the bucket)."""
    span, resolution = RANGES[range_key(range_name)]
    qs = PoolUsage.objects.filter(resolution=resolution, bucket__gte=now - span)
    if pool_ids:
        qs = qs.filter(pool_id__in=pool_ids)
    rows = (
        qs.values("bucket")
        .annotate(c=Sum("capacity_s"), a=Sum("allocated_s"), u=Sum("used_s"), i=Sum("idle_s"))
        .order_by("bucket")
    )
    width = BUCKET_S[resolution]
    return resolution, [
        {"bucket": r["bucket"], "capacity": r["c"] / width, "allocated": r["a"] / width,
         "used": r["u"] / width, "idle": r["i"] / width}
        for r in rows
    ]  # fmt: skip


def usage_series(
    range_name: str, now: dt.datetime, **filters: Any
) -> tuple[str, list[dict[str, Any]]]:
    """A project's or department's allocated, deserved and used GPUs over time."""
    span, resolution = RANGES[range_key(range_name)]
    rows = (
        ProjectUsage.objects.filter(resolution=resolution, bucket__gte=now - span, **filters)
        .values("bucket")
        .annotate(a=Sum("allocated_s"), u=Sum("used_s"), q=Sum("quota_s"), o=Sum("over_quota_s"))
        .order_by("bucket")
    )
    width = BUCKET_S[resolution]
    found = {
        r["bucket"]: {"bucket": r["bucket"], "allocated": r["a"] / width, "used": r["u"] / width,
                      "over_quota": r["o"] / width}
        for r in rows
    }  # fmt: skip
    # Rows exist only for buckets in which the owner held GPUs: every bucket the roll-up
    # has finished gets a point, zero where nothing was held, so a line drops to zero
    # between busy spells instead of being drawn straight across them.
    done = list(RollupMark.objects.filter(name=resolution).values_list("done_until", flat=True))
    end = min(done[0], now) if done else None
    step = dt.timedelta(seconds=width)
    bucket = first_bucket(now - span, resolution)
    while end is not None and bucket < end:
        found.setdefault(bucket, {"bucket": bucket, "allocated": 0.0, "used": 0.0,
                                  "over_quota": 0.0})  # fmt: skip
        bucket += step
    return resolution, [found[b] for b in sorted(found)]


def first_bucket(since: dt.datetime, resolution: str) -> dt.datetime:
    """The first bucket (a UTC minute or hour) that starts at or after `since`."""
    since = since.astimezone(dt.UTC)
    floor = since.replace(second=0, microsecond=0)
    if resolution == Resolution.HOUR:
        floor = floor.replace(minute=0)
    return floor if floor == since else floor + dt.timedelta(seconds=BUCKET_S[resolution])


@dataclass
class IdleWorkload:
    workload: Workload
    idle_gpus: float = 0.0
    gpus: list[str] = field(default_factory=list)


def idle_gpus(now: dt.datetime) -> set[tuple[int, int]]:
    """GPUs whose samples stayed at ~0 % for the whole idle window (5 minutes by default)."""
    window = dt.timedelta(minutes=conf.get("GPUPOOL_METRICS_IDLE_MINUTES"))
    rows = (
        samples_between(now - window, now)
        .values("node_id", "gpu_index")
        .annotate(mx=Max("util_pct"), first=Min("ts"), n=Count("id"))
    )
    slack = dt.timedelta(seconds=60)
    return {
        (r["node_id"], r["gpu_index"])
        for r in rows
        if r["mx"] <= conf.get("GPUPOOL_METRICS_IDLE_PCT") and r["first"] <= now - window + slack
    }


def idle_workloads(
    projects: QuerySet[Project], now: dt.datetime | None = None, pool_ids: list[int] | None = None
) -> list[IdleWorkload]:
    """Workloads in `projects` (on nodes of `pool_ids`, if given) holding idle GPUs."""
    now = now or timezone.now()
    idle = idle_gpus(now)
    if not idle:
        return []
    found: dict[int, IdleWorkload] = {}
    allocations = PodAllocation.objects.filter(
        workload__project__in=projects, node_id__in={node for node, _ in idle}
    ).select_related("workload__project", "node")
    if pool_ids:
        allocations = allocations.filter(node__pool_id__in=pool_ids)
    for a in allocations:
        for index in held_gpus(a):
            if (a.node_id, int(index)) in idle:
                entry = found.setdefault(a.workload_id, IdleWorkload(a.workload))
                entry.idle_gpus += 1.0 if a.gpu_indices else float(a.gpu_share or 1)
                entry.gpus.append(f"{a.node.name}/gpu{index}")
    return sorted(found.values(), key=lambda e: -e.idle_gpus)


PENDING_FIELDS = ("gpu_request", "gpus", "min_gpus", "gpu_memory_mib", "pods", "node_pools")


def pending_gpu_counter() -> Callable[[dict[str, Any]], float]:
    """GPUs a pending workload (a dict with PENDING_FIELDS) asks for. A request for GPU
    memory counts as its share of the largest GPU in the pools it may use (all pools when
    it names none), at most one GPU a pod, as it would once placed there."""
    largest: dict[str | None, int] = defaultdict(int)
    for pool, memory in Gpu.objects.values_list("node__pool__name", "memory_mib"):
        largest[pool] = max(largest[pool], memory)
    anywhere = max(largest.values(), default=0)

    def gpus(w: dict[str, Any]) -> float:
        if w["min_gpus"] is not None:  # a GPU range waits for its minimum, as its reason says
            return float(w["min_gpus"])
        if w["gpu_request"] != GpuRequestKind.MEMORY:
            return float(w["gpus"]) * w["pods"]
        pools = w["node_pools"] or []
        memory = max((largest.get(p, 0) for p in pools), default=0) if pools else anywhere
        return w["pods"] * min(1.0, w["gpu_memory_mib"] / memory) if memory else 0.0

    return gpus


def pending_demand(
    projects: QuerySet[Project], pool_ids: list[int] | None = None
) -> dict[str, Any]:
    """GPUs asked for by pending workloads: in total, per node pool wish, per project.
    With `pool_ids`, only workloads that may run there (they name one, or any pool)."""
    pending = Workload.objects.filter(state=WorkloadState.PENDING).values(
        "project_id", "project__name", *PENDING_FIELDS
    )
    visible = set(projects.values_list("id", flat=True))
    pools = set(NodePool.objects.filter(pk__in=pool_ids or []).values_list("name", flat=True))
    total, per_pool, per_project, count = 0.0, defaultdict(float), defaultdict(float), 0
    count_gpus = pending_gpu_counter()
    for w in pending:
        if pool_ids and w["node_pools"] and not pools.intersection(w["node_pools"]):
            continue
        gpus = count_gpus(w)
        total += gpus
        count += 1
        per_pool[", ".join(w["node_pools"] or []) or "any pool"] += gpus
        if w["project_id"] in visible:
            per_project[w["project__name"]] += gpus
    return {
        "total": total,
        "workloads": count,
        "per_pool": sorted(per_pool.items(), key=lambda kv: -kv[1]),
        "per_project": sorted(per_project.items(), key=lambda kv: -kv[1])[:15],
    }


def pool_choices() -> list[tuple[int, str]]:
    clusters = dict(Cluster.objects.values_list("id", "name"))
    return [
        (p.pk, f"{clusters.get(p.cluster_id, '-')}/{p.name}" if p.cluster_id else p.name)
        for p in NodePool.objects.all()
    ]
