"""Every number a submission carries is bounded where it enters: the API, the forms, the
services. Each test here was a 500 (or a poison row that stopped every cycle) before."""

from __future__ import annotations

import json
import sys
from decimal import Decimal

import pytest
from click.testing import CliRunner
from django.db.models import DecimalField, IntegerField
from rest_framework.test import APIClient

from clusters.models import Gpu, Node
from portal.errors import ValidationFailed
from portal.models import DepartmentQuota, Project, ProjectQuota
from scheduling import bounds
from scheduling.cli import main
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy, WorkloadState
from tests import factories as f
from tests.scheduling.conftest import make_nodes
from workspaces.forms import EnvironmentForm, IdlePolicyForm, TemplateForm
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate
from workspaces.services import LaunchRequest, workspace_launch

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    return client


def training(**extra):
    return {"project": "ml-vision", "kind": "training", "name": "job", "image": "img", **extra}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu", 100000),
        ("cpu", "12345678901234567890"),
        ("gpus", 1000000000),
        ("gpus", "12345678901234567890"),
        ("memory_mib", 10**20),
        ("memory_mib", 2**31),
        ("gpu_memory_mib", 10**20),
        ("max_runtime_s", 10**20),
        ("max_runtime_s", 2**31),
        ("duration_s", 10**20),
        ("cpu", "1e999999"),
    ],
)
def test_the_api_refuses_a_number_no_column_or_node_can_hold_naming_the_field(
    api, org, field, value
):
    body = training(**{field: value})
    if field == "gpu_memory_mib":
        body["gpu_request"] = "memory"
    response = api.post("/api/v1/workloads/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Workload.objects.exists()


def test_a_stored_submission_is_accepted_by_the_next_cycle(api, org, cluster):
    response = api.post("/api/v1/workloads/", training(cpu="9.5", gpus=1), format="json")
    assert response.status_code == 201, response.content
    cycle_run()
    assert Workload.objects.get().state == WorkloadState.ADMITTED


@pytest.mark.parametrize("key", ["actor", "service", "project_id", "state"])
def test_unknown_body_keys_are_refused_not_passed_to_the_service(api, org, key):
    response = api.post("/api/v1/workloads/", training(**{key: "x"}), format="json")
    assert response.status_code == 400, response.content
    assert key in json.dumps(response.json())
    assert not Workload.objects.exists()


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("url", "authenticated"),
    [("/api/v1/workloads/", True), ("/api/v1/auth/token", False), ("/api/v1/workspaces/", True)],
)
def test_deeply_nested_json_is_a_400_even_for_anonymous_callers(org, url, authenticated):
    client = APIClient()
    if authenticated:
        client.force_authenticate(org.researcher)
    body = '{"project": ' + deep(5000) + "}"
    response = client.post(url, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "nest" in response.json()["detail"]


def test_the_token_endpoint_still_takes_ordinary_json(org):
    org.researcher.set_password("pw-123456")
    org.researcher.save()
    body = {"username": org.researcher.username, "password": "pw-123456"}
    response = APIClient().post("/api/v1/auth/token", body, format="json")
    assert response.status_code == 200, response.content


def test_more_gpus_than_the_largest_node_of_the_pool_is_refused_naming_node_and_pool(api, org):
    cpu_pool = f.make_pool("cpu-only")
    make_nodes(cpu_pool, 2, gpus=0, cluster_name="cpu")
    response = api.post(
        "/api/v1/workloads/", training(gpus=4, node_pools=["cpu-only"]), format="json"
    )
    assert response.status_code == 400, response.content
    message = response.json()["gpus"][0]
    assert "cpu-only" in message and "cpu-only-node-0" in message and "0 GPUs" in message


def test_a_request_that_fits_no_node_of_any_pool_is_refused_at_submit(api, org, cluster):
    for field, value in (("memory_mib", 600 * 1024), ("cpu", 65), ("gpus", 5)):
        response = api.post("/api/v1/workloads/", training(**{field: value}), format="json")
        assert response.status_code == 400, (field, response.content)
        message = response.json()[field][0]
        assert "a100-node-0" in message and "a100" in message
    assert not Workload.objects.exists()


def test_gpu_memory_beyond_the_largest_gpu_is_refused(api, org, cluster):
    body = training(gpu_request="memory", gpu_memory_mib=81921)
    response = api.post("/api/v1/workloads/", body, format="json")
    assert response.status_code == 400
    assert "81920" in response.json()["gpu_memory_mib"][0]


def test_the_gpu_model_wish_narrows_the_nodes_considered(api, org, cluster):
    h100 = f.make_pool("h100")
    node = make_nodes(h100, 1, gpus=8, cluster_name="h")[0]
    Gpu.objects.filter(node=node).update(model="H100")
    body = training(gpus=8, gpu_model="A100")
    response = api.post("/api/v1/workloads/", body, format="json")
    assert response.status_code == 400
    assert "a100-node-0" in response.json()["gpus"][0]
    assert api.post("/api/v1/workloads/", training(gpus=8), format="json").status_code == 201


def test_a_pool_with_no_nodes_yet_keeps_the_static_bounds_only(api, org):
    # Nothing synced yet: the inventory cannot say what fits, the column bounds still hold.
    assert not Node.objects.exists()
    response = api.post("/api/v1/workloads/", training(gpus=8, cpu=128), format="json")
    assert response.status_code == 201, response.content


def test_a_gang_whose_pods_fit_no_node_is_refused_per_pod(api, org, cluster):
    body = {**training(gpus=4), "kind": "distributed", "workers": 3}
    assert api.post("/api/v1/workloads/", body, format="json").status_code == 201
    body = {**training(gpus=5, name="big"), "kind": "distributed", "workers": 3}
    assert api.post("/api/v1/workloads/", body, format="json").status_code == 400


def test_policy_numbers_are_bounded(org):
    client = APIClient()
    client.force_authenticate(org.dept_admin)
    url = f"/api/v1/policies/project/{org.project_a.pk}/"
    for field in ("max_runtime_s", "default_runtime_s", "termination_grace_s"):
        response = client.put(url, {field: 10**20}, format="json")
        assert response.status_code == 400, (field, response.content)
        assert field in response.json()


def test_the_training_form_shows_a_field_error_for_a_huge_cpu(client_as, org):
    client = client_as(org.researcher)
    data = {"project": org.project_a.pk, "name": "big", "image": "img", "gpu_request": "whole",
            "gpus": "0", "cpu": "100000", "memory_mib": "1024"}  # fmt: skip
    response = client.post("/workloads/new/training/", data)
    assert response.status_code == 200
    assert "cpu" in response.context["form"].errors
    for field, value in (("memory_mib", str(10**20)), ("max_runtime_s", str(10**20))):
        response = client.post("/workloads/new/training/", {**data, "cpu": "1", field: value})
        assert field in response.context["form"].errors, field
    assert not Workload.objects.exists()


@pytest.fixture
def jupyterlab(db):
    return Environment.objects.create(
        name="JupyterLab", image="img", command=[sys.executable, "-m", "jupyter", "lab"]
    )


def test_the_workspace_form_bounds_its_numbers(client_as, org, jupyterlab):
    client = client_as(org.researcher)
    data = {"project": org.project_a.pk, "environment": jupyterlab.pk, "name": "lab",
            "gpu_request": "whole", "gpus": "0", "gpu_memory_gib": "0", "cpu": "1",
            "memory_gib": "2", "env": ""}  # fmt: skip
    for field, value in (("cpu", "100000"), ("memory_gib", str(2**22)), ("gpus", "1000000000")):
        response = client.post("/workspaces/new/", {**data, field: value})
        assert response.status_code == 200, field
        assert field in response.context["form"].errors, field
    assert not Workload.objects.exists()


def test_the_workspace_api_bounds_its_numbers(api, org, jupyterlab):
    body = {"project": "ml-vision", "environment": "JupyterLab", "name": "lab"}
    for field, value in (("cpu", 100000), ("memory_mib", 10**20), ("gpu_memory_mib", 10**20)):
        response = api.post("/api/v1/workspaces/", {**body, field: value}, format="json")
        assert response.status_code == 400, (field, response.content)
        assert field in response.json()


def test_a_workspace_larger_than_every_node_is_refused(org, jupyterlab, cluster):
    request = LaunchRequest(
        name="lab", environment=jupyterlab, memory_mib=10**6, node_pool=org.pool
    )
    with pytest.raises(ValidationFailed) as refused:
        workspace_launch(actor=org.researcher, project=org.project_a, request=request)
    assert "memory_mib" in refused.value.errors


def test_the_service_itself_refuses_out_of_range_values(org, submit):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "x", cpu=Decimal("100000"), pods=1)
    assert "cpu" in refused.value.errors


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["submit", "training", "x", "--image", "i", "--cpu", "100000"], "--cpu"),
        (["submit", "training", "x", "--image", "i", "--gpus", "1000000000"], "--gpus"),
        (["submit", "training", "x", "--image", "i", "--memory", "9" * 25], "--memory"),
        (["submit", "training", "x", "--image", "i", "--max-runtime", "9" * 25], "--max-runtime"),
        (["submit", "distributed", "x", "--image", "i", "--workers", "9" * 25], "--workers"),
        (["submit", "inference", "x", "--image", "i", "--port", "70000"], "--port"),
        (["submit", "workspace", "x", "--gpu-memory", "9" * 25], "--gpu-memory"),
        (["logs", "1", "--tail", "0"], "--tail"),
        (["stop", "9" * 25], "WORKLOAD_ID"),
    ],
)
def test_the_cli_refuses_out_of_bounds_numbers_before_sending_anything(
    tmp_path, monkeypatch, args, option
):
    monkeypatch.setenv("GPUPOOL_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_URL", "http://127.0.0.1:9")  # nothing listens: never reached
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "Enter a" in result.output


def test_the_workspace_admin_forms_bound_their_numbers(org):
    idle = IdlePolicyForm(
        {"scope": "platform", "warn_after_min": str(10**20), "stop_after_min": "0",
         "gpu_util_threshold_pct": "5"},
        scopes=[("platform", "Platform")],
    )  # fmt: skip
    assert {"warn_after_min", "stop_after_min"} <= set(idle.errors)
    environment = EnvironmentForm(
        {"name": "lab", "image": "img", "tool_kind": "jupyterlab", "port": "70000",
         "default_gpus": "0", "default_cpu": "100000", "default_memory_mib": str(10**20),
         "command_line": "jupyter lab", "enabled": "on"}
    )  # fmt: skip
    assert {"port", "default_cpu", "default_memory_mib"} <= set(environment.errors)
    template = TemplateForm(
        {"project": org.project_a.pk, "name": "t", "gpu_request": "whole", "gpus": "0",
         "gpu_memory_mib": "0", "cpu": "1", "memory_mib": str(2**40)},
        projects=Project.objects.all(),
    )  # fmt: skip
    assert "memory_mib" in template.errors


def test_a_pod_must_fit_one_node_whole_not_the_best_of_each_resource(api, org):
    mixed = f.make_pool("mixed")
    gpu_node, cpu_node = make_nodes(mixed, 2, gpus=8, cluster_name="mixed")
    Node.objects.filter(pk=gpu_node.pk).update(cpu_cores=16)
    Gpu.objects.filter(node=cpu_node).delete()
    body = training(gpus=8, cpu=64, node_pools=["mixed"])
    response = api.post("/api/v1/workloads/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "non_field_errors": ["No single node of pool mixed has all this pod asks for at once."]
    }
    assert api.post("/api/v1/workloads/", {**body, "cpu": 16}, format="json").status_code == 201


def test_a_node_that_reports_no_cpu_or_memory_is_not_held_against_a_request(api, org):
    node = make_nodes(org.pool, 1, gpus=4)[0]
    Node.objects.filter(pk=node.pk).update(cpu_cores=0, memory_mib=0)
    body = training(gpus=4, cpu=1000, memory_mib=10**7)
    assert api.post("/api/v1/workloads/", body, format="json").status_code == 201


def test_nodes_of_disabled_clusters_do_not_count(api, org, cluster):
    big = make_nodes(org.pool, 1, gpus=16, cluster_name="off")[0]
    big.cluster.enabled = False
    big.cluster.save()
    response = api.post("/api/v1/workloads/", training(gpus=16), format="json")
    assert response.status_code == 400
    assert "has 4 GPUs" in response.json()["gpus"][0]


def test_the_program_text_is_bounded(api, org):
    for field, value in (
        ("command", ["x" * 70_000]),
        ("args", ["a"] * 70_000),
        ("env", {"BIG": "v" * 70_000}),
    ):
        response = api.post("/api/v1/workloads/", training(**{field: value}), format="json")
        assert response.status_code == 400, field
        assert list(response.json()) == [field]


COLUMNS = [
    (Workload, "gpus", bounds.GPUS),
    (Workload, "cpu", bounds.CPU),
    (Workload, "memory_mib", bounds.MEMORY_MIB),
    (Workload, "gpu_memory_mib", bounds.GPU_MEMORY_MIB),
    (Workload, "pods", bounds.PODS),
    (Workload, "min_pods", bounds.PODS),
    (Workload, "max_runtime_s", bounds.RUNTIME_S),
    (Workload, "checkpoint_interval_s", bounds.CHECKPOINT_INTERVAL_S),
    (Workload, "pids_max", bounds.PIDS_MAX),
    (WorkloadPolicy, "max_gpus_per_workload", bounds.POLICY_GPUS),
    (WorkloadPolicy, "default_runtime_s", bounds.RUNTIME_S),
    (WorkloadPolicy, "max_runtime_s", bounds.RUNTIME_S),
    (WorkloadPolicy, "termination_grace_s", bounds.GRACE_S),
    (DepartmentQuota, "gpus", bounds.QUOTA),
    (ProjectQuota, "memory_gib_limit", bounds.QUOTA),
    (Environment, "port", bounds.PORT),
    (Environment, "default_gpus", bounds.GPUS),
    (Environment, "default_cpu", bounds.CPU),
    (Environment, "default_memory_mib", bounds.MEMORY_MIB),
    (WorkspaceTemplate, "gpus", bounds.GPUS),
    (WorkspaceTemplate, "cpu", bounds.CPU),
    (WorkspaceTemplate, "memory_mib", bounds.MEMORY_MIB),
    (WorkspaceTemplate, "gpu_memory_mib", bounds.GPU_MEMORY_MIB),
    (IdlePolicy, "warn_after_min", bounds.IDLE_MINUTES),
    (IdlePolicy, "stop_after_min", bounds.IDLE_MINUTES),
]


@pytest.mark.parametrize(("model", "name", "bound"), COLUMNS)
def test_every_bound_fits_the_column_it_guards_on_every_database(model, name, bound):
    field = model._meta.get_field(name)
    if isinstance(field, DecimalField):
        assert bound.places <= field.decimal_places
        assert len(str(int(bound.high))) <= field.max_digits - field.decimal_places
    else:  # PostgreSQL's integer is the narrowest of the databases
        assert isinstance(field, IntegerField) and field.get_internal_type() != "BigIntegerField"
        assert bound.low >= 0 and bound.high <= bounds.INT32_MAX


def test_one_mistake_gets_one_message(client_as, org):
    """A number too large for its field once got two messages ("Ensure this value is less
    than or equal to 256" and "no more than 3 digits before the decimal point")."""
    client = client_as(org.researcher)
    data = {"project": org.project_a.pk, "name": "big", "image": "img", "gpu_request": "whole",
            "gpus": "1000", "cpu": "1", "memory_mib": "1024"}  # fmt: skip
    response = client.post("/workloads/new/training/", data)
    assert len(response.context["form"].errors["gpus"]) == 1, response.context["form"].errors
