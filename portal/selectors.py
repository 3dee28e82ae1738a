"""Reads for the organisation's pages and API, each already cut to what the user may see."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from clusters.models import Gpu, NodePool
from portal.models import (
    AuditLog,
    Department,
    DepartmentQuota,
    Membership,
    Project,
    ProjectQuota,
    Role,
    SshKey,
    User,
)
from portal.permissions import (
    administered_department_ids,
    departments_for_admin,
    is_admin,
    is_platform_admin,
    visible_projects,
)
from scheduling.bounds import query_id


def project_named(projects: QuerySet[Project], value: Any) -> QuerySet[Project]:
    """The project called `value`, else the one with that id: a name may be all digits
    (a valid namespace name), and then it wins over another project's id."""
    text = str(value)
    if not text.isdigit():
        return projects.filter(name=text)
    by_name = projects.filter(name=text)
    if by_name.exists():
        return by_name
    pk = query_id(text)  # an id no row can have (too many digits) matches nothing
    return projects.filter(pk=pk) if pk else projects.none()


def project_list_for_user(user: Any) -> QuerySet[Project]:
    """The projects a user may see, with department and member counts."""
    return (
        Project.objects.filter(pk__in=visible_projects(user).values("pk"))
        .select_related("department")
        .annotate(member_count=Count("memberships", distinct=True))
        .order_by("department__name", "name")
    )


def department_list_for_user(user: Any) -> QuerySet[Department]:
    """Admins see the departments they administer; others, those of their projects."""
    if is_admin(user):
        departments = departments_for_admin(user)
    else:
        departments = Department.objects.filter(projects__in=visible_projects(user)).distinct()
    # Annotated (GROUP BY) queries ignore Meta.ordering: order explicitly.
    return (
        Department.objects.filter(pk__in=departments.values("pk"))
        .annotate(project_count=Count("projects", distinct=True))
        .order_by("name")
    )


@dataclass(frozen=True)
class QuotaRow:
    """One node pool's line of a quota table; `quota` is None where nothing is set."""

    pool: NodePool
    quota: Any


def quota_table(owner: Department | Project) -> list[QuotaRow]:
    """Every node pool, with the owner's quota in it (or None)."""
    quotas = {q.node_pool_id: q for q in owner.quotas.all()}
    return [QuotaRow(pool, quotas.get(pool.pk)) for pool in NodePool.objects.order_by("name")]


def quota_overview(projects: QuerySet[Project]) -> list[dict[str, Any]]:
    """Per visible project: its quota rows that deserve or allow anything."""
    projects = projects.prefetch_related("quotas__node_pool")
    return [
        {"project": project, "quotas": sorted(project.quotas.all(), key=lambda q: q.node_pool.name)}
        for project in projects
    ]


def user_list_for_admin(actor: Any) -> QuerySet[User]:
    """Platform admins see everyone; department admins, the people of their departments."""
    users = User.objects.all()
    if not is_platform_admin(actor):
        mine = administered_department_ids(actor)
        users = users.filter(
            Q(memberships__department_id__in=mine) | Q(memberships__project__department_id__in=mine)
        ).distinct()
    memberships = Membership.objects.select_related("project", "department")
    return User.objects.filter(pk__in=users.values("pk")).prefetch_related(
        Prefetch("memberships", queryset=memberships)
    )


def memberships_visible_to(actor: Any, user: User) -> QuerySet[Membership]:
    """A user's memberships that the actor may see (and so manage)."""
    memberships = user.memberships.select_related("project__department", "department")
    if is_platform_admin(actor):
        return memberships
    mine = administered_department_ids(actor)
    return memberships.filter(Q(department_id__in=mine) | Q(project__department_id__in=mine))


# --- Audit log --------------------------------------------------------------------------------


def audit_log_for_user(actor: Any) -> QuerySet[AuditLog]:
    """Platform admins read everything; department admins, their departments' rows."""
    rows = AuditLog.objects.select_related("actor", "department")
    if is_platform_admin(actor):
        return rows
    return rows.filter(department_id__in=administered_department_ids(actor))


def audit_log_filter(rows: QuerySet[AuditLog], filters: dict[str, Any]) -> QuerySet[AuditLog]:
    """Apply the audit page's filters (each optional): actor, action, object_type,
    department, since and until (dates, inclusive)."""
    if filters.get("actor"):
        rows = rows.filter(actor__username__iexact=filters["actor"])
    if filters.get("action"):
        rows = rows.filter(action=filters["action"])
    if filters.get("object_type"):
        rows = rows.filter(object_type=filters["object_type"])
    if filters.get("department"):
        rows = rows.filter(department=filters["department"])
    if filters.get("since"):
        rows = rows.filter(created_at__gte=_day_start(filters["since"]))
    if filters.get("until"):
        rows = rows.filter(created_at__lt=_day_start(filters["until"]) + timedelta(days=1))
    return rows


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def audit_choices(rows: QuerySet[AuditLog]) -> dict[str, list[str]]:
    """The distinct actions and object types, for the filter drop-downs."""
    distinct = rows.order_by()
    return {
        "actions": list(distinct.values_list("action", flat=True).distinct().order_by("action")),
        "object_types": list(
            distinct.values_list("object_type", flat=True).distinct().order_by("object_type")
        ),
    }


def ssh_authorized_keys(*, owner_id: int, project_id: int, shared: bool) -> list[str]:
    """The authorized_keys lines of a workload started with SSH: its owner's keys, and when
    it is shared with its project, the keys of the project's researchers (the same people
    the proxy lets in: viewers look at pages, they do not run code). Active users only."""
    users = Q(user_id=owner_id)
    if shared:
        researchers = Membership.objects.filter(project_id=project_id, role=Role.RESEARCHER)
        users |= Q(user_id__in=researchers.values("user_id"))
    keys = SshKey.objects.filter(users, user__is_active=True).order_by("user_id", "id")
    return [key.line for key in keys]


# --- Capacity against guarantees -------------------------------------------------------------


@dataclass(frozen=True)
class PoolCapacity:
    """One node pool: the GPUs its nodes carry and what departments and projects are
    guaranteed there in total. Over-committed when a total passes the GPUs."""

    pool: NodePool
    gpus: int
    departments: Decimal
    projects: Decimal

    @property
    def over_committed(self) -> bool:
        return max(self.departments, self.projects) > self.gpus

    @property
    def guaranteed(self) -> Decimal:
        """The larger total: departments' guarantees, or projects' where those exceed them."""
        return max(self.departments, self.projects)

    @property
    def shortfall(self) -> Decimal:
        return max(self.guaranteed - self.gpus, Decimal(0))


def pool_capacity() -> list[PoolCapacity]:
    """Every node pool with its GPUs (nodes of enabled clusters) and the GPUs guaranteed in
    it to departments and to projects: three grouped queries and the pools, whatever their
    number."""
    gpus = dict(
        Gpu.objects.filter(node__pool__isnull=False, node__cluster__enabled=True)
        .values_list("node__pool")
        .annotate(n=Count("pk"))
        .order_by()
    )

    def guaranteed(model: Any) -> dict[int, Decimal]:
        rows = model.objects.values_list("node_pool").annotate(total=Sum("gpus")).order_by()
        return {pool: Decimal(total or 0) for pool, total in rows}

    departments, projects = guaranteed(DepartmentQuota), guaranteed(ProjectQuota)
    return [
        PoolCapacity(
            pool,
            gpus.get(pool.pk, 0),
            departments.get(pool.pk, Decimal(0)),
            projects.get(pool.pk, Decimal(0)),
        )
        for pool in NodePool.objects.order_by("name")
    ]
