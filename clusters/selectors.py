"""Reads of the clusters app: cluster health and the per-GPU allocation picture of nodes."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, Q, QuerySet

from clusters.backends import get_backend, pod_name
from clusters.backends.sshd import SSH_USER
from clusters.metrics.models import AllocationInterval, GpuSample
from clusters.mig import drawn_instances, mig_limits
from clusters.models import Backend, Cluster, Gpu, Node, NodePool
from clusters.podspecs import native_slot
from clusters.sharing import allocation_mps, mps_enabled
from clusters.templatetags.clusters_units import mib
from portal.permissions import is_platform_admin, visible_projects
from scheduling.models import PodAllocation

logger = logging.getLogger(__name__)
__all__ = ["SSH_USER"]  # the login name of workloads' SSH servers, for scheduling's links

# Backends whose pods are real processes (ports answer, a tool can be opened); a simulated
# cluster only pretends to run them.
REAL_PROCESS_BACKENDS = (Backend.LOCAL, Backend.KUBERNETES)
NAMED_PODS = 5  # foreign pods named on the nodes page


def _pools_of(backends: tuple[str, ...]) -> QuerySet[NodePool]:
    """Pools whose cluster, or any of whose nodes' clusters, is enabled and of these kinds."""
    return (
        NodePool.objects.filter(
            Q(cluster__backend__in=backends, cluster__enabled=True)
            | Q(nodes__cluster__backend__in=backends, nodes__cluster__enabled=True)
        )
        .distinct()
        .order_by("name")
    )


def real_process_pool_names() -> list[str]:
    """Node pools where a workload's process really runs, by name."""
    return list(_pools_of(REAL_PROCESS_BACKENDS).values_list("name", flat=True))


def simulated_pool_ids() -> set[int]:
    return set(_pools_of((Backend.SIMULATED,)).values_list("pk", flat=True))


def pool_backends() -> dict[str, set[str]]:
    """Node pool name -> the backends of the enabled clusters that feed it (its own
    cluster's and its nodes'), for forms that explain what a pool runs: two queries."""
    backends: dict[str, set[str]] = {
        name: set() for name in NodePool.objects.values_list("name", flat=True)
    }
    own = NodePool.objects.filter(cluster__enabled=True).values_list("name", "cluster__backend")
    fed = (
        Node.objects.filter(pool__isnull=False, cluster__enabled=True)
        .values_list("pool__name", "cluster__backend")
        .distinct()
    )
    for name, backend in [*own, *fed]:
        backends.setdefault(name, set()).add(backend)
    return backends


def pools_with_gpus() -> set[str]:
    """The names of the node pools whose nodes hold GPUs (enabled clusters): one query."""
    return set(
        Gpu.objects.filter(node__pool__isnull=False, node__cluster__enabled=True)
        .values_list("node__pool__name", flat=True)
        .distinct()
    )


def gpu_models() -> list[str]:
    """The GPU models the inventory holds, for a form's choices."""
    models = Gpu.objects.exclude(model="").values_list("model", flat=True).distinct()
    return sorted(set(models))


def topology_levels() -> list[str]:
    """The topology levels the nodes name (rack, zone, ...), for a form's suggestions."""
    levels: set[str] = set()
    for topology in Node.objects.exclude(topology={}).values_list("topology", flat=True).distinct():
        levels.update(topology or {})
    return sorted(levels)


def cluster_list() -> QuerySet[Cluster]:
    return Cluster.objects.annotate(
        node_count=Count("nodes", distinct=True), gpu_count=Count("nodes__gpus", distinct=True)
    ).prefetch_related("node_pools")


@dataclass(slots=True)
class GpuUse:
    """Who holds one GPU: one workload whole, or several workloads by fraction."""

    index: int
    model: str
    memory_mib: int
    whole: dict[str, Any] | None = None
    shares: list[dict[str, Any]] = field(default_factory=list)
    mig: bool = False
    mig_instances: list[dict[str, Any]] = field(default_factory=list)
    mig_holders: dict[int, dict] = field(default_factory=dict)  # instance start -> holder

    @property
    def shared_total(self) -> Decimal:
        return sum((s["share"] for s in self.shares), Decimal(0))

    @property
    def shared_percent(self) -> int:
        """How much of the device its sharers hold, in per cent (two halves: 100)."""
        return round(self.shared_total * 100)

    @property
    def free(self) -> bool:
        return self.whole is None and not self.shares and not self.mig_holders


@dataclass(slots=True)
class NodeRow:
    node: Node
    gpus: list[GpuUse]
    # Whether the viewer may see the names of pods GPUPool did not bind (other tenants' and
    # the cluster's own namespaces): platform admins only; others see what they hold.
    foreign_names: bool = False

    @property
    def used(self) -> int:
        """GPUs held: by GPUPool's workloads, and by pods GPUPool did not bind."""
        held = sum(1 for g in self.gpus if not g.free)
        return min(len(self.gpus), held + self.node.foreign_gpus)

    @property
    def foreign(self) -> dict[str, Any] | None:
        """What pods GPUPool did not bind hold here (inventory sync), or None."""
        return foreign_use(self.node, names=self.foreign_names)


def foreign_use(node: Node, *, names: bool) -> dict[str, Any] | None:
    """A node's foreign use for the page and the API: its amounts, how many pods, a few of
    their names, and a sentence ("2 GPUs, 4 CPU, 16 GiB used by 3 pods not scheduled by
    GPUPool: kube-system/dcgm-exporter-x, ..."); None where nobody else holds anything."""
    pods = node.foreign_pods if isinstance(node.foreign_pods, dict) else {}
    try:
        count = int(pods.get("count") or 0)
    except (TypeError, ValueError):  # a planted row: shown as nothing, never a 500
        count = 0
    if count <= 0:
        return None
    named = [str(name) for name in (pods.get("names") or [])][:NAMED_PODS] if names else []
    cpu = node.foreign_cpu.normalize()
    amounts = [
        f"{node.foreign_gpus} GPU{'s' if node.foreign_gpus != 1 else ''}",
        f"{cpu:f} CPU",
        mib(node.foreign_memory_mib),
    ]
    text = (
        f"{', '.join(amounts)} used by {count} pod{'s' if count != 1 else ''} not scheduled "
        "by GPUPool"
    )
    if named:
        text += f": {', '.join(named)}{', ...' if count > len(named) else ''}"
    return {
        "gpus": node.foreign_gpus,
        "cpu": float(node.foreign_cpu),
        "memory_mib": node.foreign_memory_mib,
        "pods": count,
        "names": named,
        "text": text,
    }


def node_rows(
    user: Any, *, cluster_id: int | None = None, pool_id: int | None = None
) -> list[NodeRow]:
    """Nodes with each GPU's holders. Workloads of projects the user may not see are shown
    as "another project", so that the picture of free and used GPUs stays complete."""
    nodes = Node.objects.select_related("cluster", "pool").prefetch_related(
        "gpus", "gpus__mig_instances"
    )
    if cluster_id:
        nodes = nodes.filter(cluster_id=cluster_id)
    if pool_id:
        nodes = nodes.filter(pool_id=pool_id)
    nodes = list(nodes)
    holders = _holders(user, [n.pk for n in nodes])
    admin = is_platform_admin(user)
    rows = []
    for node in nodes:
        gpus = [GpuUse(g.index, g.model, g.memory_mib, mig=g.mig_enabled) for g in node.gpus.all()]
        by_index = {g.index: g for g in gpus}
        enforced = mps_enabled(node.cluster.config)
        for allocation, label in holders.get(node.pk, []):
            _place(by_index, allocation, label, enforced=enforced)
        for gpu in node.gpus.all():
            use = by_index[gpu.index]
            if gpu.mig_enabled:
                instances = list(gpu.mig_instances.all())
                use.mig_instances = drawn_instances(
                    gpu.model, gpu.memory_mib, instances, use.mig_holders
                )
        rows.append(NodeRow(node, gpus, foreign_names=admin))
    return rows


def _holders(user: Any, node_ids: list[int]) -> dict[int, list[tuple[PodAllocation, dict]]]:
    visible = set(visible_projects(user).values_list("pk", flat=True))
    allocations = PodAllocation.objects.filter(node_id__in=node_ids).select_related(
        "workload", "workload__project"
    )
    out: dict[int, list[tuple[PodAllocation, dict]]] = defaultdict(list)
    for allocation in allocations:
        workload = allocation.workload
        seen = workload.project_id in visible
        label = {
            "workload_id": workload.pk if seen else None,
            "name": f"{workload.project.name}/{workload.name}" if seen else "another project",
            "pod": allocation.pod_index,
            "phase": allocation.phase or workload.state,
        }
        out[allocation.node_id].append((allocation, label))
    return out


def _place(
    by_index: dict[int, GpuUse], allocation: PodAllocation, label: dict, *, enforced: bool
) -> None:
    """`enforced`: the cluster enforces shares through MPS; each share then carries its
    limits (clusters.sharing), which the nodes page shows."""
    if allocation.mig_gpu_index is not None and allocation.mig_start is not None:
        gpu = by_index.get(allocation.mig_gpu_index)
        if gpu is not None:
            gpu.mig_holders[allocation.mig_start] = label
        return
    if allocation.shared_gpu_index is not None:
        gpu = by_index.get(allocation.shared_gpu_index)
        if gpu is not None:
            gpu.shares.append(
                {
                    **label,
                    "share": allocation.gpu_share or Decimal(0),
                    "memory_mib": allocation.gpu_memory_mib,
                    "mps": _limits(allocation, gpu.memory_mib) if enforced else None,
                }
            )
        return
    for index in allocation.gpu_indices or []:
        gpu = by_index.get(int(index))
        if gpu is not None:
            gpu.whole = label


def _limits(allocation: PodAllocation, device_memory_mib: int) -> dict[str, Any] | None:
    limits = allocation_mps(allocation, device_memory_mib)
    return limits.as_dict() if limits is not None else None


def enforced_limits(allocation: PodAllocation) -> dict[str, Any] | None:
    """What MPS enforces for a sharer, for the API and the workload page: its GPU memory
    and compute share. None for whole GPUs, and where the cluster turns MPS off. A MIG
    instance is enforced by the GPU itself: its profile, memory and compute slices."""
    if allocation.mig_gpu_index is not None:
        return mig_limits(allocation.mig_profile)
    if allocation.shared_gpu_index is None or not mps_enabled(allocation.node.cluster.config):
        return None
    memory = (
        Gpu.objects.filter(node_id=allocation.node_id, index=allocation.shared_gpu_index)
        .values_list("memory_mib", flat=True)
        .first()
    )
    return _limits(allocation, memory or 0)


def pod_limits(allocation: PodAllocation) -> dict[str, Any] | None:
    """The CPU, memory and process limits a local pod runs under (its cgroup), or why it
    has none, for the workload page. None on other backends (Kubernetes: the pod's spec)."""
    cluster = allocation.node.cluster
    if cluster.backend != Backend.LOCAL:
        return None
    if problem := cluster.record_problem:
        return {"limited": False, "reason": problem}
    return get_backend(cluster).pod_limits(_name_of(allocation))  # type: ignore[attr-defined]


def _name_of(allocation: PodAllocation) -> str:
    return pod_name(allocation.workload_id, allocation.pod_index)


def workload_pod_logs(
    workload: Any, tail_lines: int = 500, pod: int | None = None
) -> tuple[list[tuple[int, str]], str]:
    """Each pod's recent output (or only pod `pod`'s) from the workload's cluster backend,
    or why there is none."""
    if workload.cluster is None:
        return [], "This workload has not run on a cluster yet."
    indices = range(workload.pods) if pod is None else [pod]
    try:
        backend = get_backend(workload.cluster)
        namespace = workload.project.namespace
        return [(i, _logs(backend, workload, i, namespace, tail_lines)) for i in indices], ""
    except Exception as exc:  # a cluster that is down must not break the page
        logger.warning("logs of workload %s unavailable: %s", workload.pk, exc)
        return [], f"Logs are unavailable: {exc}"


def _logs(backend: Any, workload: Any, index: int, namespace: str, tail_lines: int) -> str:
    """Pod `index`'s output: GPUPool's own pod, or the pod made outside it in that slot."""
    native = native_slot(workload, index)
    if native:
        return backend.native_logs(native, namespace, tail_lines=tail_lines)
    return backend.pod_logs(pod_name(workload.pk, index), namespace, tail_lines=tail_lines)


def workload_gpu_utilization(workload_id: int, since: datetime) -> float | None:
    """Mean utilization (percent) of the GPUs a workload's processes used since `since`,
    from the node agents' samples; None when there is no sample (scheduling.autoscale)."""
    found = GpuSample.objects.filter(workload_id=workload_id, ts__gte=since).aggregate(
        Avg("util_pct")
    )
    value = found["util_pct__avg"]
    return None if value is None else float(value)


def workload_pod_history(
    workloads: QuerySet,
) -> Iterator[tuple[int, datetime, datetime | None, float]]:
    """(workload id, started, ended or None while held, GPU share) of every pod these
    workloads held, from the usage history, by workload then start; streamed, one query
    (scheduling.trace_export)."""
    return (
        AllocationInterval.objects.filter(workload_id__in=workloads.values("pk"))
        .order_by("workload_id", "started_at")
        .values_list("workload_id", "started_at", "ended_at", "share")
        .iterator(chunk_size=2000)
    )
