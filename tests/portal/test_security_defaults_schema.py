"""The OpenAPI schema documents every error answer, and its enums are enforced on the way in."""

from __future__ import annotations

import pytest
from django.test import Client
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from scheduling.models import WorkloadKind, WorkloadState


@pytest.fixture
def schema(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_every_operation_documents_its_error_answers(schema):
    missing = []
    for path, method, operation in operations(schema):
        codes = set(operation["responses"])
        wanted = {"401", "403"} if path != "/api/v1/auth/token" else {"400", "429"}
        if method in {"post", "put", "patch"}:
            wanted.add("400")
        if "{" in path:
            wanted.add("404")
        if not wanted <= codes:
            missing.append((method, path, sorted(wanted - codes)))
    assert missing == []
    field_errors = schema["components"]["schemas"]["FieldErrors"]
    assert field_errors["additionalProperties"]["items"] == {"type": "string"}


def test_the_token_schemes_are_described(schema):
    schemes = schema["components"]["securitySchemes"]
    assert schemes["tokenAuth"]["name"] == "Authorization" and "Token" in str(schemes["tokenAuth"])
    assert schemes["nodeToken"]["scheme"] == "bearer"
    metrics = schema["paths"]["/api/v1/metrics"]["post"]
    assert metrics["security"] == [{"nodeToken": []}]


def test_the_schema_generates_without_errors_or_warnings():
    """Each view names its input and output: none is left out or guessed."""
    GENERATOR_STATS.reset()
    with GENERATOR_STATS.silence():
        SchemaGenerator().get_schema(request=None, public=True)
    assert [*GENERATOR_STATS._error_cache, *GENERATOR_STATS._warn_cache] == []


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/workloads/?kind=bogus&limit=5", "kind"),
        ("/api/v1/workloads/?state=RUNNING", "state"),
        ("/api/v1/workloads/?sort=-bogus", "sort"),
        (f"/api/v1/nodes/?cluster={2**63}", "cluster"),
        (f"/api/v1/nodes/?pool={10**30}", "pool"),
        ("/api/v1/nodes/?pool=-1", "pool"),
        ("/api/v1/workloads/?project=a%00b", "project"),  # PostgreSQL cannot compare a NUL
        ("/api/v1/workloads/?user=%00", "user"),
        ("/api/v1/workloads/?cluster=a%00", "cluster"),
    ],
)
def test_a_filter_outside_its_enum_or_range_or_with_a_nul_is_a_400_naming_it(org, url, field):
    client = APIClient()
    client.force_authenticate(org.researcher)
    response = client.get(url)
    assert response.status_code == 400
    assert list(response.json()) == [field]


@pytest.mark.parametrize(
    "query",
    [f"kind={WorkloadKind.TRAINING}", f"state={WorkloadState.PENDING}", "sort=-name", "kind="],
)
def test_values_inside_the_enums_filter_as_before(org, query):
    client = APIClient()
    client.force_authenticate(org.researcher)
    response = client.get(f"/api/v1/workloads/?{query}")
    assert response.status_code == 200, response.content


def test_the_pages_filters_are_not_the_apis_business(client, org):
    client.force_login(org.researcher)
    assert client.get("/workloads/?kind=bogus").status_code == 200


HUGE = 10**30  # past any database's integer range
DETAIL_URLS = [
    "/api/v1/workloads/{}/",
    "/api/v1/workloads/{}/events/",
    "/api/v1/workspaces/{}/",
    "/api/v1/projects/{}/",
    "/api/v1/projects/{}/quotas/",
    "/api/v1/departments/{}/",
    "/api/v1/clusters/{}/",
    "/api/v1/node-pools/{}/",
    "/api/v1/policies/project/{}/",
    "/workloads/{}/",
    "/workspaces/{}/",
    "/projects/{}/",
    "/departments/{}/",
    "/users/{}/",
    "/clusters/{}/",
]


@pytest.mark.parametrize("url", DETAIL_URLS)
def test_an_id_past_the_databases_range_is_a_404_not_a_500(org, url):
    client = Client(raise_request_exception=False)
    client.force_login(org.platform_admin)
    assert client.get(url.format(HUGE)).status_code == 404


def test_a_null_character_in_a_body_or_a_pages_filter_is_a_400(org, client):
    api = APIClient()
    api.force_authenticate(org.researcher)
    body = {"project": "ml-vision\x00", "environment": "lab", "name": "nb"}
    assert api.post("/api/v1/workspaces/", body, format="json").status_code == 400
    client.force_login(org.researcher)
    response = client.get("/workloads/?project=a%00b")
    assert response.status_code == 400
    assert "<h1>Bad request</h1>" in response.content.decode()
    assert client.post("/projects/new/", {"name": "x\x00"}).status_code == 400
