"""The organisation's REST API under the same rules as the pages."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.models import AuditLog, ProjectQuota
from tests import factories as f

ORDER = ("platform_admin", "dept_admin", "researcher", "outsider")


@pytest.fixture
def api():
    def as_user(user):
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return as_user


def test_a_token_is_issued_for_a_right_password_and_then_authenticates(org):
    client = APIClient()
    response = client.post(
        "/api/v1/auth/token", {"username": "rita", "password": f.PASSWORD}, format="json"
    )
    assert response.status_code == 200
    token = response.json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    me = client.get("/api/v1/users/me").json()
    assert me["username"] == "rita"
    assert me["memberships"] == [{"role": "researcher", "project": "ml-vision", "department": None}]


def test_a_wrong_password_gets_a_400_and_no_token(org):
    response = APIClient().post(
        "/api/v1/auth/token", {"username": "rita", "password": "nope"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["Unknown username or wrong password."]}


def test_a_deactivated_users_token_stops_working(org):
    client = APIClient()
    body = {"username": "rita", "password": f.PASSWORD}
    token = client.post("/api/v1/auth/token", body, format="json").json()["token"]
    org.researcher.is_active = False
    org.researcher.save()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/users/me").status_code == 401


@pytest.mark.parametrize(
    "url",
    ["/api/v1/users/me", "/api/v1/departments/", "/api/v1/projects/", "/api/v1/node-pools/"],
)
def test_anonymous_callers_get_401(api, org, url):
    assert api(None).get(url).status_code == 401


@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        ("platform_admin", ["ml-detect", "ml-vision", "nlp"]),
        ("dept_admin", ["ml-detect", "ml-vision"]),
        ("researcher", ["ml-vision"]),
        ("outsider", ["nlp"]),
    ],
)
def test_each_persona_lists_only_the_projects_they_may_see(api, org, persona, expected):
    response = api(getattr(org, persona)).get("/api/v1/projects/")
    assert sorted(p["name"] for p in response.json()) == expected


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 200), ("outsider", 404)],
)
def test_quotas_of_a_project_are_readable_by_those_who_see_it(api, org, persona, status):
    response = api(getattr(org, persona)).get(f"/api/v1/projects/{org.project_a.pk}/quotas/")
    assert response.status_code == status
    if status == 200:
        assert response.json() == [
            {
                "node_pool": "a100",
                "gpus": "4.00",
                "gpus_limit": None,
                "cpu": "0.00",
                "cpu_limit": None,
                "memory_gib": "0.00",
                "memory_gib_limit": None,
                "over_quota_weight": "1.00",
                "over_quota_allowed": True,
            }
        ]


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 403), ("outsider", 404)],
)
def test_only_admins_put_project_quotas(api, org, persona, status):
    body = [{"node_pool": "a100", "gpus": "5", "gpus_limit": "8"}]
    url = f"/api/v1/projects/{org.project_a.pk}/quotas/"
    response = api(getattr(org, persona)).put(url, body, format="json")
    assert response.status_code == status
    expected = 5 if status == 200 else 4
    assert ProjectQuota.objects.get(project=org.project_a).gpus == expected


def test_a_refused_quota_is_a_400_naming_the_pool_and_field(api, org):
    url = f"/api/v1/projects/{org.project_a.pk}/quotas/"
    body = [{"node_pool": "a100", "gpus": "3", "gpus_limit": "1", "cpu": "-1"}]
    response = api(org.dept_admin).put(url, body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "a100.cpu": ["Must not be negative."],
        "a100.gpus_limit": ["The limit (1) must be at least the deserved amount (3 GPUs)."],
    }


def test_an_unknown_node_pool_in_a_quota_table_is_a_400(api, org):
    url = f"/api/v1/projects/{org.project_a.pk}/quotas/"
    response = api(org.platform_admin).put(url, [{"node_pool": "tpu", "gpus": 1}], format="json")
    assert response.status_code == 400
    assert "node_pool" in str(response.json())


def test_a_project_quota_over_its_department_is_a_400_with_what_is_left(api, org):
    url = f"/api/v1/projects/{org.project_a.pk}/quotas/"
    response = api(org.dept_admin).put(url, [{"node_pool": "a100", "gpus": "6.5"}], format="json")
    assert response.status_code == 400
    assert response.json() == {
        "a100.gpus": [
            "Department vision deserves 8 GPUs in a100; its other projects already deserve 2, "
            "so ml-vision can deserve at most 6 (asked 6.5)."
        ]
    }
    assert ProjectQuota.objects.get(project=org.project_a).gpus == 4


def test_lowering_a_department_below_its_projects_is_a_400_naming_them(api, org):
    url = f"/api/v1/departments/{org.dept_a.pk}/quotas/"
    response = api(org.platform_admin).put(url, [{"node_pool": "a100", "gpus": 5}], format="json")
    assert response.status_code == 400
    message = response.json()["a100.gpus"][0]
    assert "(ml-detect (2), ml-vision (4))" in message
    assert "Lower those projects first." in message


def test_a_quota_table_naming_a_pool_twice_is_a_400_and_saves_nothing(api, org):
    url = f"/api/v1/projects/{org.project_a.pk}/quotas/"
    body = [{"node_pool": "a100", "gpus": 1}, {"node_pool": "a100", "gpus": 3}]
    response = api(org.dept_admin).put(url, body, format="json")
    assert response.status_code == 400
    assert response.json() == {"node_pool": ["a100 appears more than once: one row per pool."]}
    assert ProjectQuota.objects.get(project=org.project_a).gpus == 4


def test_a_department_quota_put_by_a_department_admin_is_403(api, org):
    url = f"/api/v1/departments/{org.dept_a.pk}/quotas/"
    response = api(org.dept_admin).put(url, [{"node_pool": "a100", "gpus": 20}], format="json")
    assert response.status_code == 403


def test_a_department_admin_creates_a_project_in_their_department_only(api, org):
    client = api(org.dept_admin)
    created = client.post(
        "/api/v1/projects/", {"name": "seg", "department": org.dept_a.pk}, format="json"
    )
    assert created.status_code == 201
    assert created.json()["namespace"] == "gpupool-seg"
    assert AuditLog.objects.filter(action="project.create", actor=org.dept_admin).exists()
    other = client.post(
        "/api/v1/projects/", {"name": "seg2", "department": org.dept_b.pk}, format="json"
    )
    assert other.status_code == 403


def test_a_bad_namespace_is_a_400_on_the_namespace_field(api, org):
    body = {"name": "seg", "namespace": "Not_OK", "department": org.dept_a.pk}
    response = api(org.platform_admin).post("/api/v1/projects/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["namespace"]


def test_researchers_cannot_create_or_change_projects(api, org):
    client = api(org.researcher)
    body = {"name": "seg", "department": org.dept_a.pk}
    assert client.post("/api/v1/projects/", body, format="json").status_code == 403
    url = f"/api/v1/projects/{org.project_a.pk}/"
    assert client.patch(url, {"description": "x"}, format="json").status_code == 403


def test_an_admin_renames_a_project_and_may_not_move_it(api, org):
    url = f"/api/v1/projects/{org.project_a.pk}/"
    body = {"description": "cats", "department": org.dept_b.pk}
    response = api(org.dept_admin).patch(url, body, format="json")
    assert response.status_code == 200
    assert response.json()["description"] == "cats"
    assert response.json()["department"] == org.dept_a.pk


@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        ("platform_admin", ["language", "vision"]),
        ("dept_admin", ["vision"]),
        ("researcher", ["vision"]),
        ("outsider", ["language"]),
    ],
)
def test_departments_are_listed_by_what_each_persona_sees(api, org, persona, expected):
    response = api(getattr(org, persona)).get("/api/v1/departments/")
    assert sorted(d["name"] for d in response.json()) == expected


def test_only_platform_admins_create_departments_and_node_pools(api, org):
    for persona in ORDER:
        client = api(getattr(org, persona))
        dept = client.post("/api/v1/departments/", {"name": f"d-{persona}"}, format="json")
        pool = client.post("/api/v1/node-pools/", {"name": f"p-{persona[:4]}"}, format="json")
        expected = 201 if persona == "platform_admin" else 403
        assert (dept.status_code, pool.status_code) == (expected, expected), persona


def test_everyone_signed_in_lists_node_pools(api, org):
    response = api(org.outsider).get("/api/v1/node-pools/")
    assert [p["name"] for p in response.json()] == ["a100"]


def test_a_duplicate_department_name_is_a_400_with_the_services_message(api, org):
    response = api(org.platform_admin).post("/api/v1/departments/", {"name": "Vision"})
    assert response.status_code == 400
    assert response.json() == {"name": ["A department named Vision exists already."]}


def test_patching_a_node_pool_changes_only_the_fields_sent_and_it_cannot_be_deleted(api, org):
    client = api(org.platform_admin)
    url = f"/api/v1/node-pools/{org.pool.pk}/"
    before = client.get(url).json()
    response = client.patch(url, {"placement": "spread"}, format="json")
    assert response.status_code == 200
    assert response.json() == before | {"placement": "spread"}
    assert client.delete(url).status_code == 405
    assert AuditLog.objects.filter(action="node_pool.update").count() == 1


def test_a_department_admin_may_not_patch_a_node_pool(api, org):
    url = f"/api/v1/node-pools/{org.pool.pk}/"
    assert api(org.dept_admin).patch(url, {"placement": "spread"}, format="json").status_code == 403


def test_patching_a_department_keeps_the_name_when_only_the_description_is_sent(api, org):
    url = f"/api/v1/departments/{org.dept_a.pk}/"
    response = api(org.platform_admin).patch(url, {"description": "eyes"}, format="json")
    assert response.status_code == 200
    assert (response.json()["name"], response.json()["description"]) == ("vision", "eyes")
    assert api(org.platform_admin).delete(url).status_code == 400  # it still has projects
