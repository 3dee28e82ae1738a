"""Reads of the workspaces app: who may see, open or manage a workspace; where it answers."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from clusters.backends import pod_name
from clusters.metrics.models import GpuSample
from clusters.models import Backend, NodePool
from portal.models import Membership, Project, Role
from portal.permissions import can_admin_project, can_view_project, visible_projects
from scheduling.models import ACTIVE_STATES, Workload, WorkloadState
from scheduling.policies import effective_policies
from scheduling.stored import addresses_problem
from workspaces.models import Environment, IdlePolicy, Workspace, WorkspaceTemplate


def workspace_list_for_user(user: Any) -> QuerySet[Workspace]:
    return (
        Workspace.objects.filter(workload__project__in=visible_projects(user))
        .select_related("workload", "workload__project", "workload__submitted_by", "environment")
        .order_by("-workload__created_at", "-workload_id")
    )


def workspace_get(workspace_id: int) -> Workspace | None:
    return (
        Workspace.objects.select_related(
            "workload", "workload__project__department", "workload__submitted_by", "environment"
        )
        # Through the workload's id: an id past the database's integer range finds nothing
        # (Django checks the range on integer fields, not on a one-to-one key).
        .filter(workload__id=workspace_id)
        .first()
    )


def can_view_workspace(user: Any, workspace: Workspace) -> bool:
    return can_view_project(user, workspace.workload.project)


def can_open_workspace(user: Any, workspace: Workspace) -> bool:
    """The tool itself: its owner, or the project's members when the owner shares it.

    Deliberately narrower than viewing: the tool is a shell on the owner's data, so
    administrators do not pass unless they are members of a shared workspace's project.
    An owner who left the project (membership removed) no longer passes either: the tool
    is a shell on the project's data and GPUs.
    """
    return _can_open(user, workspace.workload, shared=workspace.shared_with_project)


def can_open_workload(user: Any, workload: Workload) -> bool:
    """A workload's ports and SSH server: the same rule as a workspace's tool (above); a
    workload that is not a workspace is never shared, so only its owner passes."""
    shared = Workspace.objects.filter(workload=workload, shared_with_project=True).exists()
    return _can_open(user, workload, shared=shared)


def _can_open(user: Any, workload: Workload, *, shared: bool) -> bool:
    if not (user.is_authenticated and user.is_active):
        return False
    if user.pk == workload.submitted_by_id:
        return can_view_project(user, workload.project)
    # Shared with the project's researchers: a viewer may look at the page, not run code.
    members = Membership.objects.filter(
        user=user, project_id=workload.project_id, role=Role.RESEARCHER
    )
    return shared and members.exists()


def workload_get(workload_id: int) -> Workload | None:
    return (
        Workload.objects.select_related("project__department", "submitted_by")
        .filter(id=workload_id)
        .first()
    )


def workload_port(workload: Workload, name: str) -> dict[str, Any] | None:
    """The port the workload declared under `name`, or None."""
    return next((p for p in (workload.spec or {}).get("ports", []) if p.get("name") == name), None)


def workload_port_upstream(workload: Workload, name: str) -> str | None:
    """host:port where the workload's port `name` answers (its first pod's), or None while
    it does not run. As the backend reported it; on Kubernetes, without a report yet, the
    pod's Service."""
    port = workload_port(workload, name)
    if port is None or workload.state not in ACTIVE_STATES:
        return None
    allocation = workload.allocations.select_related("node__cluster").order_by("pod_index").first()
    if allocation is None:
        return None
    if addresses_problem(allocation.ports):  # another writer's; the cycle fails the workload
        return None
    if allocation.ports.get(name):
        return str(allocation.ports[name])
    if allocation.node.cluster.backend == Backend.KUBERNETES:
        return f"{_service(workload, allocation)}:{port['port']}"
    return None


def _service(workload: Workload, allocation: Any) -> str:
    """The DNS name of the Service the backend gives a pod with ports: named after the pod,
    as the cluster knows it."""
    # Imported here: the package imports `kubernetes`, which only Kubernetes clusters need.
    from clusters.backends.kubernetes.ownership import owner_of  # noqa: PLC0415

    name = owner_of(allocation.node.cluster).object_name(
        pod_name(workload.id, allocation.pod_index)
    )
    return f"{name}.{workload.project.namespace}.svc"


def can_manage_workspace(user: Any, workspace: Workspace) -> bool:
    """Stop it or keep it running: the owner and the project's administrators."""
    if not user.is_authenticated:
        return False
    if user.pk == workspace.workload.submitted_by_id:
        return True
    return can_admin_project(user, workspace.workload.project)


def environment_list() -> QuerySet[Environment]:
    return Environment.objects.filter(enabled=True).order_by("name")


def template_list_for_projects(projects: QuerySet[Project]) -> QuerySet[WorkspaceTemplate]:
    return WorkspaceTemplate.objects.filter(project__in=projects).select_related(
        "environment", "project", "node_pool"
    )


def idle_policy_for(project: Project) -> IdlePolicy | None:
    """The project's policy, else its department's, else the platform-wide one, else none."""
    policies = IdlePolicy.objects.filter(project=project) or IdlePolicy.objects.filter(
        department_id=project.department_id
    )
    if policies:
        return policies[0]
    return IdlePolicy.objects.filter(project__isnull=True, department__isnull=True).first()


def workspace_upstream(workspace: Workspace) -> str | None:
    """host:port where the workspace's tool answers, or None while it is not running.

    The backend records the address on the pod's allocation: a loopback port on the local
    backend; on Kubernetes the workspace's Service. Without one on Kubernetes we fall back
    to the Service's DNS name.
    """
    workload = workspace.workload
    if workload.state not in ACTIVE_STATES:
        return None
    allocation = workload.allocations.select_related("node__cluster").order_by("pod_index").first()
    if allocation is None:
        return None
    if allocation.endpoint:
        return allocation.endpoint
    if allocation.node.cluster.backend == Backend.KUBERNETES:
        # The backend names a pod's Service after the pod, as the cluster knows it.
        port = workload.spec.get("ports", [{}])[0].get("port", 8888)
        return f"{_service(workload, allocation)}:{port}"
    return None


def workspace_is_running(workspace: Workspace) -> bool:
    return workspace.workload.state == WorkloadState.RUNNING


def submit_limits_for_projects(projects: QuerySet[Project]) -> dict[int, str]:
    """Per project id, the submission limits a launch must respect, said in words."""
    limits = {}
    for pk, policy in effective_policies(projects.select_related("department")).items():
        words = []
        if policy.max_gpus_per_workload is not None:
            words.append(f"at most {policy.max_gpus_per_workload.normalize():f} GPUs per workload")
        if policy.allowed_kinds and "workspace" not in policy.allowed_kinds:
            words.append("workspaces are not allowed")
        limits[pk] = "; ".join(words)
    return limits


def workspace_gpu_use(workspace: Workspace, *, minutes: int = 5) -> list[dict[str, Any]]:
    """The latest sample of each GPU the workspace used in the last minutes (none on CPU)."""
    since = timezone.now() - timedelta(minutes=minutes)
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    samples = GpuSample.objects.filter(workload_id=workspace.workload_id, ts__gte=since)
    for sample in samples.order_by("ts").values(
        "node_id", "gpu_index", "util_pct", "mem_used_mib", "mem_total_mib", "ts"
    ):
        latest[(sample["node_id"], sample["gpu_index"])] = sample
    return [latest[key] for key in sorted(latest)]


# Set by the launch itself, never by the researcher: a relaunch gets fresh ones.
LAUNCH_ENV = ("JUPYTER_TOKEN", "WORKSPACE_BIND_HOST")


def relaunch_initial(workspace: Workspace) -> dict[str, Any]:
    """The launch form filled in as this (finished) workspace was launched, under a free
    name. Without a data volume its notebooks lived in the workload's own folder on the
    local backend: the new workspace opens that folder, so the work carries over."""
    workload = workspace.workload
    env = {k: v for k, v in workload.env.items() if k not in LAUNCH_ENV}
    folder = Path(settings.VAR_DIR) / "workloads" / str(workload.id)  # the local backend's
    pools = NodePool.objects.filter(name__in=workload.node_pools)
    return {
        "project": workload.project_id,
        "environment": workspace.environment_id,
        "name": _free_name(workload),
        "gpu_request": workload.gpu_request,
        "gpus": workload.gpus,
        "gpu_memory_gib": math.ceil(workload.gpu_memory_mib / 1024),
        "cpu": workload.cpu,
        "memory_gib": max(1, math.ceil(workload.memory_mib / 1024)),
        "node_pool": pools[0].pk if len(workload.node_pools) == 1 and pools else None,
        "data_volume": workspace.data_volume or (str(folder) if folder.is_dir() else ""),
        "env": "\n".join(f"{k}={v}" for k, v in env.items()),
        "shared_with_project": workspace.shared_with_project,
    }


def _free_name(workload: Workload) -> str:
    """name-2, name-3...: names stay taken in a project while the old workload is kept."""
    numbered = re.fullmatch(r"(.+)-\d+", workload.name)
    base = (numbered[1] if numbered else workload.name)[:59].rstrip("-")
    taken = set(
        Workload.objects.filter(project_id=workload.project_id, name__startswith=base).values_list(
            "name", flat=True
        )
    )
    return next(f"{base}-{n}" for n in range(2, len(taken) + 3) if f"{base}-{n}" not in taken)
