"""Workspaces with ports of their own and SSH: from the launch form and the API; a workspace
of the SSH environment has no web tool, only its SSH server."""

from __future__ import annotations

import sys

import pytest

from clusters.podspecs import pod_program
from tests.workspaces.test_launch import _form
from workspaces.models import Environment, ToolKind, Workspace


@pytest.fixture
def jupyterlab(db):
    return Environment.objects.create(
        name="JupyterLab", image="jupyter", command=[sys.executable, "-m", "jupyter", "lab"]
    )


@pytest.fixture
def ssh_server(db):
    return Environment.objects.create(
        name="SSH server", image="ssh", command=[], port=2222, tool_kind=ToolKind.SSH
    )


def test_the_form_adds_the_users_ports_and_ssh_beside_the_tools_port(client_as, org, jupyterlab):
    client = client_as(org.researcher)
    page = client.get("/workspaces/new/").content.decode()
    assert 'id="row-ports"' in page and 'name="ssh"' in page
    form = _form(jupyterlab, project=org.project_a.pk, ports="tb:6006", ssh="on")
    assert client.post("/workspaces/new/", form).status_code == 302
    workload = Workspace.objects.get().workload
    assert workload.spec["ports"] == [
        {"name": "http", "port": 8888, "protocol": "http"},
        {"name": "tb", "port": 6006, "protocol": "http"},
        {"name": "ssh", "port": 2222, "protocol": "tcp"},
    ]
    command, args = pod_program(workload)
    assert command[:2] == ("sh", "-c") and command[3] == "gpupool-ssh" and args == ()
    assert command[4:] == tuple(workload.command)  # JupyterLab, after sshd started
    page = client.get(f"/workspaces/{workload.pk}/").content.decode()
    assert f'href="/workloads/{workload.pk}/ports/tb/"' in page


def test_a_bad_port_is_refused_on_the_ports_field(client_as, org, jupyterlab):
    client = client_as(org.researcher)
    for ports, message in (("tb:99999", "Not a port number"), ("http:6006", "only once")):
        response = client.post("/workspaces/new/", _form(jupyterlab, project=org.project_a.pk,
                                                         ports=ports))  # fmt: skip
        assert response.status_code == 200
        assert message in str(response.context["form"].errors["ports"]), ports
    assert not Workspace.objects.exists()


def test_a_workspace_of_the_ssh_environment_runs_only_its_ssh_server(client_as, org, ssh_server):
    response = client_as(org.researcher).post(
        "/api/v1/workspaces/",
        {"project": "ml-vision", "environment": "SSH server", "name": "shell"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["url"] == ""  # no web tool to open
    workload = Workspace.objects.get().workload
    assert workload.spec["ssh"] is True
    assert workload.spec["ports"] == [{"name": "ssh", "port": 2222, "protocol": "tcp"}]
    command, _ = pod_program(workload)
    assert command[3:] == ("gpupool-ssh",)  # no command after it: sshd in the foreground
