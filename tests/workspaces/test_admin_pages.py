"""Environments, project templates and idle policies: who may set them, and the audit."""

from __future__ import annotations

import pytest

from portal.models import AuditLog
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate
from workspaces.selectors import idle_policy_for


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 403), ("researcher", 403), ("outsider", 403)],
)
def test_only_platform_admins_open_the_environments_page(client_as, org, persona, status):
    assert client_as(getattr(org, persona)).get("/workspaces/environments/").status_code == status


def test_a_platform_admin_defines_an_environment_with_an_audit_row(client_as, org):
    response = client_as(org.platform_admin).post(
        "/workspaces/environments/new/",
        {"name": "PyTorch", "image": "pytorch:2", "tool_kind": "jupyterlab", "port": "8888",
         "command_line": "jupyter lab", "default_gpus": "1", "default_cpu": "4",
         "default_memory_mib": "16384", "enabled": "on"},
    )  # fmt: skip
    assert response.status_code == 302
    environment = Environment.objects.get(name="PyTorch")
    assert environment.command == ["jupyter", "lab"]
    assert AuditLog.objects.get(action="environment.save").actor == org.platform_admin


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 403), ("outsider", 403)],
)
def test_admins_open_the_template_and_policy_pages(client_as, org, persona, status):
    client = client_as(getattr(org, persona))
    assert client.get("/workspaces/templates/").status_code == status
    assert client.get("/workspaces/idle-policies/").status_code == status


def test_a_department_admin_adds_a_template_to_a_project_of_the_department(client_as, org):
    environment = Environment.objects.create(name="Lab", image="lab", command=["jupyter", "lab"])
    client = client_as(org.dept_admin)
    data = {"project": org.project_a.pk, "name": "one-gpu", "environment": environment.pk,
            "gpu_request": "whole", "gpus": "1", "gpu_memory_mib": "0", "cpu": "4",
            "memory_mib": "16384"}  # fmt: skip
    assert client.post("/workspaces/templates/", data).status_code == 302
    assert WorkspaceTemplate.objects.get().project == org.project_a
    # A project of another department is not offered.
    refused = client.post("/workspaces/templates/", {**data, "project": org.project_b.pk})
    assert refused.status_code == 200 and "project" in refused.context["form"].errors
    assert AuditLog.objects.filter(action="workspace_template.save").count() == 1


def test_the_project_idle_policy_wins_over_the_department_and_the_platform(client_as, org):
    admin = client_as(org.platform_admin)
    form = {"warn_after_min": "60", "stop_after_min": "120", "gpu_util_threshold_pct": "5"}
    admin.post("/workspaces/idle-policies/", {**form, "scope": "platform"})
    assert idle_policy_for(org.project_a).stop_after_min == 120
    dana = client_as(org.dept_admin)
    dana.post("/workspaces/idle-policies/",
              {**form, "scope": f"department:{org.dept_a.pk}", "stop_after_min": "90"})  # fmt: skip
    assert idle_policy_for(org.project_a).stop_after_min == 90
    dana.post("/workspaces/idle-policies/",
              {**form, "scope": f"project:{org.project_a.pk}", "stop_after_min": "30",
               "warn_after_min": "10"})  # fmt: skip
    assert idle_policy_for(org.project_a).stop_after_min == 30
    assert idle_policy_for(org.project_a2).stop_after_min == 90
    assert idle_policy_for(org.project_b).stop_after_min == 120
    assert AuditLog.objects.filter(action="idle_policy.set").count() == 3


def test_a_department_admin_cannot_set_another_departments_policy(client_as, org):
    response = client_as(org.dept_admin).post(
        "/workspaces/idle-policies/",
        {"scope": f"department:{org.dept_b.pk}", "warn_after_min": "1", "stop_after_min": "2",
         "gpu_util_threshold_pct": "5"},
    )  # fmt: skip
    assert response.status_code == 200 and "scope" in response.context["form"].errors
    assert not IdlePolicy.objects.exists()


def test_a_policy_must_warn_before_it_stops(client_as, org):
    response = client_as(org.platform_admin).post(
        "/workspaces/idle-policies/",
        {"scope": "platform", "warn_after_min": "50", "stop_after_min": "10",
         "gpu_util_threshold_pct": "5"},
    )  # fmt: skip
    assert "warn_after_min" in response.context["form"].errors
    assert not IdlePolicy.objects.exists()


def test_an_environment_of_another_tool_must_take_the_port_the_portal_gives(client_as, org):
    form = {"name": "TensorBoard", "image": "tb:2", "tool_kind": "tensorboard", "port": "6006",
            "command_line": "tensorboard --logdir .", "default_gpus": "0", "default_cpu": "1",
            "default_memory_mib": "2048", "enabled": "on"}  # fmt: skip
    refused = client_as(org.platform_admin).post("/workspaces/environments/new/", form)
    assert refused.status_code == 200
    assert "$(GPUPOOL_PORT)" in " ".join(refused.context["form"].errors["command_line"])
    assert not Environment.objects.exists()
    form["command_line"] = "tensorboard --logdir . --port $(GPUPOOL_PORT) --path_prefix {base_url}"
    assert (
        client_as(org.platform_admin).post("/workspaces/environments/new/", form).status_code == 302
    )
    assert Environment.objects.get().command[-3:] == [
        "$(GPUPOOL_PORT)",
        "--path_prefix",
        "{base_url}",
    ]
