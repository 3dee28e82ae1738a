"""Build workloads on the local backend, end to end: a workload's HTTP port through the
portal's proxy, and `gpupool ssh` into a workspace of the SSH environment, a real OpenSSH
sshd in the pod's sandbox, reached through the portal's WebSocket tunnel by the user's own
`ssh`. The portal (proxy + Django) runs under uvicorn in a thread of this process, so it
sees the test's database; the CLI and ssh are real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from clusters.pod_users import pod_uid
from portal.asgi import django_application
from portal.services.ssh_keys import ssh_key_add
from portal.tokens import api_token_issue
from scheduling.models import PodAllocation
from scheduling.services import workload_submit
from tests import factories as f
from tests.workspaces.helpers import (
    drive_until_running,
    free_port,
    local_cluster,
    stop_and_reap,
    wait_until,
)
from tests.workspaces.test_proxy import _session_cookie, call_http, websocket_handshake
from workspaces.jupyter import tool_answers
from workspaces.models import Environment, ToolKind, Workspace
from workspaces.proxy import WorkspaceProxy
from workspaces.services import LaunchRequest, workspace_launch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("sandbox_required"),
]
needs_openssh = pytest.mark.skipif(
    not (Path("/usr/sbin/sshd").exists() and shutil.which("ssh") and shutil.which("ssh-keygen")),
    reason="needs OpenSSH's server and client: scripts/install-test-deps.sh installs them",
)


@pytest.fixture(autouse=True)
def _var_dir(local_var_dir):
    pass


@pytest.fixture
def portal_url():
    """The ASGI application as `uvicorn portal.asgi:application` serves it, on a free port."""
    port = free_port()
    config = uvicorn.Config(
        WorkspaceProxy(django_application), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "uvicorn to start", interval=0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_workloads_http_port_is_reached_by_its_owner_and_refused_to_others(client, org):
    cluster = local_cluster()
    colleague = f.make_user("carl")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    serve = f"echo tensorboard-like > index.html && exec {sys.executable} -m http.server "
    workload = workload_submit(
        actor=org.researcher, project=org.project_a, kind="training", name="board",
        image="python", command=["sh", "-c", serve + "$(GPUPOOL_PORT_BOARD) --bind 127.0.0.1"],
        ports=[{"name": "board", "port": 6006, "protocol": "http"}], gpus=0,
    )  # fmt: skip
    try:
        drive_until_running(workload.id, cluster)
        upstream = PodAllocation.objects.get(workload=workload).ports["board"]
        # A port on the pod's own loopback, which the portal reaches by the relay's socket.
        assert upstream.startswith("unix:") and upstream.endswith(".ports/board.sock")
        path = f"/workloads/{workload.id}/ports/board/"
        owner = _session_cookie(client, org.researcher)

        def served() -> bool:
            status, _, body = call_http(path + "index.html", owner)
            return status == 200 and body == b"tensorboard-like\n"

        wait_until(served, 60, "the HTTP server to answer through the proxy", interval=1)
        # The stable address without its slash leads to it.
        status, headers, _ = call_http(path[:-1], owner)
        assert (status, headers["location"]) == (308, path)
        for other in (colleague, org.outsider, org.dept_admin):
            status, _, body = call_http(path + "index.html", _session_cookie(client, other))
            # Another project's researcher does not see the workload at all: 404, as its
            # page; those who see it but may not open it: 403.
            refused = 404 if other == org.outsider else 403
            assert status == refused and b"tensorboard-like" not in body, other
            handshake = websocket_handshake(path, _session_cookie(client, other))
            assert handshake == {"type": "websocket.close", "code": 1008}
        assert call_http(path)[0] == 302  # anonymous: to the login page
        # A port the workload did not declare is not found, not guessed.
        owner = _session_cookie(client, org.researcher)  # the logins above ended its session
        assert call_http(f"/workloads/{workload.id}/ports/other/", owner)[0] == 404
    finally:
        stop_and_reap(workload.id, cluster)


def _keypair(tmp_path: Path, name: str) -> Path:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)],
                   check=True)  # fmt: skip
    return key


def _gpupool(
    tmp_path: Path, url: str, token: str | None, *args: str
) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in a process of its own, with its own config folder."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GPUPOOL_URL": url,
        "GPUPOOL_CONFIG_DIR": str(tmp_path / "config"),
    }
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "scheduling.cli", *args],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


@needs_openssh
def test_gpupool_ssh_runs_a_command_in_the_workload_and_refuses_everyone_else(
    client, org, tmp_path, portal_url
):
    cluster = local_cluster()
    colleague = f.make_user("carl")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    keys = {name: _keypair(tmp_path, name) for name in ("rita", "carl", "stranger")}
    ssh_key_add(actor=org.researcher, user=org.researcher, name="laptop",
                public_key=keys["rita"].with_suffix(".pub").read_text())  # fmt: skip
    ssh_key_add(actor=colleague, user=colleague, name="laptop",
                public_key=keys["carl"].with_suffix(".pub").read_text())  # fmt: skip
    environment = Environment.objects.create(
        name="SSH server", image="ssh", command=[], port=2222, tool_kind=ToolKind.SSH
    )
    workspace = workspace_launch(
        actor=org.researcher, project=org.project_a,
        request=LaunchRequest(name="shell", environment=environment),
    )  # fmt: skip
    batch = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=30"]
    try:
        drive_until_running(workspace.workload_id, cluster)
        workspace = Workspace.objects.get(pk=workspace.workload_id)
        wait_until(lambda: tool_answers(workspace), 60, "sshd to listen", interval=0.5)
        rita_token = api_token_issue(user=org.researcher)[1]
        ssh = ["ssh", str(workspace.workload_id), "-i", str(keys["rita"]), *batch]

        done = _gpupool(tmp_path, portal_url, rita_token, *ssh, "--", "echo", "ok")
        assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
        # The pod's own user in its sandbox, not root, not the portal's.
        done = _gpupool(tmp_path, portal_url, rita_token, *ssh, "--", "id", "-u")
        assert done.stdout.strip() == str(pod_uid(workspace.workload_id)), done.stderr

        # A key that is not on the owner's profile: sshd refuses it.
        stranger = ["ssh", str(workspace.workload_id), "-i", str(keys["stranger"]), *batch]
        done = _gpupool(tmp_path, portal_url, rita_token, *stranger, "--", "echo", "ok")
        assert done.returncode == 255 and "ok" not in done.stdout
        assert "Permission denied (publickey)" in done.stderr

        # A colleague of the project with a registered key: the tunnel itself is refused,
        # since the workspace is not shared.
        carl_token = api_token_issue(user=colleague)[1]
        carl = ["ssh", str(workspace.workload_id), "-i", str(keys["carl"]), *batch]
        done = _gpupool(tmp_path, portal_url, carl_token, *carl, "--", "echo", "ok")
        assert done.returncode == 255 and "ok" not in done.stdout
        assert "The portal refused the tunnel: you may not open this workload" in done.stderr

        # Someone of another project does not see the workload at all.
        outsider_token = api_token_issue(user=org.outsider)[1]
        done = _gpupool(tmp_path, portal_url, outsider_token, *carl, "--", "echo", "ok")
        assert done.returncode == 1 and "ok" not in done.stdout

        # Anonymous, or with a token that opens no account: the handshake gets HTTP 403.
        tunnel = portal_url.replace("http", "ws") + f"/workloads/{workspace.workload_id}/ssh"
        for headers in ({}, {"Authorization": "Token not-a-token"}):
            with pytest.raises(InvalidStatus) as refused:
                connect(tunnel, additional_headers=headers, open_timeout=30).close()
            assert refused.value.response.status_code == 403
        done = _gpupool(tmp_path, portal_url, None, "ssh-proxy", str(workspace.workload_id))
        assert done.returncode == 1 and "refused the tunnel" in done.stderr

        # Shared with the project: the colleague's key was handed to the pod when it started
        # (keys are read at pod start), so they get in once it restarts; here it is asked.
        workspace.shared_with_project = True
        workspace.save()
        done = _gpupool(tmp_path, portal_url, carl_token, *carl, "--", "echo", "ok")
        assert "Permission denied (publickey)" in done.stderr  # through the tunnel, to sshd

        config = _gpupool(tmp_path, portal_url, rita_token, "ssh-config",
                          str(workspace.workload_id))  # fmt: skip
        assert f"Host gpupool-{workspace.workload_id}\n    User gpupool\n" in config.stdout
        assert "ProxyCommand" in config.stdout and "ssh-proxy" in config.stdout
    finally:
        stop_and_reap(workspace.workload_id, cluster)


def test_the_http_port_answers_through_a_real_server(org, portal_url):
    """The proxy's routes sit in front of Django under uvicorn: an unknown workload's port is
    a 302 to the login page for nobody signed in, and Django still serves the rest."""
    response = httpx.get(f"{portal_url}/workloads/999/ports/web/", follow_redirects=False)
    assert response.status_code == 302
    assert httpx.get(f"{portal_url}/accounts/login/").status_code == 200
