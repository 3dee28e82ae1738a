"""The workloads API for every endpoint and persona; 400s carry the field's message."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy, WorkloadState
from tests.scheduling.conftest import outgrown

pytestmark = pytest.mark.django_db
PERSONAS = ("platform_admin", "dept_admin", "researcher", "outsider")


@pytest.fixture
def api(org):
    def as_user(persona):
        client = APIClient()
        if persona is not None:
            client.force_authenticate(getattr(org, persona))
        return client

    return as_user


@pytest.fixture
def job(org, submit):
    return submit(org.researcher, org.project_a, "resnet", gpus=2)


def training(**extra):
    return {"project": "ml-vision", "kind": "training", "name": "api-job", "image": "img", **extra}


def test_anonymous_calls_are_refused(api, job):
    for url in ("/api/v1/workloads/", f"/api/v1/workloads/{job.pk}/", "/api/v1/queue/"):
        assert api(None).get(url).status_code in (401, 403)


@pytest.mark.parametrize(
    ("persona", "count"),
    [("platform_admin", 1), ("dept_admin", 1), ("researcher", 1), ("outsider", 0)],
)
def test_the_list_holds_visible_workloads(api, job, persona, count):
    body = api(persona).get("/api/v1/workloads/").json()
    assert body["count"] == count
    assert [w["name"] for w in body["results"]] == ["resnet"][:count]


def test_the_list_filters_by_project_kind_state_and_user(api, org, submit):
    submit(org.researcher, org.project_a, "a", gpus=1)
    submit(org.dept_admin, org.project_a2, "b", kind="inference", ports=[80])
    client = api("platform_admin")
    names = lambda q: [w["name"] for w in client.get(f"/api/v1/workloads/?{q}").json()["results"]]  # noqa: E731
    assert names("project=ml-detect") == ["b"]
    assert names(f"project={org.project_a.pk}") == ["a"]
    assert names("kind=inference") == ["b"]
    assert names("user=rita") == ["a"]
    assert names("state=running") == []
    assert names("sort=name") == ["a", "b"]
    assert names("sort=-gpus_allocated&parent=x") == []


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 201), ("dept_admin", 201), ("researcher", 201), ("outsider", 400)],
)
def test_submit_per_persona(api, org, persona, status):
    response = api(persona).post("/api/v1/workloads/", training(gpus=1), format="json")
    assert response.status_code == status
    if status == 201:
        assert response.json()["state"] == "pending"
        assert response.json()["submitted_by"] == getattr(org, persona).username
    else:
        assert response.json() == {"project": ["No project ml-vision that you can see."]}


def test_a_viewer_sees_the_project_but_may_not_submit(api, org):
    from tests import factories as f

    viewer = f.make_user("vera")
    f.make_membership(viewer, role=f.Role.VIEWER, project=org.project_a)
    client = APIClient()
    client.force_authenticate(viewer)
    assert client.post("/api/v1/workloads/", training(), format="json").status_code == 403


def test_a_token_or_a_browser_session_with_its_csrf_token_may_submit(org):
    from django.test import Client

    from portal.tokens import api_token_issue

    _, token = api_token_issue(user=org.researcher)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.post("/api/v1/workloads/", training(name="by-token")).status_code == 201
    client.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert client.get("/api/v1/workloads/").status_code == 401

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(org.researcher)
    body = json.dumps(training(name="by-session"))
    refused = browser.post("/api/v1/workloads/", body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    browser.get("/workloads/")  # a page sets the CSRF cookie, as in the browser
    csrf = browser.cookies["csrftoken"].value
    response = browser.post(
        "/api/v1/workloads/", body, content_type="application/json", HTTP_X_CSRFTOKEN=csrf
    )
    assert response.status_code == 201
    assert set(Workload.objects.values_list("name", flat=True)) == {"by-token", "by-session"}


def test_bad_input_is_a_400_with_field_messages(api):
    response = api("researcher").post(
        "/api/v1/workloads/", training(name="Bad Name", gpus=-1, image=""), format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"name", "gpus", "image"}
    assert body["image"] == ["Give the container image."]
    response = api("researcher").post("/api/v1/workloads/", {"kind": "nope"}, format="json")
    assert set(response.json()) == {"project", "kind", "name"}


def test_workspaces_are_launched_where_they_get_their_environment(api):
    response = api("researcher").post(
        "/api/v1/workloads/", {**training(), "kind": "workspace"}, format="json"
    )
    assert response.status_code == 400
    assert "Launch workspaces at /api/v1/workspaces/" in response.json()["kind"][0]
    assert not Workload.objects.exists()


def test_booleans_sent_as_words_mean_what_they_say(api):
    client = api("researcher")
    form = {**training(name="form-encoded"), "priority_class": "build", "preemptible": "false",
            "topology_required": "0"}  # fmt: skip
    assert client.post("/api/v1/workloads/", form).status_code == 201  # multipart, all strings
    wl = Workload.objects.get(name="form-encoded")
    assert (wl.preemptible, wl.topology_required) == (False, False)
    body = {**training(name="ddp", kind="distributed", workers=2), "master": "false"}
    assert client.post("/api/v1/workloads/", body, format="json").status_code == 201
    assert Workload.objects.get(name="ddp").pods == 2
    response = client.post(
        "/api/v1/workloads/", {**training(name="x"), "preemptible": "maybe"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"preemptible": ["Enter true or false."]}


def test_policy_refusals_name_the_rule(api, org):
    WorkloadPolicy.objects.create(department=org.dept_a, allowed_kinds=["training"])
    response = api("researcher").post(
        "/api/v1/workloads/",
        {**training(), "kind": "inference", "ports": [80], "replicas": 2},
        format="json",
    )
    assert response.status_code == 400
    assert response.json() == {
        "kind": ["Refused by policy 'allowed kinds' of department vision: only training."]
    }


def test_submit_a_distributed_job_and_a_sweep(api):
    client = api("researcher")
    ddp = client.post(
        "/api/v1/workloads/",
        {**training(name="ddp"), "kind": "distributed", "workers": 3, "gpus": 2},
        format="json",
    ).json()
    assert (ddp["pods"], ddp["min_pods"]) == (3, 3)
    sweep = client.post(
        "/api/v1/workloads/",
        {
            **training(name="sweep"),
            "kind": "hpo",
            "search": {"method": "grid", "parameters": {"lr": [1, 2]}, "parallelism": 1},
        },
        format="json",
    ).json()
    trials = client.get(f"/api/v1/workloads/?parent={sweep['id']}").json()["results"]
    assert sorted(t["env"]["LR"] for t in trials) == ["1", "2"]


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 200), ("outsider", 404)],
)
def test_get_and_events_per_persona(api, job, persona, status):
    client = api(persona)
    assert client.get(f"/api/v1/workloads/{job.pk}/").status_code == status
    events = client.get(f"/api/v1/workloads/{job.pk}/events/")
    assert events.status_code == status
    if status == 200:
        assert [(e["type"], e["reason"]) for e in events.json()] == [("pending", "Submitted")]
    logs = client.get(f"/api/v1/workloads/{job.pk}/logs/")
    assert logs.status_code == status
    assert api(None).get(f"/api/v1/workloads/{job.pk}/logs/").status_code in (401, 403)


def test_get_shows_the_allocation(api, org, cluster, job):
    cycle_run()
    body = api("researcher").get(f"/api/v1/workloads/{job.pk}/").json()
    assert body["state"] == "admitted" and body["gpus_allocated"] == "2"
    assert [(a["cluster"], a["node"], a["gpu_indices"]) for a in body["allocations"]] == [
        ("sim", "a100-node-0", [0, 1])
    ]


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 200), ("outsider", 404)],
)
def test_stop_per_persona(api, job, persona, status):
    response = api(persona).post(f"/api/v1/workloads/{job.pk}/stop/")
    assert response.status_code == status
    job.refresh_from_db()
    assert (job.state == WorkloadState.STOPPED) is (status == 200)


def test_stopping_twice_is_a_400(api, job):
    api("researcher").post(f"/api/v1/workloads/{job.pk}/stop/")
    response = api("researcher").post(f"/api/v1/workloads/{job.pk}/stop/")
    assert response.status_code == 400
    assert response.json() == {"state": ["resnet has already stopped."]}


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 204), ("dept_admin", 204), ("researcher", 204), ("outsider", 404)],
)
def test_delete_per_persona(api, job, persona, status):
    assert api(persona).delete(f"/api/v1/workloads/{job.pk}/").status_code == status
    assert Workload.objects.filter(pk=job.pk).exists() is (status != 204)


def test_deleting_a_running_workload_is_a_400(api, cluster, job):
    cycle_run()
    response = api("researcher").delete(f"/api/v1/workloads/{job.pk}/")
    assert response.status_code == 400
    assert response.json() == {"state": ["Stop resnet before deleting it."]}


def test_logs_say_why_they_are_unavailable(api, job):
    body = api("researcher").get(f"/api/v1/workloads/{job.pk}/logs/").json()
    assert body == {
        "pods": [],
        "unavailable": "This workload has not run on a cluster yet.",
        "state": "pending",
        "why": "",  # no cycle has looked at it yet
    }
    for tail in ("abc", "0", "-5", "10001"):
        response = api("researcher").get(f"/api/v1/workloads/{job.pk}/logs/?tail={tail}")
        assert response.status_code == 400
        assert response.json() == {"tail": ["Enter a whole number from 1 to 10000 lines."]}


@pytest.mark.parametrize(
    ("persona", "projects"),
    [
        ("platform_admin", {"ml-vision", "ml-detect", "nlp"}),
        ("dept_admin", {"ml-vision", "ml-detect"}),
        ("researcher", {"ml-vision"}),
        ("outsider", {"nlp"}),
    ],
)
def test_the_queue_per_persona(api, org, cluster, submit, persona, projects):
    outgrown(submit, org.researcher, org.project_a, "waits", gpus=16)
    cycle_run()
    body = api(persona).get("/api/v1/queue/").json()
    assert {q["project"] for q in body["queues"]} == projects
    pending = [(p["name"], p["reason"]) for p in body["pending"]]
    expected = [("waits", "Needs 16 GPUs in pool a100; 8 are free")]
    assert pending == (expected if "ml-vision" in projects else [])


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 403), ("outsider", 403)],
)
def test_policies_per_persona(api, org, persona, status):
    client = api(persona)
    assert client.get("/api/v1/policies/").status_code == status
    url = f"/api/v1/policies/project/{org.project_a.pk}/"
    response = client.put(url, {"max_runtime_s": 3600}, format="json")
    expected_put = status if persona != "outsider" else 404
    assert response.status_code == expected_put
    if status == 200:
        assert response.json()["max_runtime_s"] == 3600
        assert [p["name"] for p in client.get("/api/v1/policies/").json()] == ["ml-vision"]


def test_policy_input_errors_are_400(api, org):
    url = f"/api/v1/policies/department/{org.dept_a.pk}/"
    response = api("dept_admin").put(
        url, {"default_runtime_s": 100, "max_runtime_s": 10}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {
        "default_runtime_s": ["The default runtime cannot exceed the maximum."]
    }
    response = api("dept_admin").put(url, {"allowed_kinds": ["bogus"]}, format="json")
    assert response.status_code == 400 and "allowed_kinds" in response.json()


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 403), ("researcher", 403), ("outsider", 403)],
)
def test_cycles_per_persona(api, org, cluster, persona, status):
    cycle_run()
    response = api(persona).get("/api/v1/cycles/")
    assert response.status_code == status
    if status == 200:
        assert response.json()[0]["ok"] is True


def test_the_schema_and_docs_page_list_the_workload_operations(client_as, org):
    client = client_as(org.researcher)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/workloads/{id}/stop/" in schema["paths"]
    listing = schema["paths"]["/api/v1/workloads/"]["get"]
    assert {"project", "kind", "state", "user", "sort"} <= {
        p["name"] for p in listing["parameters"]
    }
    for path in ("/api/v1/workloads/", "/api/v1/queue/", "/api/v1/workloads/{id}/logs/",
                 "/api/v1/cycles/", "/api/v1/policies/"):  # fmt: skip
        content = schema["paths"][path]["get"]["responses"]["200"]["content"]
        assert content["application/json"]["schema"], path
    queue = schema["components"]["schemas"]["Queue"]["properties"]
    assert set(queue) == {"queues", "pending"}
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "https://" not in page, "no asset from another host"


def test_a_project_whose_name_is_all_digits_is_found_by_name_before_ids(api, org):
    from tests import factories as f

    # A valid namespace name may be all digits; it must not be read as another's id.
    digits = f.make_project(org.dept_b, name=str(org.project_a.pk))
    client = api("platform_admin")
    response = client.post("/api/v1/workloads/", training(project=digits.name), format="json")
    assert response.status_code == 201 and response.json()["project"] == digits.name
    client.post("/api/v1/workloads/", training(name="in-a"), format="json")
    listed = client.get("/api/v1/workloads/", {"project": digits.name}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [w["project"] for w in rows] == [digits.name]
    # A number no project is called still means an id.
    by_id = client.get("/api/v1/workloads/", {"project": str(org.project_a2.pk)}).json()
    rows = by_id["results"] if isinstance(by_id, dict) else by_id
    assert rows == []
    response = client.post(
        "/api/v1/workloads/", training(project=str(org.project_a2.pk)), format="json"
    )
    assert response.status_code == 201 and response.json()["project"] == org.project_a2.name
