"""The workspaces API for each persona; the token never leaves the server."""

from __future__ import annotations

import sys

import pytest

from tests.workspaces.helpers import make_running_workspace
from workspaces.models import Environment, Workspace


@pytest.fixture
def jupyterlab(db):
    return Environment.objects.create(
        name="JupyterLab", image="jupyter", command=[sys.executable, "-m", "jupyter", "lab"]
    )


def test_a_researcher_launches_a_workspace_over_the_api(client_as, org, jupyterlab):
    response = client_as(org.researcher).post(
        "/api/v1/workspaces/",
        {"project": "ml-vision", "environment": "JupyterLab", "name": "api-lab",
         "env": {"A": "1"}},
        content_type="application/json",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    workspace = Workspace.objects.get()
    body = response.json()
    assert body["id"] == workspace.workload_id and body["state"] == "pending"
    assert body["url"] == f"/workspaces/{workspace.workload_id}/lab/"
    assert workspace.token not in response.content.decode()
    assert workspace.workload.preemptible is False


def test_the_api_refuses_a_project_the_user_is_not_in(client_as, org, jupyterlab):
    response = client_as(org.outsider).post(
        "/api/v1/workspaces/",
        {"project": "ml-vision", "environment": "JupyterLab", "name": "x"},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert not Workspace.objects.exists()


def test_the_api_names_the_bad_field(client_as, org, jupyterlab):
    response = client_as(org.researcher).post(
        "/api/v1/workspaces/",
        {"project": "ml-vision", "environment": "JupyterLab", "name": "Not Valid"},
        content_type="application/json",
    )
    assert response.status_code == 400 and "name" in response.json()


@pytest.mark.parametrize(
    ("persona", "listed", "detail", "keep"),
    [
        ("researcher", 1, 200, 200),
        ("dept_admin", 1, 200, 200),
        ("platform_admin", 1, 200, 200),
        ("outsider", 0, 404, 404),
    ],
)
def test_workspace_endpoints_answer_each_persona(client_as, org, persona, listed, detail, keep):
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a, token="s3cr3t")
    client = client_as(getattr(org, persona))
    listing = client.get("/api/v1/workspaces/")
    assert listing.status_code == 200 and len(listing.json()) == listed
    one = client.get(f"/api/v1/workspaces/{workspace.workload_id}/")
    assert one.status_code == detail
    assert b"s3cr3t" not in listing.content + one.content
    assert (
        client.post(f"/api/v1/workspaces/{workspace.workload_id}/keep-running/").status_code == keep
    )


def test_anonymous_callers_are_refused(client_as, org):
    assert client_as(None).get("/api/v1/workspaces/").status_code in (401, 403)
