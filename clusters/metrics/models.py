"""GPU samples, allocation intervals, their roll-ups, node tokens and GPU prices.

Raw samples are append-only and written with COPY, so they carry plain integer ids rather
than foreign-key constraints: a node or workload deleted later must not block ingestion,
and retention deletes millions of rows without cascading checks. Roll-up rows store sums
(GPU-seconds), never percentages, so any grouping can add them up and divide at the end.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class GpuSample(models.Model):
    """One reading of one GPU at one instant, as the node agent (or the simulator) saw it."""

    ts = models.DateTimeField()
    node_id = models.BigIntegerField()
    gpu_index = models.PositiveSmallIntegerField()
    util_pct = models.FloatField()
    mem_used_mib = models.IntegerField(default=0)
    mem_total_mib = models.IntegerField(default=0)
    power_w = models.FloatField(null=True, blank=True)
    temp_c = models.FloatField(null=True, blank=True)
    # The workload whose process uses this GPU, when the agent could tell.
    workload_id = models.BigIntegerField(null=True, blank=True)
    pod_index = models.IntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["node_id", "gpu_index", "ts"], name="sample_gpu_ts"),
            models.Index(fields=["ts"], name="sample_ts"),
        ]


class GpuProcessSample(models.Model):
    """One process on one GPU at one instant: how much memory it held and whose it is."""

    ts = models.DateTimeField()
    node_id = models.BigIntegerField()
    gpu_index = models.PositiveSmallIntegerField()
    pid = models.IntegerField()
    used_mib = models.IntegerField(default=0)
    workload_id = models.BigIntegerField(null=True, blank=True)
    pod_index = models.IntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["workload_id", "ts"], name="procsample_workload_ts"),
            models.Index(fields=["ts"], name="procsample_ts"),
        ]


class AllocationInterval(models.Model):
    """A pod held GPUs from started_at until ended_at (open while the PodAllocation exists).

    Copied from PodAllocation rows (which are deleted on release) so that usage can be
    summed long after the pods are gone. Names are denormalised ids for fast grouping.
    """

    pod_allocation_id = models.BigIntegerField(db_index=True)
    workload_id = models.BigIntegerField(db_index=True)
    pod_index = models.IntegerField(default=0)
    project_id = models.BigIntegerField()
    department_id = models.BigIntegerField()
    user_id = models.BigIntegerField(null=True, blank=True)
    cluster_id = models.BigIntegerField(null=True, blank=True)
    node_id = models.BigIntegerField()
    pool_id = models.BigIntegerField(null=True, blank=True)
    gpu_model = models.CharField(max_length=100, blank=True)
    gpu_indices = models.JSONField(default=list, blank=True)
    # Share of each listed GPU the pod holds: 1.0 for whole GPUs, e.g. 0.5 for a fraction.
    share = models.FloatField(default=1.0)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["started_at"], name="interval_started"),
            models.Index(fields=["ended_at"], name="interval_ended"),
        ]

    @property
    def gpus(self) -> float:
        return len(self.gpu_indices) * self.share


class Resolution(models.TextChoices):
    MINUTE = "minute", "Minute"
    HOUR = "hour", "Hour"


# The GPU-second columns every usage table sums (roll-ups, reports).
USAGE_SUMS = ("allocated_s", "used_s", "idle_s", "over_quota_s")


class UsageFields(models.Model):
    """GPU-seconds in one bucket. Utilisation = used_s / allocated_s, computed at read time."""

    resolution = models.CharField(max_length=6, choices=Resolution.choices)
    bucket = models.DateTimeField()
    allocated_s = models.FloatField(default=0)
    used_s = models.FloatField(default=0)
    idle_s = models.FloatField(default=0)
    over_quota_s = models.FloatField(default=0)

    class Meta:
        abstract = True


class WorkloadUsage(UsageFields):
    workload_id = models.BigIntegerField()
    project_id = models.BigIntegerField()
    department_id = models.BigIntegerField()
    user_id = models.BigIntegerField(null=True, blank=True)
    pool_id = models.BigIntegerField(null=True, blank=True)
    cluster_id = models.BigIntegerField(null=True, blank=True)
    gpu_model = models.CharField(max_length=100, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["resolution", "bucket"], name="wusage_bucket"),
            models.Index(fields=["workload_id", "resolution", "bucket"], name="wusage_workload"),
        ]


class ProjectUsage(UsageFields):
    project_id = models.BigIntegerField()
    department_id = models.BigIntegerField()
    pool_id = models.BigIntegerField(null=True, blank=True)
    # Deserved quota * seconds in the bucket, so the quota line sums like the others.
    quota_s = models.FloatField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["resolution", "bucket"], name="pusage_bucket"),
            models.Index(fields=["project_id", "resolution", "bucket"], name="pusage_project"),
            models.Index(fields=["department_id", "resolution", "bucket"], name="pusage_dept"),
        ]


class PoolUsage(UsageFields):
    pool_id = models.BigIntegerField(null=True, blank=True)
    cluster_id = models.BigIntegerField(null=True, blank=True)
    # GPUs in the pool * seconds: the denominator of "allocated %".
    capacity_s = models.FloatField(default=0)

    class Meta:
        indexes = [models.Index(fields=["resolution", "bucket"], name="poolusage_bucket")]


class GpuUsage(models.Model):
    """Per physical GPU per bucket, for heat maps and workload charts after raw retention."""

    resolution = models.CharField(max_length=6, choices=Resolution.choices)
    bucket = models.DateTimeField()
    node_id = models.BigIntegerField()
    gpu_index = models.PositiveSmallIntegerField()
    util_sum = models.FloatField(default=0)
    util_max = models.FloatField(default=0)
    mem_used_sum = models.FloatField(default=0)
    mem_total_mib = models.IntegerField(default=0)
    samples = models.IntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["resolution", "bucket"], name="gpuusage_bucket"),
            models.Index(
                fields=["node_id", "gpu_index", "resolution", "bucket"], name="gpuusage_gpu"
            ),
        ]


class QuotaRecord(models.Model):
    """A project's or department's deserved GPUs in a node pool from `valid_from` on.

    Quota rows hold only today's value; past over-quota figures and deserved lines need the
    value in force at the time. Written when a quota changes (signals) and by each roll-up
    for changes made without signals (bulk updates). Plain ids, so history outlives owners.
    """

    PROJECT = "project"
    DEPARTMENT = "department"

    kind = models.CharField(max_length=10, choices=[(PROJECT, PROJECT), (DEPARTMENT, DEPARTMENT)])
    owner_id = models.BigIntegerField()
    pool_id = models.BigIntegerField()
    gpus = models.FloatField()
    valid_from = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["kind", "owner_id", "pool_id", "valid_from"], name="quota_hist"),
        ]


class RollupMark(models.Model):
    """How far a roll-up has got: everything before done_until is final."""

    name = models.CharField(max_length=32, unique=True)
    done_until = models.DateTimeField()


class NodeToken(models.Model):
    """A node agent's credential. Only a hash is stored; the token is shown once on issue."""

    node = models.ForeignKey("clusters.Node", on_delete=models.CASCADE, related_name="+")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… for node {self.node_id}"


class GpuPrice(models.Model):
    """What one GPU-hour of a model costs, for usage reports."""

    gpu_model = models.CharField(max_length=100, unique=True)
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    currency = models.CharField(max_length=3, default="USD")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["gpu_model"]

    def __str__(self) -> str:
        return f"{self.gpu_model}: {self.price_per_hour} {self.currency}/GPU-hour"
