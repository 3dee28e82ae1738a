"""Inventory sync: a cluster's nodes and GPUs, as its backend reports them, into the database.

Nodes are matched by name, GPUs by index. A node the cluster no longer lists is marked
unschedulable and kept: allocations (and metrics) may still point at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from clusters.backends import Backend, ForeignUse, NodeInfo, get_backend
from clusters.models import Cluster, Gpu, Node, NodePool
from clusters.reconcile import cluster_mark_contacted

# Rows written per transaction: a sync never holds the node rows a cycle locks
# (scheduling.cycle.nodes_lock) for longer than one short batch.
BATCH = 200
# last_seen_at is refreshed when older than this: a sync that finds nothing changed
# writes nothing else, and this at most once in a while, in one statement.
SEEN_REFRESH = timedelta(minutes=10)
NODE_FIELDS = (
    "pool",
    "labels",
    "topology",
    "schedulable",
    "unschedulable_reason",
    "cpu_cores",
    "memory_mib",
    "foreign_gpus",
    "foreign_cpu",
    "foreign_memory_mib",
    "foreign_pods",
)
FOREIGN_MAX = 10**6  # GPUs or cores held by others on one node: fits the columns
GPU_FIELDS = ("uuid", "model", "memory_mib", "mig_enabled")


@dataclass(slots=True)
class SyncResult:
    nodes: int = 0
    gpus: int = 0
    created_pools: int = 0
    vanished: int = 0
    written: int = 0  # node and GPU rows created, changed or deleted


def topology_level(label: str) -> str:
    """`topology.kubernetes.io/zone` -> `zone`: levels are named by the label's last part."""
    return label.rsplit("/", 1)[-1]


def inventory_sync(cluster: Cluster, *, backend: Backend | None = None) -> SyncResult:
    """Ask the backend for its nodes (may raise BackendUnreachable), then store them."""
    nodes = (backend or get_backend(cluster)).list_inventory()
    result = inventory_store(cluster, nodes)
    # It answered: an "unreachable" error is over; a reconcile's error still stands.
    cluster_mark_contacted(cluster, cluster.last_error if cluster.reachable else "")
    return result


def inventory_store(cluster: Cluster, nodes: list[NodeInfo]) -> SyncResult:
    """Store what the cluster lists, writing only rows that differ from what is stored.

    1. read the cluster's nodes and GPUs as stored (two queries);
    2. work out each listed node's row and GPU rows, and compare;
    3. write the differences in batches, each its own short transaction (a node and its
       GPUs always together): the cycle locks every node row, and a sync that held them
       all while it wrote 1,000 nodes kept it waiting for most of a minute (issue 25);
    4. mark nodes the cluster no longer lists unschedulable, and refresh last_seen_at
       where it is older than SEEN_REFRESH, one statement each.
    """
    result = SyncResult()
    pools = _PoolFinder(cluster)
    stored = {node.name: node for node in Node.objects.filter(cluster=cluster)}
    gpus: dict[int, dict[int, Gpu]] = {}
    for gpu in Gpu.objects.filter(node__cluster=cluster):
        gpus.setdefault(gpu.node_id, {})[gpu.index] = gpu
    changes = [
        _node_change(cluster, info, pools.for_labels(info.labels), stored.get(info.name), gpus)
        for info in nodes
    ]
    result.created_pools = pools.created
    result.nodes, result.gpus = len(nodes), sum(len(info.gpus) for info in nodes)
    now = timezone.now()
    for start in range(0, len(changes), BATCH):
        batch = [c for c in changes[start : start + BATCH] if c.dirty]
        if batch:
            with transaction.atomic():
                result.written += sum(change.write(now) for change in batch)
    seen = [change.node.pk for change in changes]
    with transaction.atomic():
        result.vanished = (
            Node.objects.filter(cluster=cluster, schedulable=True)
            .exclude(pk__in=seen)
            .update(schedulable=False, unschedulable_reason="gone from the cluster")
        )
        stale = Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now - SEEN_REFRESH)
        Node.objects.filter(stale, pk__in=seen).update(last_seen_at=now)
    return result


@dataclass(slots=True, eq=False)
class _NodeChange:
    """One listed node against its stored row: what to create, update or delete."""

    node: Node
    new: bool
    fields: list[str]
    gpus_new: list[Gpu]
    gpus_changed: list[Gpu]
    gpus_gone: list[int]

    @property
    def dirty(self) -> bool:
        return bool(self.new or self.fields or self.gpus_new or self.gpus_changed or self.gpus_gone)

    def write(self, now: datetime) -> int:
        """Write the differences; how many rows that touched."""
        if self.new:
            self.node.last_seen_at = now
            self.node.save()
            for gpu in self.gpus_new:
                gpu.node = self.node
        elif self.fields:
            self.node.save(update_fields=self.fields)
        Gpu.objects.bulk_create(self.gpus_new)
        if self.gpus_changed:
            Gpu.objects.bulk_update(self.gpus_changed, GPU_FIELDS)
        # A GPU that fell off the bus is gone; allocations name GPUs by index, not by row.
        gone = Gpu.objects.filter(pk__in=self.gpus_gone).delete()[0] if self.gpus_gone else 0
        touched = 1 if self.new or self.fields else 0
        return touched + len(self.gpus_new) + len(self.gpus_changed) + gone


def _node_change(
    cluster: Cluster,
    info: NodeInfo,
    pool: NodePool | None,
    node: Node | None,
    stored_gpus: dict[int, dict[int, Gpu]],
) -> _NodeChange:
    wanted = {
        "pool": pool,
        "labels": dict(info.labels),
        "topology": {
            topology_level(label): info.labels[label]
            for label in cluster.topology_labels or []
            if label in info.labels
        },
        "schedulable": info.schedulable,
        "unschedulable_reason": "" if info.schedulable else info.unschedulable_reason,
        "cpu_cores": Decimal(str(round(info.cpu_cores, 2))),
        "memory_mib": info.memory_mib,
        **_foreign_fields(info.foreign),
    }
    new = node is None
    if node is None:
        node = Node(cluster=cluster, name=info.name, **wanted)
        fields = []
    else:
        fields = [name for name in NODE_FIELDS if _stored(node, name) != _value(wanted[name])]
        for name in fields:
            setattr(node, name, wanted[name])
    have = {} if new else stored_gpus.get(node.pk, {})
    gpus_new, gpus_changed = [], []
    for gpu in info.gpus:
        values = {
            "uuid": gpu.uuid,
            "model": gpu.model,
            "memory_mib": gpu.memory_mib,
            "mig_enabled": gpu.mig,
        }
        row = have.get(gpu.index)
        if row is None:
            gpus_new.append(Gpu(node=None if new else node, index=gpu.index, **values))
        elif any(getattr(row, name) != value for name, value in values.items()):
            for name, value in values.items():
                setattr(row, name, value)
            gpus_changed.append(row)
    listed = {gpu.index for gpu in info.gpus}
    gone = [row.pk for index, row in have.items() if index not in listed]
    return _NodeChange(node, new, fields, gpus_new, gpus_changed, gone)


def _foreign_fields(use: ForeignUse) -> dict[str, object]:
    """The Node fields of what pods GPUPool did not bind hold (bounded to the columns)."""
    return {
        "foreign_gpus": min(use.gpus, FOREIGN_MAX),
        "foreign_cpu": Decimal(str(round(min(use.cpu, FOREIGN_MAX), 2))),
        "foreign_memory_mib": min(use.memory_mib, 2**62),
        "foreign_pods": {"count": use.pod_count, "names": list(use.pods)} if use.pod_count else {},
    }


def _stored(node: Node, name: str) -> object:
    return node.pool_id if name == "pool" else getattr(node, name)


def _value(value: object) -> object:
    return value.pk if isinstance(value, NodePool) else value


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
