"""A workload's processes per pod (`pids_max`, issue 27): bounded once (scheduling.specs,
bounds.PIDS_MAX), taken from the form, the API and the CLI, shown back; a local pod's cgroup
gets it, up to the cluster's own `pids_max` (tests/clusters/test_local_limits.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusters.backends import cgroups
from scheduling import bounds
from scheduling.cli import main
from scheduling.forms import initial_from
from scheduling.models import Workload
from scheduling.specs import clean_spec
from tests.scheduling.test_bounds import training
from tests.scheduling.test_checkpoint_interval import api, form_data  # noqa: F401 - api
from tests.scheduling.test_cli import gp, logged_in  # noqa: F401 - the CLI's fixtures

pytestmark = pytest.mark.django_db
FIELD = "pids_max"
REFUSED = [15, 0, -1, 1_048_577, 2**31, "many", "64.5", True]
MESSAGE = "Enter a whole number from 16 to 1048576 processes."


@pytest.mark.parametrize("value", REFUSED)
def test_the_api_refuses_a_pids_max_out_of_bounds_naming_the_field(
    api,  # noqa: F811 - the fixture
    org,
    cluster,
    value,
):
    response = api.post("/api/v1/workloads/", training(**{FIELD: value}), format="json")
    assert response.status_code == 400
    assert list(response.json()) == [FIELD]
    assert not Workload.objects.exists()


@pytest.mark.parametrize("value", ["15", "1048577", "lots", "64.5"])
def test_the_form_shows_a_bad_pids_max_on_its_field(client_as, org, cluster, value):
    response = client_as(org.researcher).post(
        "/workloads/new/training/", form_data(org, **{FIELD: value})
    )
    assert response.status_code == 200
    assert list(response.context["form"].errors) == [FIELD]
    assert not Workload.objects.exists()


@pytest.mark.parametrize("value", [15, 1_048_577, "lots"])
def test_the_spec_bound_holds_whatever_the_entry(value):
    _, errors = clean_spec("training", "job", {"image": "img", FIELD: value})
    assert errors == {FIELD: [MESSAGE]}


def test_it_is_optional_and_the_clusters_when_empty(
    api,  # noqa: F811 - the fixture
    org,
    cluster,
):
    response = api.post("/api/v1/workloads/", training(**{FIELD: ""}), format="json")
    assert response.status_code == 201 and response.json()[FIELD] is None
    assert Workload.objects.get().pids_max is None


def test_it_round_trips_through_the_api_and_the_schema_says_its_bounds(
    api,  # noqa: F811 - the fixture
    org,
    cluster,
):
    created = api.post("/api/v1/workloads/", training(**{FIELD: 256}), format="json").json()
    assert api.get(f"/api/v1/workloads/{created['id']}/").json()[FIELD] == 256
    schema = api.get("/api/schema/?format=json").json()["components"]["schemas"]
    submitted = schema["SubmitSpec"]["properties"][FIELD]
    assert (submitted["minimum"], submitted["maximum"]) == (16, 1_048_576)
    assert FIELD in schema["Workload"]["properties"]


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_it_round_trips_through_the_form_the_page_and_clone(client_as, org, cluster, kind):
    client = client_as(org.researcher)
    extra = {"replicas": "1", "ports": "http:8000"} if kind == "inference" else {}
    response = client.post(f"/workloads/new/{kind}/", form_data(org, **extra, **{FIELD: "64"}))
    wl = Workload.objects.get(name="from-form")
    assert response.status_code == 302 and wl.pids_max == 64
    page = client.get(f"/workloads/{wl.pk}/").content.decode()
    assert "64, at most the cluster's limit" in page
    assert initial_from(wl)[FIELD] == 64
    assert client.get(f"/workloads/{wl.pk}/clone/").context["form"][FIELD].value() == 64


@pytest.mark.django_db(transaction=True)
def test_it_round_trips_through_the_cli(logged_in, org, cluster):  # noqa: F811
    logged_in("project", "set", "ml-vision")
    logged_in("submit", "training", "resnet", "--image", "img", "--pids-max", "128")
    assert Workload.objects.get(name="resnet").pids_max == 128


@pytest.mark.parametrize("value", ["8", "1048577", "lots"])
def test_the_cli_refuses_a_bad_pids_max_before_sending_anything(value):
    result = CliRunner().invoke(
        main, ["submit", "training", "x", "--image", "i", "--pids-max", value]
    )
    assert result.exit_code == 2
    assert "--pids-max" in result.output and MESSAGE in result.output


def test_the_pod_gets_the_workloads_pids_max_up_to_the_clusters():
    assert cgroups.limits_of(512, 0.5, None, 64).pids == 64
    assert cgroups.limits_of(512, 0.5, {"pids_max": 32}, 64).pids == 32  # the admin's ceiling
    assert cgroups.limits_of(512, 0.5, None, None).pids == 1024
    assert (int(bounds.PIDS_MAX.low), int(bounds.PIDS_MAX.high)) == cgroups.PIDS_MAX_BOUNDS
