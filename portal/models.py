"""The organisation: users, departments, projects, memberships, quotas and the audit log."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import AbstractUser
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from portal.tolerant import TolerantDecimalField

# A Kubernetes namespace is a DNS-1123 label: lower-case alphanumerics and '-', at most 63.
# Match it whole (re.fullmatch, or \A...\Z): `$` also matches before a trailing newline.
K8S_NAME_RE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
k8s_name_validator = RegexValidator(
    rf"\A{K8S_NAME_RE}\Z",
    "Use 1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit.",
)
non_negative = MinValueValidator(Decimal("0"))


class User(AbstractUser):
    """A person. Platform admins run the whole pool; everyone else acts through memberships."""

    email = models.EmailField("e-mail address", unique=True)
    is_platform_admin = models.BooleanField(default=False)

    class Meta:
        ordering = ["username"]

    def __str__(self) -> str:
        return self.username

    # Platform admins run the whole pool: in Django's admin they may do what a superuser
    # may (portal.admin_site lets them in; every change there is audited, portal.admin).
    def has_perm(self, perm: str, obj: object = None) -> bool:
        return (self.is_active and self.is_platform_admin) or super().has_perm(perm, obj)

    def has_module_perms(self, app_label: str) -> bool:
        return (self.is_active and self.is_platform_admin) or super().has_module_perms(app_label)


class Department(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def default_manifest_kinds() -> list[str]:
    """A new project's manifests: Pods and Jobs; its department's admins allow more."""
    return ["v1 Pod", "batch/v1 Job"]


class Project(models.Model):
    """A team's queue. Its namespace is where its pods run on every cluster."""

    department = models.ForeignKey(Department, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=63, unique=True, validators=[k8s_name_validator])
    namespace = models.CharField(max_length=63, unique=True, validators=[k8s_name_validator])
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Non-preemptible work runs only within the project's deserved quota unless a
    # platform admin allows it over quota (nothing evicts it to give borrowed GPUs back).
    nonpreemptible_over_quota = models.BooleanField(
        "non-preemptible work may go over quota", default=False
    )
    # Every pod made in the project's namespace uses GPUPool's scheduler: the namespace is
    # labelled for the pod webhook (clusters/admission.py, docs/kubernetes-native.md).
    enforce_scheduler = models.BooleanField("every pod uses GPUPool's scheduler", default=False)
    # What `gpupool submit -f` may create in the project ("apiVersion kind", among the
    # platform's GPUPOOL_MANIFEST_KINDS; clusters/manifest_submit.py).
    manifest_kinds = models.JSONField("kinds of manifests", default=default_manifest_kinds)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    DEPARTMENT_ADMIN = "department_admin", "Department admin"
    RESEARCHER = "researcher", "Researcher"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    """A department admin holds a department; researchers and viewers hold a project."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=32, choices=Role.choices)
    department = models.ForeignKey(
        Department, null=True, blank=True, on_delete=models.CASCADE, related_name="memberships"
    )
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="memberships"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="membership_scope_matches_role",
                condition=(
                    Q(role="department_admin", department__isnull=False, project__isnull=True)
                    | Q(
                        role__in=["researcher", "viewer"],
                        project__isnull=False,
                        department__isnull=True,
                    )
                ),
            ),
            models.UniqueConstraint(
                fields=["user", "project"],
                condition=Q(project__isnull=False),
                name="one_role_per_user_per_project",
            ),
            models.UniqueConstraint(
                fields=["user", "department"],
                condition=Q(department__isnull=False),
                name="one_admin_membership_per_department",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.get_role_display()} of {self.project or self.department}"


class QuotaFields(models.Model):
    """Per node pool: deserved (guaranteed) amounts, optional limits, over-quota weight.
    A text SQLite holds in one loads as its stand-in (portal.tolerant): the cycle leaves
    that row out (logged) instead of failing for everyone."""

    node_pool = models.ForeignKey("clusters.NodePool", on_delete=models.CASCADE, related_name="+")
    gpus = TolerantDecimalField(
        max_digits=9, decimal_places=2, default=0, validators=[non_negative]
    )
    gpus_limit = TolerantDecimalField(
        max_digits=9, decimal_places=2, null=True, blank=True, validators=[non_negative]
    )
    cpu = TolerantDecimalField(
        "CPU cores", max_digits=9, decimal_places=2, default=0, validators=[non_negative]
    )
    cpu_limit = TolerantDecimalField(
        max_digits=9, decimal_places=2, null=True, blank=True, validators=[non_negative]
    )
    memory_gib = TolerantDecimalField(
        "memory GiB", max_digits=11, decimal_places=2, default=0, validators=[non_negative]
    )
    memory_gib_limit = TolerantDecimalField(
        max_digits=11, decimal_places=2, null=True, blank=True, validators=[non_negative]
    )
    over_quota_weight = TolerantDecimalField(
        max_digits=9, decimal_places=2, default=1, validators=[non_negative]
    )
    over_quota_allowed = models.BooleanField(default=True)

    class Meta:
        abstract = True

    RESOURCES = ("gpus", "cpu", "memory_gib")


class DepartmentQuota(QuotaFields):
    department = models.ForeignKey(Department, on_delete=models.CASCADE, related_name="quotas")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["department", "node_pool"], name="one_quota_per_department_pool"
            )
        ]


class ProjectQuota(QuotaFields):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "node_pool"], name="one_quota_per_project_pool"
            )
        ]


class AuditLog(models.Model):
    """Who changed what, before and after. Written in the same transaction as the change."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, db_index=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    department = models.ForeignKey(
        Department, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.object_repr}"


class SshKey(models.Model):
    """A public key a user registered on their profile; put into the authorized_keys of the
    workloads they start with SSH (and of colleagues' shared ones). Parsed on the way in
    (portal.ssh_keys), so only keys sshd reads are stored."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=32)
    body = models.TextField()
    comment = models.CharField(max_length=100, blank=True)
    bits = models.PositiveIntegerField()
    fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="unique_ssh_key_name"),
            models.UniqueConstraint(fields=["user", "fingerprint"], name="unique_ssh_key"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"

    @property
    def line(self) -> str:
        return " ".join(part for part in (self.key_type, self.body, self.comment) if part)


class DemoSeed(models.Model):
    """A demo seeder (`manage.py seed_demo`) that has run on this database: it seeds once,
    so what admins renamed or deleted since is neither recreated nor in the way."""

    name = models.CharField(max_length=100, unique=True)
    seeded_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    """A named single-flight lock when there is no Redis (portal.leases): claimed by a
    conditional update, held for a short time and renewed by its holder while it works, so
    that two workers never both hold it and a holder killed outright frees it soon."""

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=64, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"lease {self.name}"
