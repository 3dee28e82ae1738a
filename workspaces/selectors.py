"""Reads of the workspaces app: who may see, open or manage a workspace; where it answers."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from clusters.models import Backend
from portal.models import Membership, Project
from portal.permissions import can_admin_project, can_view_project, visible_projects
from scheduling.models import ACTIVE_STATES, WorkloadState
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
        .filter(pk=workspace_id)
        .first()
    )


def can_view_workspace(user: Any, workspace: Workspace) -> bool:
    return can_view_project(user, workspace.workload.project)


def can_open_workspace(user: Any, workspace: Workspace) -> bool:
    """The tool itself: its owner, or the project's members when the owner shares it.

    Deliberately narrower than viewing: the tool is a shell on the owner's data, so
    administrators do not pass unless they are members of a shared workspace's project.
    """
    if not (user.is_authenticated and user.is_active):
        return False
    if user.pk == workspace.workload.submitted_by_id:
        return True
    return (
        workspace.shared_with_project
        and Membership.objects.filter(user=user, project_id=workspace.workload.project_id).exists()
    )


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
        port = workload.spec.get("ports", [{}])[0].get("port", 8888)
        return f"{workload.name}.{workload.project.namespace}.svc.cluster.local:{port}"
    return None


def workspace_is_running(workspace: Workspace) -> bool:
    return workspace.workload.state == WorkloadState.RUNNING
