"""Idle culling against real Jupyter servers; time is moved by passing `now`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone
from websockets.asyncio.client import connect

from clusters.metrics.models import GpuSample
from portal.models import AuditLog
from scheduling.models import PodAllocation, WorkloadState
from tests.workspaces.helpers import (
    execute_request,
    jupyter_server,
    kernel_state,
    make_running_workspace,
    start_kernel,
    wait_until,
)
from workspaces.culling import workspaces_cull
from workspaces.models import IdlePolicy, IdleState

pytestmark = [pytest.mark.django_db, pytest.mark.slow, pytest.mark.timeout(600)]


def _running_lab(org, tmp_path):
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    return workspace


def _point_at(workspace, server) -> None:
    PodAllocation.objects.filter(workload=workspace.workload).update(endpoint=server.endpoint)
    workspace.token = server.token
    workspace.save(update_fields=["token"])


def test_a_workspace_with_an_idle_kernel_is_warned_then_stopped_by_the_system(
    org, tmp_path, settings, django_capture_on_commit_callbacks
):
    settings.VAR_DIR = tmp_path / "var"  # the reconcile after the stop reads pod records here
    workspace = _running_lab(org, tmp_path)
    with jupyter_server(workspace.workload_id, tmp_path) as server:
        _point_at(workspace, server)
        kernel_id = start_kernel(server)
        # No client has talked to it yet: Jupyter says "starting", which counts as in use.
        assert kernel_state(server, kernel_id) == "starting"
        assert workspaces_cull(now=timezone.now() + timedelta(hours=5)) == {"keep": 1}
        asyncio.run(_run_once(server, kernel_id))
        wait_until(lambda: kernel_state(server, kernel_id) == "idle", 30, "an idle kernel")
        now = timezone.now()

        assert workspaces_cull(now=now + timedelta(minutes=5)) == {"keep": 1}
        workspace.refresh_from_db()
        assert workspace.idle_state == IdleState.ACTIVE

        assert workspaces_cull(now=now + timedelta(minutes=11)) == {"warn": 1}
        workspace.refresh_from_db()
        assert workspace.idle_state == IdleState.WARNED
        warning = workspace.workload.events.get(reason="IdleWarning")
        assert "stopped after 30 idle minutes" in warning.message

        with django_capture_on_commit_callbacks(execute=True):
            assert workspaces_cull(now=now + timedelta(minutes=31)) == {"stop": 1}
    workspace.refresh_from_db()
    workspace.workload.refresh_from_db()
    assert workspace.idle_state == IdleState.CULLED
    assert workspace.workload.state == WorkloadState.STOPPED
    stopped = workspace.workload.events.get(type="stopped")
    assert (stopped.reason, stopped.message) == ("IdleCulled", "Idle for 31 minutes.")
    audit = AuditLog.objects.get(action="workspace.cull")
    assert audit.actor is None and audit.object_id == str(workspace.workload_id)
    stop = AuditLog.objects.get(action="workload.stop")
    assert (stop.actor, stop.after["reason"], stop.after["state"]) == (
        None,
        "IdleCulled",
        "stopped",
    )
    # Like any stop, on commit: reconciliation saw the pod gone and released its allocation.
    assert not PodAllocation.objects.filter(workload=workspace.workload).exists()


async def _run_once(server, kernel_id: str) -> None:
    """Run an empty cell, as JupyterLab does on opening a notebook: the kernel goes idle."""
    url = f"ws://{server.endpoint}{server.base_url}api/kernels/{kernel_id}/channels"
    async with connect(url, additional_headers=server.headers) as ws:
        await ws.send(execute_request("pass"))
        async for message in ws:
            if '"execution_state": "idle"' in message or '"execution_state":"idle"' in message:
                return


async def _keep_kernel_busy(server, kernel_id: str, seconds: int) -> None:
    url = f"ws://{server.endpoint}{server.base_url}api/kernels/{kernel_id}/channels"
    async with connect(url, additional_headers=server.headers) as ws:
        await ws.send(execute_request(f"import time; time.sleep({seconds})"))
        # Wait for the kernel to say it is busy, then leave it running.
        async for message in ws:
            if '"execution_state": "busy"' in message or '"execution_state":"busy"' in message:
                return


def test_a_workspace_with_a_busy_kernel_is_never_culled(org, tmp_path):
    workspace = _running_lab(org, tmp_path)
    with jupyter_server(workspace.workload_id, tmp_path) as server:
        _point_at(workspace, server)
        kernel_id = start_kernel(server)
        asyncio.run(_keep_kernel_busy(server, kernel_id, seconds=300))
        wait_until(lambda: kernel_state(server, kernel_id) == "busy", 30, "a busy kernel")

        later = timezone.now() + timedelta(hours=5)
        assert workspaces_cull(now=later) == {"keep": 1}
        workspace.refresh_from_db()
        workspace.workload.refresh_from_db()
    assert workspace.idle_state == IdleState.ACTIVE
    assert workspace.workload.state == WorkloadState.RUNNING
    assert not workspace.workload.events.filter(reason__in=["IdleWarning", "IdleCulled"]).exists()


def test_keeping_a_warned_workspace_running_restarts_its_idle_clock(org, tmp_path, client_as):
    workspace = _running_lab(org, tmp_path)
    with jupyter_server(workspace.workload_id, tmp_path) as server:
        _point_at(workspace, server)
        now = timezone.now()
        assert workspaces_cull(now=now + timedelta(minutes=11)) == {"warn": 1}

        response = client_as(org.researcher).post(
            f"/workspaces/{workspace.workload_id}/keep-running/"
        )
        assert response.status_code == 302
        workspace.refresh_from_db()
        assert workspace.idle_state == IdleState.ACTIVE and workspace.kept_alive_at is not None
        assert AuditLog.objects.filter(action="workspace.keep_alive", actor=org.researcher).exists()
        # Idle minutes now count from the click, not from Jupyter's last activity.
        keep = workspace.kept_alive_at
        assert workspaces_cull(now=keep + timedelta(minutes=9)) == {"keep": 1}
        # Idle past the stop time, but the click lifted the warning: warned again first,
        # then stopped once the policy's 20 minutes between warning and stop have passed.
        assert workspaces_cull(now=keep + timedelta(minutes=31)) == {"warn": 1}
        assert workspaces_cull(now=keep + timedelta(minutes=50)) == {"keep": 1}
        assert workspaces_cull(now=keep + timedelta(minutes=51)) == {"stop": 1}


def test_the_idle_clock_starts_when_the_gpus_went_quiet_not_at_the_last_jupyter_use(org, tmp_path):
    """A training script run from a terminal kept the GPUs busy for hours while Jupyter
    saw nothing: 15 minutes after it ended the workspace is warned, not stopped."""
    workspace = _running_lab(org, tmp_path)  # warn after 10, stop after 30
    later = timezone.now() + timedelta(hours=5)  # Jupyter's last activity: now, 5 h before
    for minutes_ago in (300, 200, 100, 15):
        GpuSample.objects.create(
            ts=later - timedelta(minutes=minutes_ago), node_id=1, gpu_index=0, util_pct=95,
            workload_id=workspace.workload_id,
        )  # fmt: skip
    with jupyter_server(workspace.workload_id, tmp_path) as server:
        _point_at(workspace, server)
        assert workspaces_cull(now=later) == {"warn": 1}
        assert workspaces_cull(now=later + timedelta(minutes=10)) == {"keep": 1}
        assert workspaces_cull(now=later + timedelta(minutes=20)) == {"stop": 1}
    warning = workspace.workload.events.get(reason="IdleWarning")
    assert warning.message.startswith("Idle for 15 minutes.")


# A tool that answers HTTP (404 for every path but its folder's files), on a port of the
# kernel's choosing, which it prints first.
TOOL = (
    "import http.server\n"
    "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\n"
    "print(s.server_address[1], flush=True)\n"
    "s.serve_forever()\n"
)


@pytest.mark.django_db(transaction=True)  # the proxy reads the session from another thread
def test_a_tool_without_jupyters_api_is_culled_by_its_use_through_the_proxy(org, client):
    """TensorBoard or VS Code server report no activity of their own: the last request or
    WebSocket message the proxy let through counts instead."""
    import subprocess
    import sys

    from tests.workspaces.helpers import kill_group
    from tests.workspaces.test_proxy import _session_cookie, call_http
    from workspaces import activity
    from workspaces.models import Environment, ToolKind

    # The tool binds a port the kernel picks and says which: a port picked free before it
    # starts can be taken meanwhile by another suite on the machine (a 502 under load).
    server = subprocess.Popen(
        [sys.executable, "-c", TOOL], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    port = int(server.stdout.readline())
    workspace = make_running_workspace(
        owner=org.researcher, project=org.project_a, endpoint=f"127.0.0.1:{port}"
    )
    IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    workspace.environment = Environment.objects.create(
        name="TensorBoard", image="tb", command=["tensorboard"], tool_kind=ToolKind.TENSORBOARD
    )
    workspace.save()
    later = timezone.now() + timedelta(hours=5)
    try:
        wait_until(lambda: workspaces_cull(now=later) != {"skip": 1}, 30, "the tool to answer")
        workspace.refresh_from_db()
        assert workspace.idle_state == IdleState.WARNED  # never used: idle since its start
        activity._written.clear()  # this process may have written for a reused id: forget it
        cookie = _session_cookie(client, org.researcher)
        assert call_http(f"/workspaces/{workspace.workload_id}/lab/", cookie)[0] == 404
        used = activity.last_proxied(workspace.workload_id)
        assert used is not None and abs((used - timezone.now()).total_seconds()) < 30
        assert workspaces_cull(now=used + timedelta(minutes=5)) == {"keep": 1}
        workspace.refresh_from_db()
        assert workspace.idle_state == IdleState.ACTIVE  # used again: the warning is lifted
        assert workspaces_cull(now=used + timedelta(minutes=11)) == {"warn": 1}
    finally:
        kill_group(server.pid)
        server.wait(timeout=10)


def test_a_tool_that_never_answers_is_warned_then_stopped_from_its_start(
    org, tmp_path, settings, django_capture_on_commit_callbacks
):
    """The process runs and holds its port but never answers HTTP (a hung start): its GPUs
    serve nobody, so the idle clock runs from the start as if it were idle."""
    import socket

    settings.VAR_DIR = tmp_path / "var"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections into its backlog, never reads or answers
    host, port = silent.getsockname()
    workspace = make_running_workspace(
        owner=org.researcher, project=org.project_a, endpoint=f"{host}:{port}"
    )
    IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    start = workspace.workload.started_at
    try:
        assert workspaces_cull(now=start + timedelta(minutes=5)) == {"keep": 1}
        assert workspaces_cull(now=start + timedelta(minutes=11)) == {"warn": 1}
        warning = workspace.workload.events.get(reason="IdleWarning")
        assert warning.message.startswith("The tool has not answered for 11 minutes.")
        with django_capture_on_commit_callbacks(execute=True):
            assert workspaces_cull(now=start + timedelta(minutes=31)) == {"stop": 1}
    finally:
        silent.close()
    workspace.refresh_from_db()
    workspace.workload.refresh_from_db()
    assert (workspace.idle_state, workspace.answered_at) == (IdleState.CULLED, None)
    assert workspace.workload.state == WorkloadState.STOPPED
    stopped = workspace.workload.events.get(type="stopped")
    assert stopped.message == "The tool has not answered for 31 minutes."


def test_a_jupyter_that_stops_answering_is_idle_from_its_last_answer(org, tmp_path):
    workspace = _running_lab(org, tmp_path)
    with jupyter_server(workspace.workload_id, tmp_path) as server:
        _point_at(workspace, server)
        assert workspaces_cull(now=timezone.now()) == {"keep": 1}
    workspace.refresh_from_db()
    answered = workspace.answered_at
    assert answered is not None
    # The server is gone now (a crash, a hang): ten quiet minutes after its last answer.
    assert workspaces_cull(now=answered + timedelta(minutes=5)) == {"keep": 1}
    assert workspaces_cull(now=answered + timedelta(minutes=11)) == {"warn": 1}
