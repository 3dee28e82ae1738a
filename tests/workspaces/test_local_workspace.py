"""A workspace on the local backend, end to end without a browser: launch, cycle,
reconciliation starts Jupyter as a real process, the proxy reaches it, stop removes it."""

from __future__ import annotations

import sys

import pytest

from scheduling.models import PodAllocation, WorkloadState
from tests.workspaces.helpers import drive_until_running, local_cluster, stop_and_reap, wait_until
from tests.workspaces.test_proxy import _session_cookie, call_http
from workspaces.jupyter import jupyter_activity, tool_answers
from workspaces.models import Environment, Workspace
from workspaces.services import LaunchRequest, workspace_launch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(autouse=True)
def _var_dir(local_var_dir):
    pass


def test_a_launched_workspace_runs_jupyter_on_the_local_backend_behind_the_proxy(client, org):
    cluster = local_cluster()
    server = Environment.objects.create(
        name="Jupyter server", image="jupyter", command=[sys.executable, "-m", "jupyter_server"]
    )
    workspace = workspace_launch(
        actor=org.researcher,
        project=org.project_a,
        request=LaunchRequest(name="lab", environment=server),
    )
    try:
        workload = drive_until_running(workspace.workload_id, cluster)
        workspace = Workspace.objects.get(pk=workload.id)
        allocation = PodAllocation.objects.get(workload=workload)
        assert allocation.endpoint.startswith("unix:")  # no port another local user reaches
        wait_until(lambda: tool_answers(workspace), 180, "Jupyter to answer", interval=1)
        activity = jupyter_activity(workspace)
        assert activity is not None and activity.kernels == 0 and activity.busy_kernels == 0

        cookie = _session_cookie(client, org.researcher)
        status, _, body = call_http(f"/workspaces/{workload.id}/lab/api/status", cookie)
        assert status == 200, body
        assert call_http(f"/workspaces/{workload.id}/lab/api/status",
                         _session_cookie(client, org.outsider))[0] == 404  # fmt: skip
    finally:
        stop_and_reap(workspace.workload_id, cluster)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.STOPPED
    assert not PodAllocation.objects.filter(workload=workload).exists()
