"""Environments and templates researchers launch from, the workspace beside its workload,
and the idle-culling policy."""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import Q

from portal.models import Department, Project, non_negative
from portal.tolerant import (
    INT32_MAX,
    TolerantDecimalField,
    in_range,
    tolerant_count,
    tolerant_datetime,
)

GPUS_MAX, CPU_MAX = Decimal("999.999"), Decimal("99999.99")  # what the decimal columns hold


class ToolKind(models.TextChoices):
    JUPYTERLAB = "jupyterlab", "JupyterLab"
    VSCODE = "vscode", "VS Code server"
    TENSORBOARD = "tensorboard", "TensorBoard"
    # No web tool: an SSH server with the owner's keys (clusters.backends.sshd), for a
    # terminal, PyCharm or VS Code Remote-SSH through `gpupool ssh`.
    SSH = "ssh", "SSH server"


class Environment(models.Model):
    """An admin-defined image and the web tool it serves, shown as a card on the launch form."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    image = models.CharField(max_length=300)
    # The tool's executable and fixed arguments; the portal appends base URL, port and token.
    command = models.JSONField(default=list)
    port = tolerant_count(models.PositiveIntegerField(default=8888))
    tool_kind = models.CharField(
        max_length=16, choices=ToolKind.choices, default=ToolKind.JUPYTERLAB
    )
    # A text SQLite holds in a number (another writer's) loads as its stand-in
    # (portal.tolerant): the pages answer, and a launch of it is refused naming the field.
    default_gpus = TolerantDecimalField(
        max_digits=6, decimal_places=3, default=0, validators=[non_negative]
    )
    default_cpu = TolerantDecimalField(
        max_digits=7, decimal_places=2, default=Decimal("1"), validators=[non_negative]
    )
    default_memory_mib = tolerant_count(models.PositiveIntegerField(default=4096))
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            in_range("environment", "port", 1, 65535),
            in_range("environment", "default_gpus", 0, GPUS_MAX),
            in_range("environment", "default_cpu", 0, CPU_MAX),
            in_range("environment", "default_memory_mib", 0, INT32_MAX),
        ]

    def __str__(self) -> str:
        return self.name


class WorkspaceTemplate(models.Model):
    """A project's preset: an environment with resources, so a launch is one click."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="ws_templates")
    name = models.CharField(max_length=100)
    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="+")
    gpu_request = models.CharField(max_length=16, default="whole")
    gpus = TolerantDecimalField(max_digits=6, decimal_places=3, default=0)
    gpu_memory_mib = tolerant_count(models.PositiveIntegerField(default=0))
    cpu = TolerantDecimalField(max_digits=7, decimal_places=2, default=Decimal("1"))
    memory_mib = tolerant_count(models.PositiveIntegerField(default=4096))
    node_pool = models.ForeignKey(
        "clusters.NodePool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["project_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_ws_template_name"),
            in_range("template", "gpus", 0, GPUS_MAX),
            in_range("template", "cpu", 0, CPU_MAX),
            in_range("template", "gpu_memory_mib", 0, INT32_MAX),
            in_range("template", "memory_mib", 0, INT32_MAX),
        ]

    def __str__(self) -> str:
        return f"{self.project.name}/{self.name}"


class IdleState(models.TextChoices):
    ACTIVE = "active", "Active"
    WARNED = "warned", "Warned: idle"
    CULLED = "culled", "Stopped for being idle"


class Workspace(models.Model):
    """The interactive side of a workload of kind workspace. Shares the workload's id."""

    workload = models.OneToOneField(
        "scheduling.Workload", primary_key=True, on_delete=models.CASCADE, related_name="workspace"
    )
    environment = models.ForeignKey(
        Environment, null=True, on_delete=models.SET_NULL, related_name="workspaces"
    )
    # The tool's own secret: only the proxy and the culler use it, never a page or the API.
    token = models.CharField(max_length=128)
    shared_with_project = models.BooleanField(default=False)
    data_volume = models.CharField(max_length=500, blank=True)
    idle_state = models.CharField(max_length=16, choices=IdleState.choices, default="active")
    # A text SQLite holds in a date loads as its stand-in (portal.tolerant): culling leaves
    # the workspace alone (no clock to judge it by) and says so in the log.
    last_activity_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    warned_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    kept_alive_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    checked_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))
    answered_at = tolerant_datetime(models.DateTimeField(null=True, blank=True))  # tool answered

    def __str__(self) -> str:
        return str(self.workload)

    @property
    def id(self) -> int:
        return self.workload_id

    @property
    def lab_url(self) -> str:
        """Its web tool's link; none for an SSH server (reached with `gpupool ssh`)."""
        if self.environment is not None and self.environment.tool_kind == ToolKind.SSH:
            return ""
        return f"/workspaces/{self.workload_id}/lab/"


class IdlePolicy(models.Model):
    """When an idle workspace is warned and stopped. The project's policy wins over its
    department's, which wins over the platform-wide one (neither department nor project)."""

    department = models.OneToOneField(
        Department, null=True, blank=True, on_delete=models.CASCADE, related_name="idle_policy"
    )
    project = models.OneToOneField(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="idle_policy"
    )
    # A text SQLite holds in one (another writer's) loads as its stand-in (portal.tolerant):
    # culling by this policy stops, saying why, rather than stopping workspaces at once.
    warn_after_min = tolerant_count(models.PositiveIntegerField(default=60))
    stop_after_min = tolerant_count(models.PositiveIntegerField(default=120))
    gpu_util_threshold_pct = tolerant_count(models.PositiveIntegerField(default=5))

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="idle_policy_one_scope",
                condition=~Q(department__isnull=False, project__isnull=False),
            ),
            models.CheckConstraint(
                name="idle_policy_warns_before_stopping",
                condition=Q(warn_after_min__lte=models.F("stop_after_min")),
            ),
            in_range("idle_policy", "warn_after_min", 0, INT32_MAX),
            in_range("idle_policy", "stop_after_min", 0, INT32_MAX),
            in_range("idle_policy", "gpu_util_threshold_pct", 0, 100),
        ]

    def __str__(self) -> str:
        scope = self.project or self.department or "platform"
        return f"idle policy of {scope}: warn {self.warn_after_min}m, stop {self.stop_after_min}m"
