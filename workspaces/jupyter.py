"""Asking a workspace's Jupyter server how it is: does it answer, when was it last used,
is a kernel busy. Used by the workspace page and by idle culling."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from workspaces.activity import last_proxied
from workspaces.models import ToolKind, Workspace
from workspaces.proxy import upstream_address
from workspaces.selectors import workspace_upstream

log = logging.getLogger(__name__)
# A kernel still starting is in use as much as a busy one: someone just opened it.
ACTIVE_KERNEL_STATES = frozenset({"busy", "starting"})
RELAY_HANGUP_S = 0.5  # a relay with nothing behind it hangs up well within this


@dataclass(frozen=True, slots=True)
class JupyterActivity:
    last_activity: datetime | None
    kernels: int
    busy_kernels: int  # busy or starting: both mean someone is about to use it


def tool_url(workspace: Workspace, upstream: str, path: str = "") -> str:
    host, _ = upstream_address(upstream)
    return f"http://{host}/workspaces/{workspace.workload_id}/lab/{path}"


def tool_client(upstream: str, **options: Any) -> httpx.Client:
    """A client that reaches the tool: over its unix socket on the local backend."""
    _, socket_path = upstream_address(upstream)
    transport = httpx.HTTPTransport(uds=socket_path) if socket_path else None
    return httpx.Client(transport=transport, **options)


def auth_headers(workspace: Workspace) -> dict[str, str]:
    return {"Authorization": f"token {workspace.token}"}


def tool_answers(workspace: Workspace, *, timeout: float = 2.0) -> bool:
    """Jupyter: its /api/status says 200. Another tool (VS Code server, TensorBoard) has
    no such endpoint: any answer at its base URL short of a server error will do."""
    upstream = workspace_upstream(workspace)
    if upstream is None:
        return False
    if workspace.environment is not None and workspace.environment.tool_kind == ToolKind.SSH:
        return port_answers(upstream, timeout=timeout)
    jupyter = is_jupyter(workspace)
    try:
        with tool_client(upstream, headers=auth_headers(workspace), timeout=timeout) as client:
            response = client.get(
                tool_url(workspace, upstream, "api/status" if jupyter else ""),
                params={"no_track_activity": "1"} if jupyter else None,
            )
    except httpx.HTTPError:
        return False
    return response.status_code == 200 if jupyter else response.status_code < 500


def port_answers(upstream: str, *, timeout: float) -> bool:
    """A TCP port accepts connections (an SSH server: no HTTP to ask). On the local backend
    the upstream is the socket of the pod's relay (clusters/backends/relay.py), which always
    accepts, and hangs up at once when nothing listens on the port behind it: a connection
    still open a moment later (or one that speaks first, as sshd does) is an answer."""
    host, socket_path = upstream_address(upstream)
    try:
        if socket_path is None:
            address, _, port = host.rpartition(":")
            with socket.create_connection((address, int(port)), timeout=timeout):
                return True
        with socket.socket(socket.AF_UNIX) as relayed:
            relayed.settimeout(timeout)
            relayed.connect(socket_path)
            relayed.settimeout(min(timeout, RELAY_HANGUP_S))
            return relayed.recv(1, socket.MSG_PEEK) != b""
    except TimeoutError:
        return True  # open, and silent: a server that waits for its client to speak
    except (OSError, ValueError):
        return False


def is_jupyter(workspace: Workspace) -> bool:
    return workspace.environment is None or workspace.environment.tool_kind == "jupyterlab"


def tool_activity(workspace: Workspace) -> JupyterActivity | None:
    """Jupyter's own account; for another tool (no such API), the last time someone used
    it through the proxy, once it answers. None: it cannot be seen, so it is not culled."""
    if is_jupyter(workspace):
        return jupyter_activity(workspace)
    if not tool_answers(workspace):
        return None
    return JupyterActivity(last_proxied(workspace.workload_id), kernels=0, busy_kernels=0)


def jupyter_activity(workspace: Workspace, *, timeout: float = 5.0) -> JupyterActivity | None:
    """Jupyter's own view of its use, or None when it cannot be asked (not running, down)."""
    upstream = workspace_upstream(workspace)
    if upstream is None:
        return None
    try:
        # no_track_activity: our own probe must not count as someone using the server.
        with tool_client(
            upstream,
            headers=auth_headers(workspace),
            params={"no_track_activity": "1"},
            timeout=timeout,
        ) as client:
            status = client.get(tool_url(workspace, upstream, "api/status"))
            kernels = client.get(tool_url(workspace, upstream, "api/kernels"))
            status.raise_for_status()
            kernels.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("workspace %s: Jupyter did not answer: %s", workspace.workload_id, exc)
        return None
    return activity_from(status.json(), kernels.json())


def activity_from(status: dict, kernels: list[dict]) -> JupyterActivity:
    """Jupyter's answers to /api/status and /api/kernels, as the culling rules read them."""
    last = status.get("last_activity")
    states = [kernel.get("execution_state") for kernel in kernels]
    return JupyterActivity(
        last_activity=datetime.fromisoformat(last.replace("Z", "+00:00")) if last else None,
        kernels=len(states),
        busy_kernels=sum(1 for state in states if state in ACTIVE_KERNEL_STATES),
    )
