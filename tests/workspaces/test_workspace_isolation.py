"""A workspace's secrets and tool stay its owner's: the Jupyter token never leaves the server,
a project viewer may look but not open the tool, a data volume lies under the roots the
administrator gave the local cluster."""

from __future__ import annotations

import pytest

from clusters.models import Backend, Cluster, Node
from clusters.podspecs import pod_spec
from scheduling.models import PodAllocation
from tests import factories as f
from tests.workspaces.helpers import free_port, make_running_workspace
from tests.workspaces.test_proxy import _session_cookie, call_http, websocket_handshake
from workspaces.models import Environment
from workspaces.services import LaunchRequest, workspace_launch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def jupyterlab():
    return Environment.objects.create(
        name="JupyterLab", image="jupyter", command=["jupyter", "lab"]
    )


@pytest.fixture
def viewer(org):
    vera = f.make_user("vera")
    f.make_membership(vera, role=f.Role.VIEWER, project=org.project_a)
    return vera


def test_a_viewer_sees_a_shared_workspaces_page_but_the_proxy_refuses_its_tool(client, org, viewer):
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens: a pass shows as 502
    lab = make_running_workspace(
        owner=org.researcher, project=org.project_a, endpoint=endpoint, shared=True
    )
    tool = f"/workspaces/{lab.workload_id}/lab/api/status"
    channels = f"/workspaces/{lab.workload_id}/lab/api/kernels/abc/channels"

    cookie = _session_cookie(client, viewer)
    status, _, body = call_http(tool, cookie)
    assert status == 403 and b"Only the owner" in body
    assert websocket_handshake(channels, cookie) == {"type": "websocket.close", "code": 1008}
    client.force_login(viewer)
    page = client.get(f"/workspaces/{lab.workload_id}/")
    assert page.status_code == 200 and b'id="open-lab"' not in page.content

    colleague = f.make_user("carl")  # a researcher of the project passes
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    assert call_http(tool, _session_cookie(client, colleague))[0] == 502


def test_the_jupyter_token_reaches_the_pod_but_no_page_or_api_answer(client, org, jupyterlab):
    cluster = Cluster.objects.create(name="local", backend=Backend.LOCAL)
    node = Node.objects.create(cluster=cluster, name="here")
    workspace = workspace_launch(
        actor=org.researcher,
        project=org.project_a,
        request=LaunchRequest(name="lab", environment=jupyterlab, env={"WANDB_MODE": "offline"}),
    )
    workload = workspace.workload
    assert "JUPYTER_TOKEN" not in workload.env and workload.env["WANDB_MODE"] == "offline"
    allocation = PodAllocation.objects.create(workload=workload, pod_index=0, node=node)
    assert pod_spec(allocation).env["JUPYTER_TOKEN"] == workspace.token  # the tool's, only

    token = workspace.token.encode()
    for user in (org.researcher, org.platform_admin, org.dept_admin):
        client.force_login(user)
        for path in (
            f"/api/v1/workloads/{workload.pk}/",
            "/api/v1/workloads/",
            f"/api/v1/workspaces/{workload.pk}/",
            f"/workloads/{workload.pk}/",
            f"/workspaces/{workload.pk}/",
            "/workspaces/",
        ):
            response = client.get(path)
            assert response.status_code == 200, path
            assert token not in response.content, f"{path} shows the token to {user}"


def test_a_local_data_volume_must_lie_under_the_clusters_roots(
    client_as, org, jupyterlab, tmp_path
):
    datasets = tmp_path / "datasets"
    (datasets / "imagenet").mkdir(parents=True)
    Cluster.objects.create(name="local", backend=Backend.LOCAL, data_volume_roots=[str(datasets)])
    client = client_as(org.researcher)
    form = client.get("/workspaces/new/").content.decode()
    assert f'<option value="{datasets}">' in form  # offered

    def launch(volume: str):
        data = {"project": org.project_a.pk, "environment": jupyterlab.pk, "name": "nb",
                "gpu_request": "whole", "gpus": "0", "gpu_memory_gib": "0", "cpu": "1",
                "memory_gib": "2", "env": "", "data_volume": volume}  # fmt: skip
        return client.post("/workspaces/new/", data)

    for outside in ("/etc", f"{datasets}/../../..", str(tmp_path)):
        response = launch(outside)
        assert response.status_code == 200
        [error] = response.context["form"].errors["data_volume"]
        assert "not under a data-volume root" in error
    assert launch(f"{datasets}/imagenet").status_code == 302
    workload = jupyterlab.workspaces.get().workload
    assert workload.spec["volumes"] == [
        {"name": "data", "claim": f"{datasets}/imagenet", "mount_path": f"{datasets}/imagenet"}
    ]
