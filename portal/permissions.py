"""Who may see or change what. Every page and endpoint asks these, never ad-hoc checks.

Roles: a platform admin may do everything; a department admin administers the projects
of their departments; a researcher submits work to their projects; a viewer only looks.
"""

from __future__ import annotations

from functools import wraps
from typing import TYPE_CHECKING, Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet

from portal.models import Department, Membership, Project, Role

if TYPE_CHECKING:
    from collections.abc import Callable

    from portal.models import User


def is_platform_admin(user: Any) -> bool:
    return bool(
        user.is_authenticated and user.is_active and (user.is_platform_admin or user.is_superuser)
    )


def administered_department_ids(user: Any) -> set[int]:
    if not user.is_authenticated:
        return set()
    return set(
        Membership.objects.filter(user=user, role=Role.DEPARTMENT_ADMIN).values_list(
            "department_id", flat=True
        )
    )


def is_admin(user: Any) -> bool:
    """A platform admin or the admin of at least one department."""
    return is_platform_admin(user) or bool(administered_department_ids(user))


def departments_for_admin(user: User) -> QuerySet[Department]:
    if is_platform_admin(user):
        return Department.objects.all()
    return Department.objects.filter(id__in=administered_department_ids(user))


def visible_projects(user: Any) -> QuerySet[Project]:
    """Projects a user may look at: all for platform admins, their departments', their own."""
    if not user.is_authenticated:
        return Project.objects.none()
    if is_platform_admin(user):
        return Project.objects.all()
    return Project.objects.filter(
        Q(department_id__in=administered_department_ids(user)) | Q(memberships__user=user)
    ).distinct()


def submittable_projects(user: Any) -> QuerySet[Project]:
    """Projects a user may submit work to: researchers of the project and its admins."""
    if not user.is_authenticated:
        return Project.objects.none()
    if is_platform_admin(user):
        return Project.objects.all()
    return Project.objects.filter(
        Q(department_id__in=administered_department_ids(user))
        | Q(memberships__user=user, memberships__role=Role.RESEARCHER)
    ).distinct()


def can_admin_department(user: Any, department: Department) -> bool:
    return is_platform_admin(user) or department.id in administered_department_ids(user)


def can_admin_project(user: Any, project: Project) -> bool:
    return can_admin_department(user, project.department)


def can_view_department(user: Any, department: Department) -> bool:
    """Its admins, and anyone who may look at one of its projects."""
    return (
        can_admin_department(user, department)
        or visible_projects(user).filter(department=department).exists()
    )


def can_view_project(user: Any, project: Project) -> bool:
    return visible_projects(user).filter(pk=project.pk).exists()


def can_submit_to_project(user: Any, project: Project) -> bool:
    return submittable_projects(user).filter(pk=project.pk).exists()


def can_manage_user(actor: Any, user: User) -> bool:
    """Platform admins manage everyone; a department admin, people wholly inside their
    departments (so they cannot lock someone out of another department's work)."""
    if is_platform_admin(actor):
        return True
    if is_platform_admin(user) or actor.pk == user.pk:
        return False
    mine = administered_department_ids(actor)
    if not mine:
        return False
    memberships = user.memberships.select_related("project")
    scopes = {m.department_id or m.project.department_id for m in memberships}
    return bool(scopes) and scopes <= mine


def admin_required(view: Callable[..., Any]) -> Callable[..., Any]:
    """Platform or department admins only; anonymous users go to the login page."""

    @login_required
    @wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_admin(request.user):
            raise PermissionDenied("Only administrators may open this page.")
        return view(request, *args, **kwargs)

    return wrapper


def platform_admin_required(view: Callable[..., Any]) -> Callable[..., Any]:
    @login_required
    @wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_platform_admin(request.user):
            raise PermissionDenied("Only platform administrators may open this page.")
        return view(request, *args, **kwargs)

    return wrapper
