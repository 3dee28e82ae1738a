"""Builders shared by the metrics tests: a cluster with nodes and GPUs, workloads, samples."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from clusters.metrics.models import AllocationInterval
from clusters.models import Cluster, Gpu, Node, NodePool
from scheduling.models import PodAllocation, Workload, WorkloadState

T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)


def make_node(
    pool: NodePool, name: str = "node-1", gpus: int = 4, model: str = "A100", cluster=None
) -> Node:
    cluster = (
        cluster or Cluster.objects.get_or_create(name="sim", defaults={"backend": "simulated"})[0]
    )
    node = Node.objects.create(cluster=cluster, name=name, pool=pool)
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, model=model, memory_mib=81920)
    return node


def make_workload(project, user, name: str = "train", **extra: Any) -> Workload:
    fields = {"kind": "training", "gpus": Decimal(1), "state": WorkloadState.RUNNING}
    fields.update(extra)
    return Workload.objects.create(project=project, submitted_by=user, name=name, **fields)


def allocate(
    workload: Workload,
    node: Node,
    gpu_indices: list[int] | None = None,
    *,
    at: dt.datetime,
    pod_index: int = 0,
    shared_gpu_index: int | None = None,
    share: float | None = None,
) -> PodAllocation:
    allocation = PodAllocation.objects.create(
        workload=workload,
        pod_index=pod_index,
        node=node,
        gpu_indices=gpu_indices or [],
        shared_gpu_index=shared_gpu_index,
        gpu_share=Decimal(str(share)) if share is not None else None,
    )
    # created_at is auto_now_add; tests place the admission in time explicitly.
    PodAllocation.objects.filter(pk=allocation.pk).update(created_at=at)
    AllocationInterval.objects.filter(pod_allocation_id=allocation.pk).update(started_at=at)
    allocation.refresh_from_db()
    return allocation


def sample(node: Node, gpu: int, ts: dt.datetime, util: float, **extra: Any) -> dict[str, Any]:
    row = {
        "node_id": node.pk,
        "gpu_index": gpu,
        "ts": ts,
        "util_pct": util,
        "mem_used_mib": 1000,
        "mem_total_mib": 81920,
        "power_w": 250.0,
        "temp_c": 60.0,
    }
    row.update(extra)
    return row


def every(start: dt.datetime, end: dt.datetime, step_s: int = 10) -> list[dt.datetime]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += dt.timedelta(seconds=step_s)
    return out
