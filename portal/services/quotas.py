"""Quota writes: the whole table of a department or project, per node pool, in one go."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.db import transaction

from clusters.models import NodePool
from portal import quota_rules
from portal.audit import audit_log, snapshot
from portal.models import Department, DepartmentQuota, Project, ProjectQuota
from portal.permissions import can_admin_department, is_platform_admin
from portal.services.common import raise_if, require

# --- Quotas -----------------------------------------------------------------------------------


def _table_errors(
    table: Mapping[NodePool, Mapping[str, Any]],
) -> tuple[dict[NodePool, dict[str, Any]], dict[str, list[str]]]:
    """Normalise every row and check each on its own; errors are keyed '<pool>.<field>'."""
    rows: dict[NodePool, dict[str, Any]] = {}
    errors: dict[str, list[str]] = {}
    for pool, values in table.items():
        row, row_errs = quota_rules.normalise_row(values)
        row_errs.update(quota_rules.row_errors(row))
        errors.update({f"{pool.name}.{field}": msgs for field, msgs in row_errs.items()})
        rows[pool] = row
    return rows, errors


def _department_quota_errors(
    department: Department, rows: Mapping[NodePool, Mapping[str, Any]]
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for pool, row in rows.items():
        quotas = ProjectQuota.objects.filter(project__department=department, node_pool=pool)
        for resource in quota_rules.RESOURCES:
            projects = {q.project.name: getattr(q, resource) for q in quotas.select_related()}
            message = quota_rules.department_below_projects(
                department=department.name,
                pool=pool.name,
                resource=resource,
                asked=row[resource],
                projects=projects,
            )
            if message:
                errors[f"{pool.name}.{resource}"] = [message]
    return errors


def _project_quota_errors(
    project: Project, rows: Mapping[NodePool, Mapping[str, Any]]
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    department = project.department
    for pool, row in rows.items():
        parent = DepartmentQuota.objects.filter(department=department, node_pool=pool).first()
        siblings = ProjectQuota.objects.filter(project__department=department, node_pool=pool)
        siblings = siblings.exclude(project=project).select_related("project")
        for resource in quota_rules.RESOURCES:
            message = quota_rules.project_over_department(
                project=project.name,
                department=department.name,
                pool=pool.name,
                resource=resource,
                asked=row[resource],
                department_value=getattr(parent, resource) if parent else Decimal(0),
                siblings={q.project.name: getattr(q, resource) for q in siblings},
            )
            if message:
                errors[f"{pool.name}.{resource}"] = [message]
    return errors


@transaction.atomic
def quota_set(
    *, actor: Any, owner: Department | Project, table: Mapping[NodePool, Mapping[str, Any]]
) -> None:
    """Set the quota rows of a department or project, one per node pool, all or nothing.

    1. Check the actor may: platform admins for departments, department admins for projects.
    2. Check each row alone (no negatives, limit ≥ deserved), then against the hierarchy.
    3. Write every row and one audit entry holding the whole table before and after.
    """
    is_department = isinstance(owner, Department)
    department = owner if isinstance(owner, Department) else owner.department
    if is_department:
        require(is_platform_admin(actor), "Only platform administrators set department quotas.")
    else:
        require(can_admin_department(actor, department), "You do not administer this project.")
    # Lock the department row so two concurrent edits cannot both pass the sum checks.
    Department.objects.select_for_update().filter(pk=department.pk).first()
    rows, errors = _table_errors(table)
    raise_if(errors)
    if is_department:
        raise_if(_department_quota_errors(department, rows))
    else:
        raise_if(_project_quota_errors(owner, rows))  # type: ignore[arg-type]
    model, key = (DepartmentQuota, "department") if is_department else (ProjectQuota, "project")
    before = {q.node_pool.name: _quota_dict(q) for q in owner.quotas.select_related("node_pool")}
    for pool, row in rows.items():
        model.objects.update_or_create(**{key: owner, "node_pool": pool}, defaults=row)
    after = {q.node_pool.name: _quota_dict(q) for q in owner.quotas.select_related("node_pool")}
    action = "department_quota.set" if is_department else "project_quota.set"
    audit_log(
        actor=actor, action=action, obj=owner, before=before, after=after, department=department
    )


def _quota_dict(quota: DepartmentQuota | ProjectQuota) -> dict[str, Any]:
    return snapshot(quota, fields=list(quota_rules.DEFAULTS))
