"""Synthetic data for bench_overview: 30 days of roll-ups for many projects, and a live now.

Rows go in with COPY (PostgreSQL), the way a month of real roll-ups would have piled up:
per-workload and per-project hour rows for 30 days, minute rows for the last day, pool
rows at both resolutions, plus running and pending workloads and five minutes of samples.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from decimal import Decimal

from django.db import connection, transaction

from clusters.metrics.ingest import copy_rows
from clusters.metrics.models import PoolUsage, ProjectUsage, WorkloadUsage
from clusters.metrics.rollup import floor_hour, floor_minute
from clusters.metrics.services import samples_ingest
from clusters.models import Cluster, Gpu, Node, NodePool
from portal.models import Department, Project, ProjectQuota, User
from scheduling.models import PodAllocation, Workload, WorkloadState

PREFIX = "bench-ov"
USAGE = ("resolution", "bucket", "allocated_s", "used_s", "idle_s", "over_quota_s")


def build_inventory(pools: int, nodes_per_pool: int, gpus: int) -> list[Node]:
    cluster = Cluster.objects.create(name=f"{PREFIX}-cluster", backend="simulated")
    nodes = []
    for p in range(pools):
        pool = NodePool.objects.create(name=f"{PREFIX}-pool{p}", cluster=cluster)
        nodes += Node.objects.bulk_create(
            [Node(cluster=cluster, name=f"p{p}-n{n:03d}", pool=pool) for n in range(nodes_per_pool)]
        )
    Gpu.objects.bulk_create(
        [Gpu(node=n, index=i, model="A100", memory_mib=81920) for n in nodes for i in range(gpus)]
    )
    return nodes


def build_org(projects: int) -> tuple[User, list[Project]]:
    admin = User.objects.create_user(
        f"{PREFIX}-admin", f"{PREFIX}-admin@example.com", "x", is_platform_admin=True
    )
    departments = [Department.objects.create(name=f"{PREFIX}-dept{d}") for d in range(20)]
    made = Project.objects.bulk_create(
        [
            Project(
                department=departments[i % 20], name=f"{PREFIX}-p{i}", namespace=f"{PREFIX}-p{i}"
            )
            for i in range(projects)
        ]
    )
    pools = list(NodePool.objects.filter(name__startswith=PREFIX))
    ProjectQuota.objects.bulk_create(
        [
            ProjectQuota(project=p, node_pool=pools[i % len(pools)], gpus=2)
            for i, p in enumerate(made)
        ]
    )
    return admin, made


def _buckets(now: dt.datetime, days: int, step: dt.timedelta) -> Iterator[dt.datetime]:
    floor = floor_hour if step >= dt.timedelta(hours=1) else floor_minute
    t = floor(now - dt.timedelta(days=days))
    while t < now:
        yield t
        t += step


def usage_rows(projects: list[Project], pools: list[int], now: dt.datetime, seed: int = 1):
    """(project rows, workload rows) as COPY tuples: 30 days hourly, the last day by minute."""
    rng = random.Random(seed)
    project_rows, workload_rows = [], []
    for resolution, days, step in (("hour", 30, dt.timedelta(hours=1)),
                                   ("minute", 1, dt.timedelta(minutes=1))):  # fmt: skip
        width = step.total_seconds()
        for bucket in _buckets(now, days, step):
            for i, p in enumerate(projects):
                alloc = width * rng.choice((0, 1, 2, 2, 3, 4))
                used, idle = alloc * rng.random(), alloc * rng.random() * 0.2
                over = max(0.0, alloc - 2 * width)
                pool = pools[i % len(pools)]
                project_rows.append((resolution, bucket, alloc, used, idle, over,
                                     p.pk, p.department_id, pool, 2 * width))  # fmt: skip
                sums = (resolution, bucket, alloc, used, idle, over)
                keys = (100_000 + i, p.pk, p.department_id, None, pool, "A100")
                workload_rows.append((*sums, *keys))
    return project_rows, workload_rows


def pool_rows(pools: list[int], gpus_per_pool: int, now: dt.datetime, seed: int = 2):
    rng = random.Random(seed)
    rows = []
    for resolution, days, step in (("hour", 30, dt.timedelta(hours=1)),
                                   ("minute", 1, dt.timedelta(minutes=1))):  # fmt: skip
        width = step.total_seconds()
        for bucket in _buckets(now, days, step):
            for pool in pools:
                cap = gpus_per_pool * width
                alloc = cap * rng.uniform(0.5, 1.0)
                rows.append((resolution, bucket, alloc, alloc * rng.uniform(0.3, 0.9),
                             alloc * 0.05, alloc * 0.1, pool, None, cap))  # fmt: skip
    return rows


def _insert(table: type, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """COPY on PostgreSQL (the benchmark's database); bulk_create elsewhere (its smoke test)."""
    if connection.vendor == "postgresql":
        copy_rows(table._meta.db_table, columns, rows)
        return
    table.objects.bulk_create([table(**dict(zip(columns, r, strict=True))) for r in rows], 2000)


def build_usage(projects: list[Project], nodes: list[Node], gpus: int, now: dt.datetime) -> int:
    pools = sorted({n.pool_id for n in nodes})
    per_pool = gpus * len(nodes) // len(pools)
    project_rows, workload_rows = usage_rows(projects, pools, now)
    project_keys = ("project_id", "department_id", "pool_id", "quota_s")
    workload_keys = (
        "workload_id",
        "project_id",
        "department_id",
        "user_id",
        "pool_id",
        "gpu_model",
    )
    with transaction.atomic():
        _insert(ProjectUsage, (*USAGE, *project_keys), project_rows)
        _insert(WorkloadUsage, (*USAGE, *workload_keys), workload_rows)
        pool_keys = ("pool_id", "cluster_id", "capacity_s")
        _insert(PoolUsage, (*USAGE, *pool_keys), pool_rows(pools, per_pool, now))
    return len(project_rows) + len(workload_rows)


def build_now(admin: User, projects: list[Project], nodes: list[Node], gpus: int, now: dt.datetime):
    """One running workload per project (some GPUs idle), one pending, five minutes of samples."""
    running = Workload.objects.bulk_create(
        [Workload(project=p, submitted_by=admin, kind="training", name="run", gpus=Decimal(1),
                  state=WorkloadState.RUNNING) for p in projects]
    )  # fmt: skip
    Workload.objects.bulk_create(
        [Workload(project=p, submitted_by=admin, kind="training", name="wait", gpus=Decimal(2),
                  state=WorkloadState.PENDING) for p in projects]
    )  # fmt: skip
    slots = [(n, i) for n in nodes for i in range(gpus)]
    PodAllocation.objects.bulk_create(
        [PodAllocation(workload=w, pod_index=0, node=slots[k][0], gpu_indices=[slots[k][1]])
         for k, w in enumerate(running)]
    )  # fmt: skip
    samples = [
        {"node_id": n.pk, "gpu_index": i, "ts": now - dt.timedelta(seconds=s),
         "util_pct": 0.0 if (n.pk + i) % 7 == 0 else 60.0, "mem_used_mib": 1000,
         "mem_total_mib": 81920}
        for s in range(0, 300, 10) for n, i in slots
    ]  # fmt: skip
    samples_ingest(samples)
    return len(samples)


def cleanup() -> None:
    """Remove everything the benchmark made, for runs against a given database."""
    cluster = Cluster.objects.filter(name=f"{PREFIX}-cluster").first()
    pools = list(NodePool.objects.filter(name__startswith=PREFIX).values_list("id", flat=True))
    projects = list(Project.objects.filter(name__startswith=PREFIX).values_list("id", flat=True))
    PodAllocation.objects.filter(workload__project_id__in=projects).delete()
    Workload.objects.filter(project_id__in=projects).delete()
    for table in (ProjectUsage, WorkloadUsage):
        table.objects.filter(project_id__in=projects).delete()
    PoolUsage.objects.filter(pool_id__in=pools).delete()
    if cluster:
        from clusters.metrics.models import GpuSample  # noqa: PLC0415 - cleanup only

        GpuSample.objects.filter(node_id__in=cluster.nodes.values_list("id", flat=True)).delete()
        cluster.delete()
    Project.objects.filter(pk__in=projects).delete()
    Department.objects.filter(name__startswith=PREFIX).delete()
    NodePool.objects.filter(pk__in=pools).delete()
    User.objects.filter(username__startswith=PREFIX).delete()
