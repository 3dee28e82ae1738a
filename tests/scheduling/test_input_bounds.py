"""Bad input never hurts anyone else: a field's size is checked before anything splits or
parses it, JSON values a workload stores are bounded, names are matched whole, and an
environment holds strings only."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

import scheduling.forms
from clusters.agent.miglayout import LayoutInvalid, layout_decode
from clusters.mig import mig_limits
from clusters.models import NodePool
from portal.errors import ValidationFailed
from portal.models import Project, k8s_name_validator
from portal.services.organisation import node_pool_create
from scheduling import bounds, specs, sweeps
from scheduling.models import Workload
from workspaces.forms import EnvironmentForm, LaunchForm

pytestmark = pytest.mark.django_db
MEGABYTE_COMMAND = "python train.py " + "x " * 500_000


@pytest.fixture
def api(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    return client


@pytest.fixture
def splits(monkeypatch):
    """Every call of shlex.split, counted: what a megabyte of text costs is its split."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return split(*args, **kwargs)

    split = shlex.split
    monkeypatch.setattr(shlex, "split", counting)
    return calls


def training(**extra):
    return {"project": "ml-vision", "kind": "training", "name": "job", "image": "img", **extra}


def post(api, body):
    return api.post("/api/v1/workloads/", body, format="json")


@pytest.mark.parametrize("field", ["command", "args"])
def test_a_megabyte_command_line_is_refused_naming_the_field_without_being_split(
    api, cluster, splits, field
):
    response = post(api, training(**{field: MEGABYTE_COMMAND}))

    assert response.status_code == 400
    assert response.json() == {
        field: [f"Keep it under {bounds.PROGRAM_TEXT_MAX} characters in all."]
    }
    assert splits == []
    assert not Workload.objects.exists()


def test_a_megabyte_environment_is_refused_before_it_is_read(api, cluster, monkeypatch):
    read = []
    monkeypatch.setattr(specs, "_as_env", lambda value, errors: read.append(value) or {})
    text = "\n".join(f"V{i}=" + "x" * 100 for i in range(10_000))

    response = post(api, training(env=text))

    assert response.status_code == 400
    assert list(response.json()) == ["env"]
    assert read == [None]  # read as absent: the text never reached the line splitting


def test_a_megabyte_list_of_empty_words_is_refused_too(api, cluster):
    response = post(api, training(command=[""] * 400_000))
    assert response.status_code == 400 and list(response.json()) == ["command"]


@pytest.mark.parametrize("field", ["image", "gpu_model", "checkpoint_dir", "node_pools", "ports"])
def test_any_other_field_of_a_megabyte_is_refused_naming_it(api, cluster, field):
    response = post(api, training(**{field: "x" * 1_000_000}))
    assert response.status_code == 400
    assert response.json() == {field: [f"Keep it under {bounds.FIELD_TEXT_MAX} characters in all."]}


def test_a_command_line_of_ordinary_size_is_still_split(api, cluster, splits):
    response = post(api, training(command="python train.py --lr 0.1", env={"SEED": "1"}))
    assert response.status_code == 201, response.content
    assert response.json()["command"] == ["python", "train.py", "--lr", "0.1"]
    assert len(splits) == 1


def test_the_form_refuses_a_megabyte_command_without_splitting_it(client_as, org, splits):
    response = client_as(org.researcher).post(
        "/workloads/new/training/",
        {"project": org.project_a.pk, "name": "big", "image": "img", "gpu_request": "whole",
         "gpus": "1", "cpu": "1", "memory_mib": "1024", "command": MEGABYTE_COMMAND},
    )  # fmt: skip
    assert response.status_code == 200
    assert response.context["form"].errors["command"] == [
        f"Keep it under {bounds.PROGRAM_TEXT_MAX} characters in all."
    ]
    assert splits == [] and not Workload.objects.exists()


def test_an_environments_command_is_bounded_before_it_is_split(splits):
    form = EnvironmentForm(
        data={"name": "big", "image": "img", "tool_kind": "jupyterlab", "port": 8888,
              "default_gpus": 0, "default_cpu": 1, "default_memory_mib": 1024,
              "command_line": MEGABYTE_COMMAND}
    )  # fmt: skip
    assert not form.is_valid()
    assert "command_line" in form.errors and splits == []


def test_a_workspaces_environment_variables_are_bounded_before_they_are_split(org):
    form = LaunchForm(data={"env": "A=" + "x" * 1_000_000}, projects=Project.objects.all())
    assert not form.is_valid()
    assert "at most" in form.errors["env"][0]


# --- JSON values a workload stores and returns in every list ----------------------------------
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"notes": "x" * 100_000}, "Keep it under"),
        ({"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}, "Nest at most"),
        ({f"k{i}": 0 for i in range(1001)}, "at most 1000 keys"),
        ({"lr": [0] * 1001}, "at most 1000 keys"),
    ],
)
def test_params_are_bounded_in_size_depth_and_items_naming_the_field(api, cluster, params, message):
    response = post(api, training(params=params))
    assert response.status_code == 400
    assert list(response.json()) == ["params"]
    assert message in response.json()["params"][0]


def test_params_of_ordinary_size_are_kept(api, cluster):
    response = post(api, training(params={"lr": 0.1, "layers": [64, 64]}))
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["params"] == {"lr": 0.1, "layers": [64, 64]}


def hpo(parameters):
    search = {"method": "random", "parameters": parameters, "trials": 2}
    return training(kind="hpo", name="sweep", search=search)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"lr": ["x" * 100_000]}, "Keep it under"),  # once a megabyte, in every trial
        ({"lr": [0] * 1001}, "keys and values"),  # random search draws only 2 of them
        ({"lr": [[[[[[1]]]]]]}, "Nest at most"),
    ],
)
def test_a_sweeps_values_are_bounded_naming_the_field(api, cluster, parameters, message):
    response = post(api, hpo(parameters))
    assert response.status_code == 400
    assert list(response.json()) == ["search"]
    assert message in response.json()["search"][0]
    assert not Workload.objects.exists()


def test_a_sweep_of_ordinary_values_still_makes_its_trials(api, cluster):
    response = post(api, hpo({"lr": [0.1, 0.01], "layers": [[64, 64], [128]]}))
    assert response.status_code == 201, response.content
    trials = Workload.objects.filter(parent_id=response.json()["id"])
    assert trials.count() == 2


def test_the_forms_search_parameters_are_bounded_before_they_are_parsed(
    client_as, org, monkeypatch
):
    parsed = []
    spy = SimpleNamespace(loads=lambda text: parsed.append(text) or {}, dumps=json.dumps,
                          JSONDecodeError=json.JSONDecodeError)  # fmt: skip
    monkeypatch.setattr(scheduling.forms, "json", spy)
    response = client_as(org.researcher).post(
        "/workloads/new/hpo/",
        {"project": org.project_a.pk, "name": "sweep", "image": "img", "gpu_request": "whole",
         "gpus": "1", "cpu": "1", "memory_mib": "1024", "search_method": "grid",
         "parameters": json.dumps({"lr": list(range(200_000))})},
    )  # fmt: skip
    assert response.status_code == 200
    assert "parameters" in response.context["form"].errors
    assert parsed == []


# --- Names are matched whole -------------------------------------------------------------------
def test_a_workload_name_with_a_trailing_newline_is_refused_where_specs_judge_it(cluster):
    _, errors = specs.clean_spec("training", "job\n", {"image": "img"})
    assert errors == {"name": [specs.NAME_HELP]}


def test_the_kubernetes_name_validator_refuses_a_trailing_newline():
    k8s_name_validator("ml-vision")
    with pytest.raises(ValidationError):
        k8s_name_validator("ml-vision\n")


def test_a_node_pool_name_with_a_trailing_newline_is_refused(org):
    with pytest.raises(ValidationFailed) as refused:
        node_pool_create(actor=org.platform_admin, name="h100\n")
    assert list(refused.value.errors) == ["name"]
    assert not NodePool.objects.filter(name__startswith="h100").exists()


def test_a_mig_profile_or_layout_id_with_a_trailing_newline_is_not_one():
    assert mig_limits("1g.10gb")["compute_slices"] == 1
    assert mig_limits("1g.10gb\n")["compute_slices"] == 0
    with pytest.raises(LayoutInvalid, match="no layout id"):
        layout_decode(json.dumps({"id": "0123abcd\n", "owner": "x", "destroy": False}))


def test_an_environment_variable_name_with_a_trailing_newline_is_refused(api, cluster):
    response = post(api, training(env={"SEED\n": "1"}))
    assert response.status_code == 400
    assert response.json() == {"env": ["Not valid variable names: SEED\n."]}


def test_a_port_name_with_a_trailing_newline_is_refused(api, cluster):
    response = post(api, training(ports=[{"name": "http\n", "port": 8000}]))
    assert response.status_code == 400
    assert "Not a port name" in response.json()["ports"][0]


def test_a_sweep_parameter_name_with_a_trailing_newline_is_refused():
    errors: dict = {}
    sweeps.clean_search({"method": "grid", "parameters": {"lr\n": [1, 2]}}, errors)
    assert "not a valid variable name" in errors["search"][0]


# --- Environment values are strings --------------------------------------------------------------
@pytest.mark.parametrize("value", [None, {"a": 1}, ["x"], 1, 0.5, True])
def test_an_environment_value_that_is_not_a_string_is_refused_naming_the_field(api, cluster, value):
    response = post(api, training(env={"SEED": "1", "BAD": value}))
    assert response.status_code == 400
    assert response.json() == {"env": ["Give each value as a string (in quotes): BAD."]}


def test_string_environment_values_are_kept_as_given(api, cluster):
    response = post(api, training(env={"SEED": "1", "EMPTY": "", "JSON": '{"a": 1}'}))
    assert response.status_code == 201, response.content
    assert response.json()["env"] == {"SEED": "1", "EMPTY": "", "JSON": '{"a": 1}'}
