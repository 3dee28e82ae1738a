"""Workloads, where their pods run, and what happened to them."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models

from portal.models import Project, k8s_name_validator
from portal.tolerant import (  # TolerantDecimalField: named by migration 0006
    INT32_MAX,
    TolerantDecimalField,
    in_range,
    json_is,
    one_of,
    tolerant_count,
    tolerant_datetime,
)
from portal.versioned import Versioned

INT32_BELOW = -(2**31) - 1  # below a PostgreSQL integer: what a text in a signed one loads as


class WorkloadKind(models.TextChoices):
    WORKSPACE = "workspace", "Workspace"
    TRAINING = "training", "Training"
    DISTRIBUTED = "distributed", "Distributed training"
    HPO = "hpo", "HPO sweep"
    INFERENCE = "inference", "Inference"


class WorkloadState(models.TextChoices):
    PENDING = "pending", "Pending"
    ADMITTED = "admitted", "Admitted"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"
    PREEMPTED = "preempted", "Preempted"


ACTIVE_STATES = (WorkloadState.ADMITTED, WorkloadState.RUNNING)
FINISHED_STATES = (WorkloadState.SUCCEEDED, WorkloadState.FAILED, WorkloadState.STOPPED)


class GpuRequestKind(models.TextChoices):
    WHOLE = "whole", "Whole GPUs"
    FRACTION = "fraction", "Fraction of a GPU"
    MEMORY = "memory", "GPU memory"
    MIG = "mig", "MIG instance"


class PriorityClass(models.TextChoices):
    BUILD = "build", "Build (interactive)"
    TRAIN = "train", "Train"
    INFERENCE = "inference", "Inference"


class Workload(Versioned):
    """A unit of work: one or more identical pods (a gang when min_pods > 1)."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="workloads")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workloads"
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        help_text="The HPO sweep of a trial.",
    )
    kind = models.CharField(max_length=16, choices=WorkloadKind.choices)
    name = models.CharField(max_length=63, validators=[k8s_name_validator])
    image = models.CharField(max_length=300, blank=True)
    command = models.JSONField(default=list, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # Per-pod resources.
    gpu_request = models.CharField(
        max_length=16, choices=GpuRequestKind.choices, default=GpuRequestKind.WHOLE
    )
    gpus = TolerantDecimalField(
        max_digits=6,
        decimal_places=3,
        default=0,
        help_text="Whole GPUs per pod, or the fraction of one GPU.",
    )
    gpu_memory_mib = tolerant_count(models.PositiveIntegerField(default=0))
    # With gpu_request "mig": a MIG profile ("3g.40gb"), or "auto" for the smallest profile
    # that holds gpu_memory_mib.
    mig_profile = models.CharField(max_length=16, blank=True)
    cpu = TolerantDecimalField(max_digits=7, decimal_places=2, default=1)
    memory_mib = tolerant_count(models.PositiveIntegerField(default=1024))
    pods = tolerant_count(models.PositiveIntegerField(default=1))
    # Processes and threads per pod, at most the cluster's `pids_max`; empty: the cluster's.
    pids_max = tolerant_count(
        models.PositiveIntegerField("processes per pod", null=True, blank=True)
    )
    min_pods = tolerant_count(models.PositiveIntegerField(default=1))
    # Elastic: runs with min_pods .. pods pods (replicas), grown with idle GPUs and shrunk
    # first when GPUs are reclaimed (scheduling/engine/actions/elastic.py).
    elastic = models.BooleanField(default=False)
    handles_resize = models.BooleanField(
        default=False,
        help_text="The job follows size changes itself; otherwise its pods restart from "
        "their checkpoint when its size changes.",
    )
    resized_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    # A GPU range for single-pod work: it runs with min_gpus .. gpus whole GPUs on one node
    # (elastic; docs/scheduling.md "A GPU range"). None: exactly `gpus`.
    min_gpus = tolerant_count(models.PositiveSmallIntegerField(null=True, blank=True))
    # Set while the pods of a job that changed size are restarted with the new size.
    restarting = models.BooleanField(default=False)
    # Placement wishes.
    node_pools = models.JSONField(
        default=list, blank=True, help_text="Node pool names in preference order; empty = any."
    )
    gpu_model = models.CharField(
        max_length=200, blank=True, help_text="Allowed GPU models separated by '|'; empty = any."
    )
    topology_level = models.CharField(max_length=63, blank=True)
    topology_required = models.BooleanField(default=False)
    # Priority and lifecycle policy.
    priority_class = models.CharField(
        max_length=16, choices=PriorityClass.choices, default=PriorityClass.TRAIN
    )
    # A text SQLite holds here loads as one below the column's range on PostgreSQL (a
    # 32-bit integer): a priority no row can hold, and the row is quarantined.
    priority = tolerant_count(models.IntegerField(default=0), unreadable=INT32_BELOW)
    preemptible = models.BooleanField(default=True)
    max_runtime_s = tolerant_count(models.PositiveIntegerField(null=True, blank=True))
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    checkpoint_interval_s = tolerant_count(
        models.PositiveIntegerField(
            "checkpoint interval (s)",
            null=True,
            blank=True,
            help_text="How often it saves a checkpoint, as its owner declared; empty = unknown. "
            "An eviction may wait for a checkpoint that is due soon.",
        )
    )
    spec = models.JSONField(
        default=dict, blank=True, help_text="Kind-specific extras: ports, HPO search space, ..."
    )
    # The cluster it was last placed on: where its logs are, after its pods are gone too.
    cluster = models.ForeignKey(
        "clusters.Cluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # State.
    state = models.CharField(
        max_length=16, choices=WorkloadState.choices, default=WorkloadState.PENDING, db_index=True
    )
    pending_reason = models.TextField(blank=True)
    # Where the last cycle placed it while the GPUs there were still being freed by pods
    # going away (its own victims' or others'): the pods, as PodPlacement fields, and the
    # request they were chosen for. Admitted there first once those GPUs are free
    # (scheduling/nominations.py), so the next cycle does not plan the room over again.
    nominated = models.JSONField(null=True, blank=True, default=None)
    message = models.TextField(blank=True)
    exit_code = tolerant_count(models.IntegerField(null=True, blank=True), unreadable=INT32_BELOW)
    restart_count = tolerant_count(models.PositiveIntegerField(default=0))
    created_at = tolerant_datetime(models.DateTimeField(auto_now_add=True, db_index=True))
    queued_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    admitted_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    started_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    finished_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    last_checkpoint_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], name="unique_workload_name_per_project"
            ),
            # What any writer may store (docs/deploy.md "Database checks"); the submit's
            # own bounds (scheduling/bounds.py) are narrower.
            in_range("workload", "gpus", 0, Decimal("999.999")),
            in_range("workload", "cpu", 0, Decimal("99999.99")),
            in_range("workload", "pods", 1, INT32_MAX),
            models.CheckConstraint(
                condition=models.Q(min_pods__gte=1, min_pods__lte=models.F("pods")),
                name="workload_min_pods_in_range",
            ),
            in_range("workload", "memory_mib", 0, INT32_MAX),
            in_range("workload", "gpu_memory_mib", 0, INT32_MAX),
            in_range("workload", "min_gpus", 1, 32767, null=True),
            in_range("workload", "priority", -INT32_MAX - 1, INT32_MAX),
            in_range("workload", "max_runtime_s", 0, INT32_MAX, null=True),
            in_range("workload", "checkpoint_interval_s", 0, INT32_MAX, null=True),
            in_range("workload", "restart_count", 0, INT32_MAX),
            in_range("workload", "pids_max", 16, 1_048_576, null=True),  # bounds.PIDS_MAX
            in_range("workload", "exit_code", -INT32_MAX - 1, INT32_MAX, null=True),
            one_of("workload", "state", WorkloadState),
            one_of("workload", "kind", WorkloadKind),
            one_of("workload", "gpu_request", GpuRequestKind),
            one_of("workload", "priority_class", PriorityClass),
        ]
        indexes = [models.Index(fields=["project", "state"])]

    def __str__(self) -> str:
        return f"{self.project.name}/{self.name}"


class PodAllocation(Versioned):
    """Where one pod of an admitted workload runs: a node, and whole GPUs or a GPU share."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="allocations")
    pod_index = tolerant_count(models.PositiveIntegerField())
    node = models.ForeignKey("clusters.Node", on_delete=models.PROTECT, related_name="allocations")
    gpu_indices = models.JSONField(default=list, blank=True)
    # A text SQLite holds in a column loads as its stand-in (portal.tolerant): the cycle
    # fails the workload and leaves the node alone until the pod is gone (adapters).
    shared_gpu_index = tolerant_count(
        models.IntegerField(null=True, blank=True), unreadable=INT32_BELOW
    )
    gpu_share = TolerantDecimalField(max_digits=6, decimal_places=3, null=True, blank=True)
    gpu_memory_mib = tolerant_count(models.PositiveIntegerField(default=0))
    # A MIG instance: the GPU, the instance's profile and first memory slice.
    mig_gpu_index = tolerant_count(
        models.IntegerField(null=True, blank=True), unreadable=INT32_BELOW
    )
    mig_profile = models.CharField(max_length=16, blank=True)
    mig_start = tolerant_count(
        models.SmallIntegerField(null=True, blank=True), unreadable=INT32_BELOW
    )
    phase = models.CharField(max_length=32, blank=True, help_text="As the cluster reports it.")
    # Where the pod's exposed port answers (host:port), for the workspace proxy and services.
    endpoint = models.CharField(max_length=255, blank=True)
    # Where each declared port answers, by port name (host:port, or unix:/path on the local
    # backend), as the backend reports it: what the proxy and the SSH tunnel dial.
    ports = models.JSONField(default=dict, blank=True)
    # The backend's own handle: a pod name, a process id.
    backend_ref = models.CharField(max_length=255, blank=True)
    # A pod an elastic workload gave back: its GPUs stay taken until the pod is gone.
    releasing = models.BooleanField(default=False)
    # GPUs a pod with a GPU range gave back: still held until it restarts with the rest.
    releasing_gpu_indices = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workload_id", "pod_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["workload", "pod_index"], name="one_allocation_per_pod"
            ),
            in_range("allocation", "pod_index", 0, INT32_MAX),
            in_range("allocation", "shared_gpu_index", 0, INT32_MAX, null=True),
            in_range("allocation", "gpu_share", 0, 1, null=True),
            in_range("allocation", "gpu_memory_mib", 0, INT32_MAX),
            in_range("allocation", "mig_gpu_index", 0, INT32_MAX, null=True),
            in_range("allocation", "mig_start", 0, 32767, null=True),
            json_is("allocation", "ports", "object"),
        ]


class WorkloadEvent(models.Model):
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    type = models.CharField(max_length=32)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "id"]


class WorkloadPolicy(models.Model):
    """Submission rules of one project or one department; a project's set fields win.

    A field left empty (None) inherits from the department, then from the defaults:
    any kind, no GPU cap, no runtime limit, training preemptible and the rest not.
    """

    department = models.OneToOneField(
        "portal.Department",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="workload_policy",
    )
    project = models.OneToOneField(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="workload_policy"
    )
    max_gpus_per_workload = models.DecimalField(
        "max GPUs per workload", max_digits=7, decimal_places=3, null=True, blank=True
    )
    allowed_kinds = models.JSONField(
        null=True, blank=True, help_text="Workload kinds that may be submitted; empty = any."
    )
    default_runtime_s = models.PositiveIntegerField(
        "default max runtime (s)", null=True, blank=True
    )
    max_runtime_s = models.PositiveIntegerField("max runtime (s)", null=True, blank=True)
    preemptible_classes = models.JSONField(
        null=True,
        blank=True,
        help_text="Priority classes whose workloads may be preempted; empty = inherit.",
    )
    termination_grace_s = models.PositiveIntegerField(
        "termination grace period (s)",
        null=True,
        blank=True,
        help_text="Time between SIGTERM and SIGKILL when a workload is preempted or stopped, "
        "so training can checkpoint; empty = inherit (the cluster's default).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="policy_has_exactly_one_scope",
                condition=(
                    models.Q(department__isnull=False, project__isnull=True)
                    | models.Q(department__isnull=True, project__isnull=False)
                ),
            )
        ]

    def __str__(self) -> str:
        return f"policy of {self.project or self.department}"


class CycleState(models.TextChoices):
    RUNNING = "running", "Running"
    OK = "ok", "Ok"
    FAILED = "failed", "Failed"
    ABORTED = "aborted", "Aborted"


class CycleRun(models.Model):
    """One scheduling cycle: how long it took, what it decided, and what went wrong.

    shares keeps the cycle's per-queue numbers ({queue, pool, resource, fair_share,
    allocated}) so that the queue page shows the fair shares the scheduler used.
    """

    started_at = models.DateTimeField(db_index=True)
    duration_ms = models.FloatField(default=0)
    engine_ms = models.FloatField(default=0)
    workloads = models.PositiveIntegerField(default=0)
    nodes = models.PositiveIntegerField(default=0)
    admitted = models.PositiveIntegerField(default=0)
    evicted = models.PositiveIntegerField(default=0)
    pending = models.PositiveIntegerField(default=0)
    stopped = models.PositiveIntegerField(default=0, help_text="Stopped for max runtime.")
    # A cycle that evicts nominates the work the room is for (scheduling/nominations.py);
    # the reconcile that sees the victims gone admits it, after this row was written.
    admitted_at_release = models.PositiveIntegerField(
        default=0,
        help_text="Admitted later by the reconcile that freed the GPUs this cycle placed "
        "them on (its nominations).",
    )
    ok = models.BooleanField(default=True)
    state = models.CharField(
        max_length=16, choices=CycleState.choices, default=CycleState.OK, db_index=True
    )
    # The lock token of the worker running it, so a later cycle can tell a dead one.
    holder = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    quarantined = models.PositiveIntegerField(
        default=0, help_text="Workloads failed because they cannot be turned into a request."
    )
    shares = models.JSONField(default=list, blank=True)
    # Pending workload ids in the order the engine considered them this cycle.
    pending_order = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"cycle {self.started_at:%H:%M:%S}"
