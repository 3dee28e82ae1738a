"""Real Jupyter servers for the workspace tests, and workspace rows pointing at them."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.utils import timezone

from clusters.models import Backend, Cluster, Node
from scheduling.models import PodAllocation, Workload, WorkloadKind, WorkloadState
from workspaces.models import Workspace

JUPYTER_START_TIMEOUT_S = 180  # two busy cores: JupyterLab can take a minute to answer


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class JupyterProcess:
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    base_url: str
    log: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def api(self, path: str) -> str:
        return f"http://{self.endpoint}{self.base_url}{path}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}


def wait_until(check, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def jupyter_server(workspace_id: int, root: Path) -> Iterator[JupyterProcess]:
    """A Jupyter server (the lighter base of JupyterLab) as the workspace's tool would run,
    in its own process group, killed with everything it started at the end."""
    port, token = free_port(), secrets.token_urlsafe(16)
    base_url = f"/workspaces/{workspace_id}/lab/"
    log = root / f"jupyter-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--no-browser",
        "--allow-root",
        f"--ServerApp.base_url={base_url}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={root}",
    ]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = JupyterProcess(proc, port, token, base_url, log)
    try:
        wait_until(lambda: _answers(server), JUPYTER_START_TIMEOUT_S, "Jupyter to answer")
        yield server
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)


def _answers(server: JupyterProcess) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError(f"Jupyter exited: {server.log.read_text()[-2000:]}")
    try:
        return httpx.get(server.api("api/status"), headers=server.headers, timeout=2).is_success
    except httpx.HTTPError:
        return False


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def start_kernel(server: JupyterProcess) -> str:
    response = httpx.post(
        server.api("api/kernels"), headers=server.headers, json={"name": "python3"}, timeout=60
    )
    response.raise_for_status()
    return response.json()["id"]


def kernel_state(server: JupyterProcess, kernel_id: str) -> str:
    kernel = httpx.get(
        server.api(f"api/kernels/{kernel_id}"),
        params={"no_track_activity": "1"},
        headers=server.headers,
        timeout=5,
    )
    return kernel.json().get("execution_state", "") if kernel.is_success else ""


def execute_request(code: str) -> str:
    """A Jupyter protocol execute_request as JSON text (the default WebSocket protocol)."""
    msg_id = secrets.token_hex(8)
    header = {
        "msg_id": msg_id,
        "username": "test",
        "session": secrets.token_hex(8),
        "msg_type": "execute_request",
        "version": "5.3",
        "date": timezone.now().isoformat(),
    }
    content = {
        "code": code,
        "silent": False,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }
    return json.dumps(
        {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": "shell",
            "buffers": [],
        }
    )


def make_running_workspace(
    *, owner, project, name: str = "lab", endpoint: str = "", token: str = "t", shared: bool = False
) -> Workspace:
    """A workspace whose workload the cycle admitted and the local backend started."""
    cluster, _ = Cluster.objects.get_or_create(name="local", defaults={"backend": Backend.LOCAL})
    node, _ = Node.objects.get_or_create(cluster=cluster, name="here")
    now = timezone.now()
    workload = Workload.objects.create(
        project=project,
        submitted_by=owner,
        kind=WorkloadKind.WORKSPACE,
        name=name,
        image="jupyter",
        command=["jupyter", "lab"],
        state=WorkloadState.RUNNING,
        priority_class="build",
        preemptible=False,
        spec={"ports": [{"name": "http", "port": 8888}]},
        admitted_at=now,
        started_at=now,
    )
    PodAllocation.objects.create(
        workload=workload, pod_index=0, node=node, endpoint=endpoint, phase="Running"
    )
    return Workspace.objects.create(workload=workload, token=token, shared_with_project=shared)


def local_cluster(pool_name: str = "a100") -> Cluster:
    """This machine as a one-node cluster in the org's pool, its inventory synced."""
    from clusters.tasks import sync_inventory

    cluster = Cluster.objects.create(
        name="this-machine", backend=Backend.LOCAL, config={"pool": pool_name, "node_name": "here"}
    )
    sync_inventory(cluster.id)
    return cluster


def drive_until_running(workload_id: int, cluster: Cluster, timeout: float = 120) -> Workload:
    """What a worker and beat would do: cycles and reconciliations until the pod runs."""
    from clusters.tasks import reconcile_cluster
    from scheduling.tasks import run_cycle

    def step() -> Workload | None:
        run_cycle()
        reconcile_cluster(cluster.id)
        workload = Workload.objects.get(pk=workload_id)
        assert workload.state not in ("failed", "stopped", "succeeded"), workload.message
        return workload if workload.state == WorkloadState.RUNNING else None

    return wait_until(step, timeout, f"workload {workload_id} to run", interval=1)


def stop_and_reap(workload_id: int, cluster: Cluster) -> None:
    """Stop the workload and let reconciliation delete its process; kill what is left."""
    from clusters.tasks import reconcile_cluster
    from scheduling.lifecycle import workload_transition

    workload = Workload.objects.get(pk=workload_id)
    pids = [int(a.backend_ref.split(":")[0]) for a in workload.allocations.all() if a.backend_ref]
    if workload.state in (WorkloadState.PENDING, WorkloadState.ADMITTED, WorkloadState.RUNNING):
        workload_transition(workload, WorkloadState.STOPPED, reason="TestOver")
    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: reconcile_cluster(cluster.id) is not None
            and not PodAllocation.objects.filter(workload_id=workload_id).exists(),
            40, "the pod to be deleted", interval=1,
        )  # fmt: skip
    for pid in pids:
        kill_group(pid)
