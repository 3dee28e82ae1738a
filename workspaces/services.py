"""Writes of the workspaces app: launching a workspace, sharing it, keeping it alive."""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from clusters.models import Backend, Cluster, NodePool
from clusters.selectors import real_process_pool_names, simulated_pool_ids
from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed
from portal.models import Department, Project
from portal.permissions import (
    can_admin_department,
    can_admin_project,
    can_submit_to_project,
    is_platform_admin,
)
from scheduling.models import PriorityClass, WorkloadKind
from scheduling.services import workload_stop, workload_submit
from workspaces.models import (
    Environment,
    IdlePolicy,
    IdleState,
    ToolKind,
    Workspace,
    WorkspaceTemplate,
)
from workspaces.selectors import can_manage_workspace

# On Kubernetes the data volume (a PVC) is mounted here and is the notebook directory.
PVC_MOUNT_PATH = "/data"
PVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass
class LaunchRequest:
    """What the launch form (or the API) asks for. Memory in MiB, as on the workload."""

    name: str
    environment: Environment
    gpu_request: str = "whole"
    gpus: Decimal = Decimal("0")
    gpu_memory_mib: int = 0
    cpu: Decimal = Decimal("1")
    memory_mib: int = 4096
    node_pool: NodePool | None = None
    data_volume: str = ""
    env: dict[str, str] = field(default_factory=dict)
    shared_with_project: bool = False
    # Ports of the user's own beside the tool's (TensorBoard, a demo): {name, port, protocol}.
    ports: list[dict[str, Any]] = field(default_factory=list)
    ssh: bool = False  # start an SSH server with the owner's keys; always for an SSH tool


def workspace_launch(*, actor: Any, project: Project, request: LaunchRequest) -> Workspace:
    """Submit a workspace workload running the environment's tool behind the portal's proxy.

    The tool's token is generated here and kept on the Workspace row only: the backend hands
    it to the pod (`clusters.podspecs`), the proxy adds it to proxied requests. Neither the
    workload's env nor any page or API answer holds it.
    """
    if not can_submit_to_project(actor, project):
        raise PermissionDenied("You may not launch workspaces in this project.")
    if not request.environment.enabled:
        raise ValidationFailed({"environment": ["This environment is disabled."]})
    token = secrets.token_urlsafe(32)
    pools = launch_pools(request.node_pool)
    volume = _check_data_volume(request.data_volume, pools)
    with transaction.atomic():
        workload = workload_submit(
            actor=actor,
            project=project,
            kind=WorkloadKind.WORKSPACE,
            name=request.name,
            **_workload_spec(request, pools),
        )
        # The base URL holds the workload's id, known only now; the cycle that starts the
        # pod runs after this transaction commits, so it sees the final command.
        workload.command = tool_command(
            request.environment, workload.id, volume, local_only=_local_only(pools)
        )
        if volume:
            workload.spec["volumes"] = [_volume(volume)]
        workload.save(update_fields=["command", "spec"])
        workspace = Workspace.objects.create(
            workload=workload,
            environment=request.environment,
            token=token,
            shared_with_project=request.shared_with_project,
            data_volume=volume,
        )
        audit_log(
            actor=actor,
            action="workspace.launch",
            obj=workspace,
            after=_public_snapshot(workspace),
            department=project.department,
        )
    return workspace


def _volume(volume: str) -> dict[str, str]:
    """A PVC on Kubernetes, mounted where the notebooks live; a directory of the machine on
    the local backend, bound at its own path inside the pod's sandbox."""
    if volume.startswith("/"):
        return {"name": "data", "claim": volume, "mount_path": volume}
    return {"name": "data", "claim": volume, "mount_path": PVC_MOUNT_PATH}


def launch_pools(chosen: NodePool | None) -> list[str]:
    """The workspace's node-pool preference list. A pool the user picked is honoured, even a
    simulated one; otherwise only pools where processes really run, since on a simulated
    pool the tool would "run" without a process and never open. No pools at all: any."""
    if chosen is not None:
        return [chosen.name]
    real = real_process_pool_names()
    if not real and simulated_pool_ids():
        raise ValidationFailed(
            {
                "node_pool": [
                    "No node pool here runs real processes, only simulated ones, where the "
                    "workspace would never open. Pick a simulated pool to launch there anyway."
                ]
            }
        )
    return real


def _check_data_volume(volume: str, pools: list[str]) -> str:
    """An absolute directory under a data-volume root of the local clusters (the admin's
    choice per cluster), or a PVC name (Kubernetes, a DNS subdomain), matching the backends
    the workspace may land on. Returns the volume, a directory resolved (no link or '..'
    leads out of its root later)."""
    if not volume:
        return ""
    backends = _pool_backends(pools) - {Backend.SIMULATED}
    if not volume.startswith("/"):
        if not PVC_NAME.fullmatch(volume):
            error = "Give an absolute directory or a PVC name (lower-case, digits, '-')."
        elif Backend.LOCAL in backends:
            error = (
                "A PVC name needs a Kubernetes node pool: on the local backend give an "
                "absolute directory, or pick a Kubernetes pool."
            )
        else:
            return volume
    elif Backend.KUBERNETES in backends:
        error = (
            "A directory is for the local backend: on Kubernetes give a PVC name, or pick "
            "a local node pool."
        )
    elif Backend.LOCAL in backends:
        path = Path(os.path.realpath(volume))
        roots = data_volume_roots(pools)
        if not path.is_dir():
            error = f"There is no directory {volume} on this machine."
        elif not any(path.is_relative_to(root) for root in roots):
            where = ", ".join(roots) or "none: an administrator sets them on the cluster"
            error = f"{volume} is not under a data-volume root of this cluster ({where})."
        else:
            return str(path)
    else:
        return volume
    raise ValidationFailed({"data_volume": [error]})


def data_volume_roots(pools: list[str]) -> list[str]:
    """The directories the local clusters a workload may land on offer as data volumes."""
    roots: list[str] = []
    for cluster in _pool_clusters(pools).filter(backend=Backend.LOCAL):
        roots.extend(root for root in cluster.data_volume_roots if root not in roots)
    return roots


def _workload_spec(request: LaunchRequest, pools: list[str]) -> dict[str, Any]:
    env = {**request.env, "WORKSPACE_BIND_HOST": _bind_host(pools)}
    return {
        "image": request.environment.image,
        "command": list(request.environment.command),
        "env": env,
        "gpu_request": request.gpu_request,
        "gpus": request.gpus,
        "gpu_memory_mib": request.gpu_memory_mib,
        "cpu": request.cpu,
        "memory_mib": request.memory_mib,
        "node_pools": pools,
        "priority_class": PriorityClass.BUILD,
        "preemptible": False,
        "ports": [*_tool_ports(request.environment), *request.ports],
        "ssh": request.ssh or request.environment.tool_kind == ToolKind.SSH,
    }


def _tool_ports(environment: Environment) -> list[dict[str, Any]]:
    """The web tool's port, first (its link and idle checks use it); an SSH tool has none."""
    if environment.tool_kind == ToolKind.SSH:
        return []
    return [{"name": "http", "port": environment.port, "protocol": "http"}]


def _pool_clusters(pools: list[str]) -> QuerySet[Cluster]:
    """The enabled clusters a workload with this preference may land on."""
    clusters = Cluster.objects.filter(enabled=True)
    if pools:
        clusters = clusters.filter(
            Q(node_pools__name__in=pools) | Q(nodes__pool__name__in=pools)
        ).distinct()
    return clusters


def _pool_backends(pools: list[str]) -> set[str]:
    """The backends of the enabled clusters a workload with this preference may land on."""
    return set(_pool_clusters(pools).values_list("backend", flat=True))


def _local_only(pools: list[str]) -> bool:
    return _pool_backends(pools) <= {Backend.LOCAL}


def _bind_host(pools: list[str]) -> str:
    """Loopback when the workspace can only land on the local backend (the proxy is on the
    same machine); all interfaces on Kubernetes, where the Service must reach the pod."""
    return "127.0.0.1" if _local_only(pools) else "0.0.0.0"


def tool_command(
    environment: Environment, workspace_id: int, data_volume: str, *, local_only: bool = False
) -> list[str]:
    """The tool's command line; `$(VAR)`s are expanded by the backend from the pod's env.

    Jupyter reads its token from JUPYTER_TOKEN in its environment: never on the command
    line, where `ps` and the backends' logs would show it. On the local backend it listens
    on the unix socket the backend gives the pod (GPUPOOL_SOCKET), in a folder only the
    portal and the pod reach: no port another user of the machine could connect to.
    """
    base_url = f"/workspaces/{workspace_id}/lab/"
    if data_volume.startswith("/"):
        root_dir = data_volume
    else:
        root_dir = PVC_MOUNT_PATH if data_volume else "."
    if environment.tool_kind != "jupyterlab":
        # VS Code server and TensorBoard take their own flags; the environment's command
        # carries them, with $(GPUPOOL_PORT) and $(JUPYTER_TOKEN) where they need them.
        return [arg.replace("{base_url}", base_url) for arg in environment.command]
    if local_only:
        # 0660: the socket's folder gives it the portal's group (clusters/README.md).
        listen = ["--ServerApp.sock=$(GPUPOOL_SOCKET)", "--ServerApp.sock_mode=0660"]
    else:
        listen = ["--ServerApp.port=$(GPUPOOL_PORT)", "--ServerApp.ip=$(WORKSPACE_BIND_HOST)"]
    return [
        *environment.command,
        "--no-browser",
        "--allow-root",
        f"--ServerApp.base_url={base_url}",
        *listen,
        f"--ServerApp.root_dir={root_dir}",
    ]


def _public_snapshot(workspace: Workspace) -> dict[str, Any]:
    return snapshot(workspace, fields=["environment", "shared_with_project", "data_volume"])


def workspace_share_set(*, actor: Any, workspace: Workspace, shared: bool) -> Workspace:
    """Open (or close) the workspace's tool to the members of its project."""
    if actor.pk != workspace.workload.submitted_by_id:
        raise PermissionDenied("Only the owner may share a workspace.")
    with transaction.atomic():
        before = _public_snapshot(workspace)
        workspace.shared_with_project = shared
        workspace.save(update_fields=["shared_with_project"])
        audit_log(
            actor=actor,
            action="workspace.share",
            obj=workspace,
            before=before,
            after=_public_snapshot(workspace),
            department=workspace.workload.project.department,
        )
    return workspace


def workspace_keep_alive(*, actor: Any, workspace: Workspace) -> Workspace:
    """The user says the workspace is in use: restart its idle clock and lift the warning."""
    if not can_manage_workspace(actor, workspace):
        raise PermissionDenied("You may not keep this workspace running.")
    with transaction.atomic():
        before = snapshot(workspace, fields=["idle_state", "warned_at", "kept_alive_at"])
        workspace.kept_alive_at = timezone.now()
        workspace.idle_state = IdleState.ACTIVE
        workspace.warned_at = None
        workspace.save(update_fields=["kept_alive_at", "idle_state", "warned_at"])
        audit_log(
            actor=actor,
            action="workspace.keep_alive",
            obj=workspace,
            before=before,
            after=snapshot(workspace, fields=["idle_state", "warned_at", "kept_alive_at"]),
            department=workspace.workload.project.department,
        )
    return workspace


def workspace_stop(*, actor: Any, workspace: Workspace) -> None:
    if not can_manage_workspace(actor, workspace):
        raise PermissionDenied("You may not stop this workspace.")
    workload_stop(actor=actor, workload=workspace.workload)


# --- Administration: environments, project templates, idle policies ----------------------------
def environment_save(*, actor: Any, environment: Environment) -> Environment:
    """Create or change an environment (from a validated form's instance)."""
    if not is_platform_admin(actor):
        raise PermissionDenied("Only platform administrators define environments.")
    with transaction.atomic():
        old = Environment.objects.filter(pk=environment.pk).first() if environment.pk else None
        environment.save()
        audit_log(
            actor=actor, action="environment.save", obj=environment,
            before=snapshot(old) if old else None, after=snapshot(environment),
        )  # fmt: skip
    return environment


def template_save(*, actor: Any, template: WorkspaceTemplate) -> WorkspaceTemplate:
    if not can_admin_project(actor, template.project):
        raise PermissionDenied("Only the project's administrators manage its templates.")
    with transaction.atomic():
        old = WorkspaceTemplate.objects.filter(pk=template.pk).first() if template.pk else None
        template.save()
        audit_log(
            actor=actor, action="workspace_template.save", obj=template,
            before=snapshot(old) if old else None, after=snapshot(template),
            department=template.project.department,
        )  # fmt: skip
    return template


def idle_policy_set(
    *,
    actor: Any,
    project: Project | None = None,
    department: Department | None = None,
    warn_after_min: int,
    stop_after_min: int,
    gpu_util_threshold_pct: int,
) -> IdlePolicy:
    """Set the idle policy of a project, a department, or (neither) the whole platform."""
    _check_policy_scope(actor, project, department)
    errors: dict[str, list[str]] = {}
    if warn_after_min > stop_after_min:
        errors["warn_after_min"] = ["Warn before stopping: at most the stop time."]
    if not 0 <= gpu_util_threshold_pct <= 100:
        errors["gpu_util_threshold_pct"] = ["A percentage from 0 to 100."]
    if errors:
        raise ValidationFailed(errors)
    values = {
        "warn_after_min": warn_after_min,
        "stop_after_min": stop_after_min,
        "gpu_util_threshold_pct": gpu_util_threshold_pct,
    }
    with transaction.atomic():
        policy = IdlePolicy.objects.filter(project=project, department=department).first()
        before = snapshot(policy) if policy else None
        policy = policy or IdlePolicy(project=project, department=department)
        for name, value in values.items():
            setattr(policy, name, value)
        policy.save()
        audit_log(
            actor=actor, action="idle_policy.set", obj=policy, before=before,
            after=snapshot(policy),
            department=department or (project.department if project else None),
        )  # fmt: skip
    return policy


def _check_policy_scope(actor: Any, project: Project | None, department: Department | None) -> None:
    if project is not None and department is not None:
        raise ValidationFailed("A policy belongs to a project or a department, not both.")
    if project is not None:
        allowed = can_admin_project(actor, project)
    elif department is not None:
        allowed = can_admin_department(actor, department)
    else:
        allowed = is_platform_admin(actor)
    if not allowed:
        raise PermissionDenied("You may not set the idle policy here.")
