"""Clusters, node pools, nodes and GPUs: the inventory the scheduler places work on."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import models

from portal.tolerant import (
    INT32_MAX,
    INT64_MAX,
    TolerantDecimalField,
    in_range,
    json_is,
    tolerant_count,
)
from portal.versioned import Versioned

if TYPE_CHECKING:
    from clusters.backends.cgroups import Support
    from clusters.backends.sandbox import Isolation


class Installation(models.Model):
    """This GPUPool database's identity: one row, made by the migration (or on first use).

    Every object GPUPool makes in a cluster carries it, so that two GPUPool databases on
    one cluster never take, list or delete each other's pods."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return str(self.uid)


def installation_uid() -> str:
    """The installation's identity; made on first use where the row is missing (a database
    flushed by a test, or restored without it)."""
    row = Installation.objects.order_by("pk").first()
    if row is None:
        row, _ = Installation.objects.get_or_create(pk=1)
    return str(row.uid)


class Backend(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes"
    LOCAL = "local", "Local machine"
    SIMULATED = "simulated", "Simulated"


class Cluster(models.Model):
    name = models.CharField(max_length=63, unique=True)
    # The record's identity in the cluster's objects (labels, pod names, namespace
    # annotations): a second record for the same cluster never touches this one's pods.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    backend = models.CharField(max_length=16, choices=Backend.choices)
    # Fernet token of the kubeconfig (GPUPOOL_KUBECONFIG_KEY); never rendered back.
    kubeconfig_encrypted = models.TextField(blank=True)
    # Where the kubeconfig points (normalized), and the uid of the cluster's kube-system
    # namespace when it could be read: a cluster is registered once.
    api_server = models.CharField(max_length=2048, blank=True, db_index=True)
    kube_system_uid = models.CharField(max_length=64, blank=True, db_index=True)
    node_pool_label = models.CharField(max_length=253, default="gpupool.io/node-pool")
    topology_labels = models.JSONField(
        default=list,
        blank=True,
        help_text="Node labels naming topology levels, widest first, e.g. zone, rack.",
    )
    # Backend-specific description (the simulated cluster's nodes, the local work folder).
    config = models.JSONField(default=dict, blank=True)
    # Local clusters: the directories (absolute, resolved) under which a workload's data
    # volume may lie. Empty: no data volumes. Anything else (/etc) is refused.
    data_volume_roots = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    reachable = models.BooleanField(default=True)
    last_contact_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # Kubernetes: the highest resourceVersion of a pod and a service GPUPool wrote
    # ({"pods": "123", "services": "45"}); a pass trusts its watch cache once it has seen them.
    watch_state = models.JSONField(default=dict, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            json_is("cluster", "config", "object"),
            json_is("cluster", "topology_labels", "array"),
            json_is("cluster", "data_volume_roots", "array"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def isolation(self) -> Isolation | None:
        """A local cluster's sandboxing (can it isolate tenants here?); None on others."""
        if self.backend != Backend.LOCAL:
            return None
        from clusters.backends import sandbox  # noqa: PLC0415 - it imports models
        from clusters.backends.local import LocalBackend  # noqa: PLC0415

        if problem := self.record_problem:
            return sandbox.Isolation(False, problem)
        return LocalBackend(self).reported_isolation()

    @property
    def limits(self) -> Support | None:
        """A local cluster's resource limits per pod (cgroups); None on others."""
        if self.backend != Backend.LOCAL:
            return None
        from clusters.backends import cgroups  # noqa: PLC0415 - it imports models
        from clusters.backends.local import LocalBackend  # noqa: PLC0415

        if problem := self.record_problem:
            return cgroups.Support(False, 0, problem)
        return LocalBackend(self).reported_limits()

    @property
    def record_problem(self) -> str:
        """Why no backend can be made of this row (another writer's config), or ''."""
        from clusters.backends import RECORD_UNREADABLE  # noqa: PLC0415 - it imports models
        from clusters.stored import cluster_problem  # noqa: PLC0415

        problem = cluster_problem(self)
        return f"{RECORD_UNREADABLE}: {problem}" if problem else ""


class PlacementStrategy(models.TextChoices):
    BINPACK = "binpack", "Bin packing"
    SPREAD = "spread", "Spread"


class NodePool(models.Model):
    """A group of like nodes that quotas are set on. It may exist before its cluster does."""

    name = models.CharField(max_length=63, unique=True)
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="node_pools"
    )
    label_value = models.CharField(
        max_length=63,
        blank=True,
        help_text="Value of the cluster's node-pool label that puts a node in this pool; "
        "defaults to the pool's name.",
    )
    placement = models.CharField(
        max_length=16, choices=PlacementStrategy.choices, default=PlacementStrategy.BINPACK
    )
    description = models.TextField(blank=True)
    # Whether the scheduler may destroy idle MIG instances on this pool's nodes to cut the
    # shape a pending workload needs (dynamic MIG); off: only existing shapes and free
    # slices are used.
    mig_repartition = models.BooleanField(
        "MIG repartitioning",
        default=True,
        help_text="Let the scheduler destroy idle MIG instances here to make other shapes.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def selector_value(self) -> str:
        return self.label_value or self.name


class Node(Versioned):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    pool = models.ForeignKey(
        NodePool, null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    labels = models.JSONField(default=dict, blank=True)
    topology = models.JSONField(default=dict, blank=True, help_text="level -> domain")
    schedulable = models.BooleanField(default=True)
    unschedulable_reason = models.CharField(
        max_length=255, blank=True, help_text="Why no new pod may go there (NotReady, cordoned)."
    )
    # A text SQLite holds in a number loads as its stand-in (portal.tolerant): the cycle
    # places nothing on the node until the inventory sync writes the column again.
    cpu_cores = TolerantDecimalField(max_digits=9, decimal_places=2, default=0)
    memory_mib = tolerant_count(models.BigIntegerField(default=0))
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # What the node's agent last reported of its MIG instances (Kubernetes: the layout id
    # it applied, its GPUs in MIG mode, the MIG devices, NVML's errors); clusters/mig.py.
    mig_report = models.JSONField(default=dict, blank=True)
    # What the node's agent last reported of its MPS daemons: {"running": {device:
    # [allocation id, ...]}, "at": ...}; a native sharer is bound once its GPU's daemon runs
    # for it (clusters/mps_report.py).
    mps_report = models.JSONField(default=dict, blank=True)
    # Held by pods GPUPool did not bind (another scheduler's, another GPUPool's, DaemonSets'),
    # as the last inventory sync found them; the snapshot takes them out of the node's free
    # capacity. foreign_pods: {"count": n, "names": ["namespace/name", ...]} (a few).
    foreign_gpus = tolerant_count(models.PositiveIntegerField(default=0))
    foreign_cpu = TolerantDecimalField(max_digits=9, decimal_places=2, default=0)
    foreign_memory_mib = tolerant_count(models.BigIntegerField(default=0))
    foreign_pods = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"], name="unique_node_name_per_cluster"
            ),
            in_range("node", "cpu_cores", 0, Decimal("9999999.99")),
            in_range("node", "memory_mib", 0, INT64_MAX),
            in_range("node", "foreign_gpus", 0, INT32_MAX),
            in_range("node", "foreign_cpu", 0, Decimal("9999999.99")),
            in_range("node", "foreign_memory_mib", 0, INT64_MAX),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Gpu(Versioned):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = tolerant_count(models.PositiveIntegerField())
    uuid = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=100, blank=True)
    memory_mib = tolerant_count(models.PositiveIntegerField(default=0))
    # While shared: the device whose MPS daemon serves its sharers, as the node names it
    # (its UUID; on Kubernetes the one its reservation pod holds). The node agent runs
    # that daemon (clusters.agent.mps).
    mps_device = models.CharField(max_length=100, blank=True)
    # MIG mode as the node reports it: such a GPU is only ever split into MIG instances.
    mig_enabled = models.BooleanField(default=False)

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="unique_gpu_index_per_node"),
            in_range("gpu", "index", 0, INT32_MAX),
            in_range("gpu", "memory_mib", 0, INT32_MAX),
        ]

    def __str__(self) -> str:
        return f"{self.node}/gpu{self.index}"


class MigInstance(Versioned):
    """A MIG GPU instance the scheduler wants on a GPU (profile at a first memory slice).

    It outlives the workload that had it made, so the next one of that shape reuses it; the
    scheduler deletes the row only to make room for another shape, and never while an
    allocation holds it. The node makes the GPU match these rows and reports `uuid` (the
    MIG device UUID its pods get as NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES).
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="mig_instances")
    profile = models.CharField(max_length=16)
    start = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_id", "start"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "start"], name="one_mig_instance_per_start")
        ]

    def __str__(self) -> str:
        return f"{self.gpu}/{self.profile}@{self.start}"


class SimulatedPod(Versioned):
    """A pod "running" in a simulated cluster: the simulated cluster's own state, which it
    keeps in the database so that every worker process sees the same cluster. Versioned:
    a reconcile pass reads again only the pods whose bucket's versions changed
    (clusters/backends/simulated.py, `PodView`)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="simulated_pods")
    name = models.CharField(max_length=253)
    namespace = models.CharField(max_length=63)
    workload_id = models.BigIntegerField()
    pod_index = models.PositiveIntegerField()
    node_name = models.CharField(max_length=253)
    gpu_indices = models.JSONField(default=list, blank=True)
    shared_gpu_index = models.IntegerField(null=True, blank=True)
    gpu_share = models.FloatField(null=True, blank=True)
    # The environment the pod was given (the same contract as a real pod's, MPS limits too).
    env = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    duration_s = models.FloatField(null=True, blank=True)
    deleting_since = models.DateTimeField(null=True, blank=True)
    # Seconds from deleting_since until the pod is gone: the cluster's stop delay, or the
    # pod's grace period if shorter. None: the stop delay (pods stopped before this field).
    stop_after_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="unique_simulated_pod")
        ]
