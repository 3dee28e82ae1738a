"""Departments, projects and node pools: create, update, delete."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from clusters.manifest_kinds import platform_kinds
from clusters.models import Cluster, NodePool, PlacementStrategy
from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed
from portal.models import K8S_NAME_RE, Department, Project, default_manifest_kinds
from portal.permissions import can_admin_department, is_platform_admin
from portal.services.common import create_audited, raise_if, require, save_audited
from scheduling.models import Workload

# Work in these states holds or is about to hold GPUs: its project may not disappear.
BLOCKING_STATES = ("pending", "admitted", "running", "preempted")


# --- Departments ------------------------------------------------------------------------------


def _department_errors(name: str, exclude_id: int | None = None) -> dict[str, list[str]]:
    if not name.strip():
        return {"name": ["Enter a name."]}
    clash = Department.objects.filter(name__iexact=name.strip()).exclude(pk=exclude_id)
    return {"name": [f"A department named {name.strip()} exists already."]} if clash else {}


@transaction.atomic
def department_create(*, actor: Any, name: str, description: str = "") -> Department:
    require(is_platform_admin(actor), "Only platform administrators create departments.")
    raise_if(_department_errors(name))
    department = Department.objects.create(name=name.strip(), description=description)
    audit_log(
        actor=actor,
        action="department.create",
        obj=department,
        after=snapshot(department),
        department=department,
    )
    return department


@transaction.atomic
def department_update(
    *, actor: Any, department: Department, name: str, description: str = ""
) -> Department:
    require(can_admin_department(actor, department), "You do not administer this department.")
    raise_if(_department_errors(name, exclude_id=department.pk))
    changes = {"name": name.strip(), "description": description}
    save_audited(
        department, changes, actor=actor, action="department.update", department=department
    )
    return department


@transaction.atomic
def department_delete(*, actor: Any, department: Department) -> None:
    require(is_platform_admin(actor), "Only platform administrators delete departments.")
    names = list(department.projects.values_list("name", flat=True))
    if names:
        raise ValidationFailed(
            f"{department.name} still has projects ({', '.join(names)}): delete or move them first."
        )
    audit_log(actor=actor, action="department.delete", obj=department, before=snapshot(department))
    department.delete()


# --- Projects ---------------------------------------------------------------------------------


def default_namespace(name: str) -> str:
    """A DNS-1123 label derived from a project's name: 'ML Vision!' -> 'gpupool-ml-vision'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"gpupool-{slug}"[:63].rstrip("-")


# Kubernetes' own namespaces, and the one where the Kubernetes backend keeps its reservation
# pods (clusters/backends/kubernetes, `system_namespace`): a project must not run in these.
RESERVED_NAMESPACES = ("default", "gpupool-system")


def _reserved(namespace: str) -> bool:
    return namespace in RESERVED_NAMESPACES or namespace.startswith("kube-")


def _project_errors(name: str, namespace: str, exclude_id: int | None) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    rule = "Use 1 to 63 lower-case letters, digits or '-', starting and ending with one of those."
    others = Project.objects.exclude(pk=exclude_id)
    if not re.fullmatch(K8S_NAME_RE, name):
        errors["name"] = [f"{name!r} is not a valid name. {rule}"]
    elif others.filter(name=name).exists():
        errors["name"] = [f"A project named {name} exists already."]
    if not re.fullmatch(K8S_NAME_RE, namespace):
        errors["namespace"] = [f"{namespace!r} is not a valid Kubernetes namespace. {rule}"]
    elif _reserved(namespace):
        errors["namespace"] = [
            f"Namespace {namespace} is reserved for Kubernetes or GPUPool itself; choose another."
        ]
    elif others.filter(namespace=namespace).exists():
        owner = others.get(namespace=namespace)
        errors["namespace"] = [f"Namespace {namespace} is taken by project {owner.name}."]
    return errors


@transaction.atomic
def project_create(
    *,
    actor: Any,
    department: Department,
    name: str,
    namespace: str = "",
    description: str = "",
    nonpreemptible_over_quota: bool = False,
    enforce_scheduler: bool = False,
    manifest_kinds: list[str] | None = None,
) -> Project:
    require(can_admin_department(actor, department), "You do not administer this department.")
    name = name.strip()
    namespace = namespace.strip() or default_namespace(name)
    errors = _project_errors(name, namespace, exclude_id=None)
    _check_over_quota_flag(actor, False, nonpreemptible_over_quota, errors)
    kinds = _manifest_kinds(manifest_kinds, default_manifest_kinds(), errors)
    raise_if(errors)
    values = {"department": department, "name": name, "namespace": namespace}
    values["manifest_kinds"] = kinds
    values["description"] = description
    values["nonpreemptible_over_quota"] = nonpreemptible_over_quota
    values["enforce_scheduler"] = enforce_scheduler
    _label_namespaces_on_commit(enforce_scheduler)
    return create_audited(
        Project, values, actor=actor, action="project.create", department=department
    )


@transaction.atomic
def project_update(
    *,
    actor: Any,
    project: Project,
    name: str,
    namespace: str = "",
    description: str = "",
    nonpreemptible_over_quota: bool | None = None,
    enforce_scheduler: bool | None = None,
    manifest_kinds: list[str] | None = None,
) -> Project:
    require(can_admin_department(actor, project.department), "You do not administer it.")
    name = name.strip()
    namespace = namespace.strip() or default_namespace(name)
    errors = _project_errors(name, namespace, exclude_id=project.pk)
    if nonpreemptible_over_quota is None:
        nonpreemptible_over_quota = project.nonpreemptible_over_quota
    flag = project.nonpreemptible_over_quota
    _check_over_quota_flag(actor, flag, nonpreemptible_over_quota, errors)
    kinds = _manifest_kinds(manifest_kinds, project.manifest_kinds, errors)
    if namespace != project.namespace and "namespace" not in errors:
        # Its pods and services live in the old namespace: they would be left behind there.
        active = _active_work(project)
        if active:
            errors["namespace"] = [
                f"{project.name} has {active}; its namespace can change once they have stopped."
            ]
    raise_if(errors)
    changes = {"name": name, "namespace": namespace, "description": description}
    changes["nonpreemptible_over_quota"] = nonpreemptible_over_quota
    if enforce_scheduler is None:
        enforce_scheduler = project.enforce_scheduler
    changes["enforce_scheduler"] = enforce_scheduler
    changes["manifest_kinds"] = kinds
    _label_namespaces_on_commit(
        enforce_scheduler != project.enforce_scheduler or namespace != project.namespace
    )
    save_audited(
        project, changes, actor=actor, action="project.update", department=project.department
    )
    return project


def _label_namespaces_on_commit(changed: bool) -> None:
    """The pod webhook acts on labelled namespaces (clusters/enforcement.py): label them on
    commit, not only at the next inventory sync."""
    if changed:
        from clusters.tasks import sync_enforcement_soon  # noqa: PLC0415 - tasks import portal

        sync_enforcement_soon()


def _manifest_kinds(
    given: list[str] | None, current: list[str], errors: dict[str, list[str]]
) -> list[str]:
    """The kinds of manifests a project allows: among the platform admin's
    GPUPOOL_MANIFEST_KINDS, in its order; None keeps `current`."""
    if given is None:
        return current
    platform = platform_kinds()
    unknown = [str(kind)[:120] for kind in given if kind not in platform]
    if unknown:
        errors["manifest_kinds"] = [
            f"{', '.join(unknown[:5])}: not a kind the platform allows; choose among "
            f"{', '.join(platform) or 'none'}."
        ]
    return [kind for kind in platform if kind in given]


def _check_over_quota_flag(actor: Any, old: bool, new: bool, errors: dict[str, list[str]]) -> None:
    """Only a platform admin may change whether a project's non-preemptible work may go over
    quota: it holds GPUs of other departments that nothing can take back."""
    if new != old and not is_platform_admin(actor):
        errors["nonpreemptible_over_quota"] = [
            "Only a platform admin may allow non-preemptible work over quota."
        ]


def _active_work(project: Project) -> str:
    """'2 workload(s) pending or running (a, b)', or '' when the project has none."""
    active = Workload.objects.filter(project=project, state__in=BLOCKING_STATES)
    names = list(active.order_by("name").values_list("name", flat=True))
    if not names:
        return ""
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f"{len(names)} workload(s) pending or running ({shown})"


@transaction.atomic
def project_delete(*, actor: Any, project: Project) -> None:
    require(can_admin_department(actor, project.department), "You do not administer it.")
    active = _active_work(project)
    if active:
        raise ValidationFailed(
            f"{project.name} has {active}; stop them before deleting the project."
        )
    audit_log(
        actor=actor,
        action="project.delete",
        obj=project,
        before=snapshot(project),
        department=project.department,
    )
    try:
        # Finished workloads go with their project; anything else that still points at it
        # (kept for reports) makes the delete refuse instead of orphaning rows.
        Workload.objects.filter(project=project).delete()
        project.delete()
    except ProtectedError as exc:
        raise ValidationFailed(f"{project.name} is still referenced: {exc.args[0]}") from None


# --- Node pools -------------------------------------------------------------------------------


def _node_pool_errors(values: Mapping[str, Any], exclude_id: int | None) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    name = values.get("name", "")
    if not re.fullmatch(K8S_NAME_RE, name):
        errors["name"] = ["Use lower-case letters, digits and '-' (a Kubernetes label value)."]
    elif NodePool.objects.filter(name=name).exclude(pk=exclude_id).exists():
        errors["name"] = [f"A node pool named {name} exists already."]
    if values.get("placement", PlacementStrategy.BINPACK) not in PlacementStrategy.values:
        errors["placement"] = [f"Choose one of: {', '.join(PlacementStrategy.values)}."]
    cluster = values.get("cluster")
    if cluster is not None and not isinstance(cluster, Cluster):
        errors["cluster"] = ["Choose a cluster."]
    return errors


POOL_FIELDS = ("name", "cluster", "label_value", "placement", "description")


@transaction.atomic
def node_pool_create(*, actor: Any, **values: Any) -> NodePool:
    require(is_platform_admin(actor), "Only platform administrators manage node pools.")
    values = {k: v for k, v in values.items() if k in POOL_FIELDS}
    raise_if(_node_pool_errors(values, exclude_id=None))
    return create_audited(NodePool, values, actor=actor, action="node_pool.create")


@transaction.atomic
def node_pool_update(*, actor: Any, pool: NodePool, **values: Any) -> NodePool:
    require(is_platform_admin(actor), "Only platform administrators manage node pools.")
    merged = {f: getattr(pool, f) for f in POOL_FIELDS} | {
        k: v for k, v in values.items() if k in POOL_FIELDS
    }
    raise_if(_node_pool_errors(merged, exclude_id=pool.pk))
    save_audited(pool, merged, actor=actor, action="node_pool.update")
    return pool
