"""Launching a workspace: the form, the workload it submits, and the pages around it."""

from __future__ import annotations

import sys
from decimal import Decimal

import pytest

from clusters.models import Backend, Cluster, Node
from portal.models import AuditLog
from scheduling.models import PriorityClass, Workload, WorkloadPolicy
from tests.workspaces.helpers import make_running_workspace
from workspaces.models import Environment, Workspace, WorkspaceTemplate
from workspaces.services import LaunchRequest, workspace_launch


@pytest.fixture
def jupyterlab(db):
    return Environment.objects.create(
        name="JupyterLab",
        image="quay.io/jupyter/minimal-notebook",
        command=[sys.executable, "-m", "jupyter", "lab"],
        default_cpu=Decimal("2"),
        default_memory_mib=8192,
    )


def _form(environment, **extra) -> dict:
    data = {
        "project": "",
        "environment": environment.pk,
        "name": "my-lab",
        "gpu_request": "whole",
        "gpus": "0",
        "gpu_memory_gib": "0",
        "cpu": "1",
        "memory_gib": "2",
        "env": "",
    }
    data.update(extra)
    return data


def test_the_form_launches_a_non_preemptible_build_workload_whose_token_stays_hidden(
    client_as, org, jupyterlab
):
    client = client_as(org.researcher)
    response = client.post(
        "/workspaces/new/",
        _form(jupyterlab, project=org.project_a.pk, env="WANDB_MODE=offline", data_volume="/d"),
    )
    workspace = Workspace.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/workspaces/{workspace.workload_id}/"
    workload = workspace.workload
    assert (workload.kind, workload.state, workload.preemptible) == ("workspace", "pending", False)
    assert workload.priority_class == PriorityClass.BUILD
    assert workload.spec["ports"] == [{"name": "http", "port": 8888, "protocol": "http"}]
    assert workload.memory_mib == 2048 and workload.submitted_by == org.researcher
    assert workload.env["WANDB_MODE"] == "offline"
    assert "JUPYTER_TOKEN" not in workload.env and len(workspace.token) >= 32  # server-side
    assert not any(workspace.token in part for part in workload.command)
    assert workload.command == [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
        f"--ServerApp.base_url=/workspaces/{workload.id}/lab/",
        "--ServerApp.sock=$(GPUPOOL_SOCKET)", "--ServerApp.sock_mode=0660",
        "--ServerApp.root_dir=/d",
    ]  # fmt: skip
    assert workload.env["WORKSPACE_BIND_HOST"] == "127.0.0.1"  # no Kubernetes cluster here
    assert AuditLog.objects.filter(action="workspace.launch", actor=org.researcher).exists()
    page = client.get(response["Location"])
    assert page.status_code == 200 and b"my-lab" in page.content
    assert workspace.token.encode() not in page.content
    status = client.get(f"/workspaces/{workload.id}/status/")
    assert workspace.token.encode() not in status.content


def test_the_form_shows_the_environment_cards_and_the_project_policy(client_as, org, jupyterlab):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=Decimal("1"))
    page = client_as(org.researcher).get("/workspaces/new/")
    assert page.status_code == 200
    assert b'name="environment"' in page.content and b"JupyterLab" in page.content
    assert b"at most 1 GPUs per workload" in page.content


def test_the_form_refuses_more_gpus_than_the_project_policy_allows(client_as, org, jupyterlab):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=Decimal("1"))
    response = client_as(org.researcher).post(
        "/workspaces/new/", _form(jupyterlab, project=org.project_a.pk, gpus="2")
    )
    assert response.status_code == 200
    assert "max GPUs per workload" in " ".join(response.context["form"].errors["gpus"])
    assert not Workload.objects.exists()


def test_a_template_fixes_the_environment_and_the_resources(org, jupyterlab):
    template = WorkspaceTemplate.objects.create(
        project=org.project_a, name="big", environment=jupyterlab,
        cpu=Decimal("4"), memory_mib=16384, node_pool=org.pool,
    )  # fmt: skip
    from workspaces.forms import LaunchForm

    form = LaunchForm(
        {**_form(jupyterlab, project=org.project_a.pk), "environment": "", "template": template.pk},
        projects=org.project_a.department.projects.all(),
    )
    assert form.is_valid(), form.errors
    request = form.launch_request()
    assert (request.environment, request.cpu, request.memory_mib) == (jupyterlab, 4, 16384)
    assert request.node_pool == org.pool


def test_a_template_over_the_project_policy_is_refused_on_the_template_field(
    client_as, org, jupyterlab
):
    """The page hides the resource fields while a template is chosen: the refusal must
    show where the researcher looks."""
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=Decimal("1"))
    template = WorkspaceTemplate.objects.create(
        project=org.project_a, name="two-gpus", environment=jupyterlab, gpus=Decimal("2")
    )
    form = {**_form(jupyterlab, project=org.project_a.pk), "template": template.pk}
    response = client_as(org.researcher).post("/workspaces/new/", form)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert "at most 1 are allowed" in " ".join(errors["template"])
    assert "gpus" not in errors
    assert not Workload.objects.exists()


@pytest.mark.parametrize(
    ("persona", "page_status", "keep_status"),
    [("researcher", 200, 302), ("dept_admin", 200, 302), ("outsider", 404, 404)],
)
def test_workspace_pages_answer_each_persona(client_as, org, persona, page_status, keep_status):
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    client = client_as(getattr(org, persona))
    assert client.get(f"/workspaces/{workspace.workload_id}/").status_code == page_status
    assert client.get(f"/workspaces/{workspace.workload_id}/status/").status_code == page_status
    keep = client.post(f"/workspaces/{workspace.workload_id}/keep-running/")
    assert keep.status_code == keep_status
    listed = client.get("/workspaces/")
    assert (b"lab" in listed.content) == (page_status == 200)


def test_only_researchers_of_the_project_may_launch_there(org, jupyterlab):
    from django.core.exceptions import PermissionDenied

    with pytest.raises(PermissionDenied):
        workspace_launch(
            actor=org.outsider,
            project=org.project_a,
            request=LaunchRequest(name="x", environment=jupyterlab),
        )


def test_the_owner_launches_a_stopped_workspace_again_with_its_settings_and_its_folder(
    client_as, org, jupyterlab, settings, tmp_path
):
    """Culled overnight: the next morning "Launch again" fills the form in as before, under
    a free name, and opens the old workspace's folder on the local backend (its notebooks)."""
    settings.VAR_DIR = tmp_path
    old = workspace_launch(
        actor=org.researcher, project=org.project_a,
        request=LaunchRequest(name="lab", environment=jupyterlab, cpu=Decimal("2"),
                              memory_mib=3072, env={"WANDB_MODE": "offline"}),
    )  # fmt: skip
    Workload.objects.filter(pk=old.pk).update(state="stopped")
    folder = tmp_path / "workloads" / str(old.pk)
    folder.mkdir(parents=True)
    (folder / "analysis.ipynb").write_text("{}")
    client = client_as(org.researcher)
    assert 'id="launch-again"' in client.get(f"/workspaces/{old.pk}/").content.decode()

    page = client.get(f"/workspaces/new/?from={old.pk}")
    form = page.context["form"]
    values = {name: form[name].value() for name in form.fields}
    assert (values["name"], values["environment"], values["cpu"]) == ("lab-2", jupyterlab.pk, 2)
    assert (values["memory_gib"], values["env"]) == (3, "WANDB_MODE=offline")
    assert values["data_volume"] == str(folder) and old.token not in page.content.decode()

    data = {k: v for k, v in values.items() if v is not None and k != "template"}
    assert client.post("/workspaces/new/", data).status_code == 302
    new = Workspace.objects.exclude(pk=old.pk).get()
    assert new.workload.name == "lab-2" and new.token != old.token
    assert f"--ServerApp.root_dir={folder}" in new.workload.command
    assert "JUPYTER_TOKEN" not in new.workload.env


def test_only_the_owner_may_launch_a_workspace_again(client_as, org, jupyterlab):
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    assert client_as(org.dept_admin).get(f"/workspaces/new/?from={workspace.pk}").status_code == 403
    assert client_as(org.outsider).get(f"/workspaces/new/?from={workspace.pk}").status_code == 404


def test_templates_of_a_disabled_environment_are_not_offered(client_as, org, jupyterlab):
    WorkspaceTemplate.objects.create(project=org.project_a, name="cpu-box", environment=jupyterlab)
    client = client_as(org.researcher)
    assert "cpu-box" in client.get("/workspaces/new/").content.decode()
    jupyterlab.enabled = False
    jupyterlab.save()
    assert "cpu-box" not in client.get("/workspaces/new/").content.decode()


def test_the_launch_form_comes_in_sections_and_explains_the_image_per_backend(client_as, org):
    cluster = Cluster.objects.create(name="here", backend=Backend.LOCAL)
    Node.objects.create(cluster=cluster, name="box", pool=org.pool, cpu_cores=8, memory_mib=8192)
    response = client_as(org.researcher).get("/workspaces/new/")
    page = response.content.decode()
    for section in ("General", "Environment", "Compute", "Data", "Scheduling"):
        assert f"<legend>{section}</legend>" in page
    assert response.context["image_help"] == [
        "The local machine does not use the image: the command runs in this host's own "
        "environment (its Python and packages), in a sandbox."
    ]
    assert '<details class="advanced">' in page and 'id="row-env"' in page
