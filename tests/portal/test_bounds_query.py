"""Query parameters with numbers no row can have: a 400 naming the parameter on the API, the
page as if the filter were absent (or a form error) on pages. Each was a 500 before."""

from __future__ import annotations

import pytest
from django.urls import get_resolver
from rest_framework.test import APIClient

from scheduling.services import workload_submit

pytestmark = pytest.mark.django_db
HUGE = "9" * 25
ENORMOUS = "9" * 5000  # past Python's 4,300-digit limit for int()


@pytest.fixture
def api(org):
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(org.platform_admin)
    return client


@pytest.mark.parametrize(
    ("url", "param"),
    [
        (f"/api/v1/workloads/?parent={HUGE}", "parent"),
        (f"/api/v1/workloads/?parent={ENORMOUS}", "parent"),
        (f"/api/v1/workloads/?cluster={HUGE}", "cluster"),
        (f"/api/v1/workloads/?limit={HUGE}", "limit"),
        ("/api/v1/workloads/?limit=0", "limit"),
        ("/api/v1/workloads/?limit=abc", "limit"),
        (f"/api/v1/workloads/?offset={HUGE}", "offset"),
        ("/api/v1/workloads/?offset=-1", "offset"),
        (f"/api/v1/nodes/?pool={HUGE}", "pool"),
        (f"/api/v1/nodes/?cluster={HUGE}", "cluster"),
        ("/api/v1/nodes/?cluster=abc", "cluster"),
    ],
)
def test_the_api_refuses_numbers_no_row_can_have_naming_the_parameter(api, url, param):
    response = api.get(url)
    assert response.status_code == 400, response.content
    assert list(response.json()) == [param]


def test_ordinary_paging_and_filters_still_work(api, org, submit):
    for name in ("a", "b", "c"):
        submit(org.researcher, org.project_a, name)
    body = api.get("/api/v1/workloads/?limit=2&offset=1&sort=name").json()
    assert [w["name"] for w in body["results"]] == ["b", "c"]
    assert body["count"] == 3
    assert api.get("/api/v1/workloads/?limit=1000").status_code == 200
    assert api.get("/api/v1/workloads/?parent=1&cluster=sim").json()["count"] == 0


@pytest.fixture
def submit():
    def _submit(actor, project, name):
        return workload_submit(actor=actor, project=project, kind="training", name=name,
                               image="img")  # fmt: skip

    return _submit


@pytest.mark.parametrize(
    "url",
    [
        f"/clusters/nodes/?cluster={HUGE}",
        f"/clusters/nodes/?pool={HUGE}",
        f"/dashboard/?pool={HUGE}",
        f"/dashboard/fragment/now/?pool={HUGE}&pool=1",
        f"/dashboard/fragment/chart/?pool={ENORMOUS}",
        f"/workspaces/new/?from={HUGE}",
        f"/workloads/?parent={HUGE}",
        f"/workloads/?cluster={HUGE}",
        f"/workloads/?project={HUGE}",
        f"/workloads/?parent={ENORMOUS}&format=csv",
    ],
)
def test_pages_ignore_ids_no_row_can_have(client_as, org, url):
    client = client_as(org.platform_admin)
    client.raise_request_exception = False
    assert client.get(url).status_code == 200


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [("9999-12-30", "9999-12-31", "end"), ("0001-01-01", "0001-01-02", "start")],
)
def test_report_dates_past_the_bounds_are_a_form_error(client_as, org, start, end, field):
    client = client_as(org.platform_admin)
    for url in ("/reports/usage/", "/reports/usage.csv"):
        response = client.get(url, {"period": "custom", "start": start, "end": end})
        assert response.status_code in (200, 400), url
    response = client.get("/reports/usage/", {"period": "custom", "start": start, "end": end})
    assert field in response.context["form"].errors
    assert "1970-01-01 to 2999-12-31" in response.content.decode()


def test_a_report_over_ordinary_dates_still_works(client_as, org):
    response = client_as(org.platform_admin).get(
        "/reports/usage/", {"period": "custom", "start": "2024-01-01", "end": "2024-12-31"}
    )
    assert response.status_code == 200
    assert not response.context["form"].errors


@pytest.mark.parametrize("query", [{"until": "9999-12-31"}, {"since": "0001-01-01"}])
def test_audit_dates_past_the_bounds_are_a_form_error(client_as, org, query):
    client = client_as(org.platform_admin)
    client.raise_request_exception = False
    response = client.get("/audit/", query)
    assert response.status_code == 200
    assert set(query) <= set(response.context["form"].errors)


def _plain_get_paths() -> list[str]:
    """Every URL without path parameters (pages and API), from the resolver."""

    def walk(patterns, prefix=""):
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if hasattr(entry, "url_patterns"):
                yield from walk(entry.url_patterns, route)
            elif "<" not in route and "(" not in route and "^" not in route:
                yield "/" + route

    skip = ("django-admin", "logout", "metrics")  # not the app's own query parsing
    return sorted({p for p in walk(get_resolver().url_patterns) if not p.startswith(
        tuple(f"/{s}" for s in skip))})  # fmt: skip


PARAMS = ["cluster", "pool", "project", "department", "parent", "from", "page", "limit",
          "offset", "tail", "range", "since", "until", "start", "end", "period", "group",
          "sort", "kind", "state", "user", "format"]  # fmt: skip


@pytest.mark.parametrize("value", [HUGE, ENORMOUS, "-1", "abc", "9999-12-31", "0001-01-01"])
def test_no_page_or_endpoint_answers_5xx_to_garbage_query_parameters(client_as, org, value):
    client = client_as(org.platform_admin)
    client.raise_request_exception = False
    query = dict.fromkeys(PARAMS, value) | {"period": "custom"}
    paths = _plain_get_paths()
    assert {"/workloads/", "/api/v1/workloads/", "/reports/usage/", "/audit/"} <= set(paths)
    failures = [
        (path, status) for path in paths if (status := client.get(path, query).status_code) >= 500
    ]
    assert not failures
