"""Property: whatever numbers a submission carries, through the service, the API or the
forms, the outcome is either a refusal that names a field, or a stored row that the next
scheduling cycle reads and handles without error.

Each example runs in a savepoint that is rolled back, so examples never see each other.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from portal.errors import ValidationFailed
from scheduling import bounds
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_submit
from workspaces.models import Environment

pytestmark = pytest.mark.django_db

NUMBER_FIELDS = ("gpus", "cpu", "memory_mib", "gpu_memory_mib", "max_runtime_s", "duration_s",
                 "workers", "min_pods", "replicas", "ports", "checkpoint_interval_s")  # fmt: skip
# What a refusal may name besides the changed fields: no single node holds the whole pod.
IMPLIED = {"__all__", "non_field_errors"}

edge_numbers = st.sampled_from(
    [
        "",
        "0",
        "-0",
        "1",
        "0.5",
        "1.0001",
        "1e999999",
        "-1e999999",
        "NaN",
        "Infinity",
        "٣",
        "9" * 30,
        "9" * 5000,
        "0x10",
        " 7 ",
        "1_000",
        2**31,
        2**31 - 1,
        2**63,
        -(2**63),
        10**20,
        100000,
        99999.99,
        4096,
        65,
        0.1,
        1e308,
    ]
)
numbers = st.one_of(
    edge_numbers,
    st.integers(min_value=-(10**25), max_value=10**25),
    st.integers(min_value=-3, max_value=600),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.floats(allow_nan=False, allow_infinity=False),
)
# Anything JSON can carry, for the API and the service.
json_values = st.one_of(
    numbers,
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=70000), max_size=3),
    st.dictionaries(st.sampled_from(["port", "name"]), numbers, max_size=2),
)
# A valid submission of each kind and GPU request, of which the examples change a few
# fields: a spec wrong everywhere would only ever test the first refusal.
BASE = {
    "training": {},
    "distributed": {"workers": 2},
    "inference": {"replicas": 1, "ports": [8000]},
}
REQUEST = {
    "whole": {"gpus": 1},
    "fraction": {"gpus": "0.5"},
    "memory": {"gpu_memory_mib": 1024},
}


@st.composite
def specs(draw, values=json_values, fields=NUMBER_FIELDS):
    kind = draw(st.sampled_from(sorted(BASE)))
    request = draw(st.sampled_from(sorted(REQUEST)))
    changed = draw(st.dictionaries(st.sampled_from(fields), values, min_size=1, max_size=3))
    base = {"cpu": 1, "memory_mib": 1024, **BASE[kind], **REQUEST[request]}
    return {"kind": kind, "gpu_request": request, **base, **changed}, changed


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def rolled_back(check):
    """Run `check` in a savepoint that is always undone, so examples never meet."""
    with transaction.atomic():
        check()
        transaction.set_rollback(True)


def assert_names_fields(errors: dict, sent: dict) -> None:
    assert errors, "a refusal without a message"
    for field, messages in errors.items():
        assert field in sent or field in IMPLIED, (field, messages, sent)
        assert messages and all(isinstance(m, str) and m for m in messages)


def assert_the_cycle_takes_it(workload: Workload) -> None:
    """The stored row reads back within its bounds, and a cycle handles it."""
    workload = Workload.objects.get(pk=workload.pk)  # reading a bad DECIMAL raises here
    assert bounds.GPUS.check(workload.gpus)[1] is None
    assert bounds.CPU.check(workload.cpu)[1] is None
    assert bounds.MEMORY_MIB.check(workload.memory_mib)[1] is None
    assert bounds.PODS.check(workload.pods)[1] is None
    run = cycle_run()
    assert run is not None and run.ok, run and run.error
    workload.refresh_from_db()
    assert workload.state != WorkloadState.FAILED, workload.message


def post_and_check(org, url: str, body: dict, changed: dict) -> None:
    """POST as the researcher: a 400 naming a changed field, or a 201 whose row a cycle takes."""
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(org.researcher)
    response = client.post(url, json.dumps(body, default=str), content_type="application/json")
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert_names_fields(response.json(), changed)
    else:
        assert_the_cycle_takes_it(Workload.objects.get(pk=response.json()["id"]))


@PROPERTY
@given(example=specs())
def test_the_service_refuses_naming_a_field_or_stores_what_a_cycle_takes(org, cluster, example):
    spec, changed = example

    def check():
        kind = spec.pop("kind")
        try:
            workload = workload_submit(
                actor=org.researcher, project=org.project_a, kind=kind, name="prop",
                image="img", **spec,
            )  # fmt: skip
        except ValidationFailed as refused:
            assert_names_fields(refused.errors, changed)
        else:
            assert_the_cycle_takes_it(workload)

    rolled_back(check)


@PROPERTY
@given(example=specs())
def test_the_api_answers_400_naming_a_field_or_201_with_a_row_a_cycle_takes(org, cluster, example):
    spec, changed = example
    body = {"project": "ml-vision", "name": "prop", "image": "img", **spec}
    rolled_back(lambda: post_and_check(org, "/api/v1/workloads/", body, changed))


form_values = st.one_of(numbers.map(str), st.text(max_size=8))


def refused_for_nul(response, post: dict) -> bool:
    """A NUL character in a field is refused before any form sees it (a 400 naming the
    fields, portal.middleware): the page must name each such field."""
    nul = sorted(field for field, value in post.items() if "\x00" in str(value))
    if not nul:
        return False
    page = response.content.decode()
    assert response.status_code == 400 and all(field in page for field in nul), (nul, page)
    return True


def as_form_text(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


@PROPERTY
@given(example=specs(values=form_values))
def test_the_form_shows_a_field_error_or_queues_a_row_a_cycle_takes(
    client_as, org, cluster, example
):
    spec, changed = example
    client = client_as(org.researcher)
    client.raise_request_exception = False

    def check():
        kind = spec.pop("kind")
        post = {"project": org.project_a.pk, "name": "prop", "image": "img", "gpus": "0"}
        post.update({field: as_form_text(value) for field, value in spec.items()})
        response = client.post(f"/workloads/new/{kind}/", post)
        if refused_for_nul(response, post):
            return
        assert response.status_code in (200, 302)
        if response.status_code == 200:
            # A field the kind's form does not show is never read: nothing to refuse.
            assert_names_fields(dict(response.context["form"].errors), changed)
        else:
            assert_the_cycle_takes_it(Workload.objects.get(name="prop"))

    rolled_back(check)


@pytest.fixture
def lab(db):
    return Environment.objects.create(name="lab", image="img", command=["jupyter", "lab"])


@PROPERTY
@given(example=specs(fields=("gpus", "cpu", "memory_mib", "gpu_memory_mib")))
def test_the_workspace_api_refuses_naming_a_field_or_launches(org, cluster, lab, example):
    spec, changed = example
    request = spec["gpu_request"]
    body = {"project": "ml-vision", "environment": "lab", "name": "prop", "node_pool": "a100",
            "gpu_request": request, **REQUEST[request], **changed}  # fmt: skip
    rolled_back(lambda: post_and_check(org, "/api/v1/workspaces/", body, changed))


@PROPERTY
@given(
    gpu_request=st.sampled_from(sorted(REQUEST)),
    changed=st.dictionaries(
        st.sampled_from(["gpus", "cpu", "memory_gib", "gpu_memory_gib"]),
        form_values,
        min_size=1,
        max_size=2,
    ),
)
def test_the_launch_form_shows_a_field_error_or_queues_a_workspace(
    client_as, org, cluster, lab, gpu_request, changed
):
    client = client_as(org.researcher)
    client.raise_request_exception = False
    base = {"gpus": "0.5" if gpu_request == "fraction" else "1", "gpu_memory_gib": "1",
            "cpu": "1", "memory_gib": "2", "gpu_request": gpu_request}  # fmt: skip

    def check():
        post = {"project": org.project_a.pk, "environment": lab.pk, "name": "prop",
                "node_pool": org.pool.pk, "env": "", **base, **changed}  # fmt: skip
        response = client.post("/workspaces/new/", post)
        if refused_for_nul(response, post):
            return
        assert response.status_code in (200, 302)
        if response.status_code == 200:
            assert_names_fields(dict(response.context["form"].errors), changed)
        else:
            assert_the_cycle_takes_it(Workload.objects.get(name="prop"))

    rolled_back(check)


def test_the_strategies_reach_both_outcomes(org, cluster):
    # Guard against a property that passes because everything is refused: an ordinary
    # spec is stored, and a huge one is refused naming its field.
    workload = workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                               name="ok", image="img", cpu=Decimal("2"), gpus=1)  # fmt: skip
    assert_the_cycle_takes_it(workload)
    with pytest.raises(ValidationFailed) as refused:
        workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                        name="big", image="img", cpu=100000)  # fmt: skip
    assert list(refused.value.errors) == ["cpu"]
