"""Inventory sync: a cluster's nodes and GPUs, as its backend reports them, into the database.

Nodes are matched by name, GPUs by index. A node the cluster no longer lists is marked
unschedulable and kept: allocations (and metrics) may still point at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from clusters.backends import Backend, NodeInfo, get_backend
from clusters.models import Cluster, Gpu, Node, NodePool
from clusters.reconcile import cluster_mark_contacted


@dataclass(slots=True)
class SyncResult:
    nodes: int = 0
    gpus: int = 0
    created_pools: int = 0
    vanished: int = 0


def topology_level(label: str) -> str:
    """`topology.kubernetes.io/zone` -> `zone`: levels are named by the label's last part."""
    return label.rsplit("/", 1)[-1]


def inventory_sync(cluster: Cluster, *, backend: Backend | None = None) -> SyncResult:
    """Ask the backend for its nodes (may raise BackendUnreachable), then store them."""
    nodes = (backend or get_backend(cluster)).list_inventory()
    with transaction.atomic():
        result = inventory_store(cluster, nodes)
        # It answered: an "unreachable" error is over; a reconcile's error still stands.
        cluster_mark_contacted(cluster, cluster.last_error if cluster.reachable else "")
    return result


@transaction.atomic
def inventory_store(cluster: Cluster, nodes: list[NodeInfo]) -> SyncResult:
    result = SyncResult()
    pools = _PoolFinder(cluster)
    now = timezone.now()
    seen = []
    for info in nodes:
        node = _store_node(cluster, info, pools.for_labels(info.labels), now)
        result.gpus += _store_gpus(node, info)
        seen.append(node.pk)
    result.nodes = len(seen)
    result.created_pools = pools.created
    result.vanished = (
        Node.objects.filter(cluster=cluster, schedulable=True)
        .exclude(pk__in=seen)
        .update(schedulable=False, unschedulable_reason="gone from the cluster")
    )
    return result


def _store_node(cluster: Cluster, info: NodeInfo, pool: NodePool | None, now: datetime) -> Node:
    topology = {
        topology_level(label): info.labels[label]
        for label in cluster.topology_labels or []
        if label in info.labels
    }
    node, _ = Node.objects.update_or_create(
        cluster=cluster,
        name=info.name,
        defaults={
            "pool": pool,
            "labels": dict(info.labels),
            "topology": topology,
            "schedulable": info.schedulable,
            "unschedulable_reason": "" if info.schedulable else info.unschedulable_reason,
            "cpu_cores": Decimal(str(round(info.cpu_cores, 2))),
            "memory_mib": info.memory_mib,
            "last_seen_at": now,
        },
    )
    return node


def _store_gpus(node: Node, info: NodeInfo) -> int:
    indices = []
    for gpu in info.gpus:
        Gpu.objects.update_or_create(
            node=node,
            index=gpu.index,
            defaults={
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "mig_enabled": gpu.mig,
            },
        )
        indices.append(gpu.index)
    # A GPU that fell off the bus is gone; allocations name GPUs by index, not by row.
    Gpu.objects.filter(node=node).exclude(index__in=indices).delete()
    return len(indices)


class _PoolFinder:
    """Node-pool label value -> NodePool of this cluster, created on first sight.

    A pool made by an admin before the cluster existed (no cluster, same name or label
    value) is adopted rather than duplicated.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.cache: dict[str, NodePool | None] = {}
        self.created = 0

    def for_labels(self, labels: dict[str, str] | object) -> NodePool | None:
        value = dict(labels).get(self.cluster.node_pool_label)  # type: ignore[call-overload]
        if not value:
            return None
        if value not in self.cache:
            self.cache[value] = self._find(value) or self._create(value)
        return self.cache[value]

    def _find(self, value: str) -> NodePool | None:
        for pool in NodePool.objects.filter(cluster=self.cluster):
            if pool.selector_value == value:
                return pool
        for pool in NodePool.objects.filter(cluster__isnull=True):
            if pool.selector_value == value:
                pool.cluster = self.cluster
                pool.save(update_fields=["cluster"])
                return pool
        return None

    def _create(self, value: str) -> NodePool:
        name = value
        if NodePool.objects.filter(name=name).exists():
            name = f"{self.cluster.name}-{value}"[:63]
        self.created += 1
        return NodePool.objects.create(name=name, cluster=self.cluster, label_value=value)
