"""Every organisation page against the four personas and an anonymous visitor.

200 = may open it; 403 = an admin page they may not open; 404 = something outside their view
(projects of other departments stay unnamed); 405 = the page only takes POST.
"""

from __future__ import annotations

import pytest
from django.urls import URLPattern

from portal import org_urls, services

ANON = "anonymous"
ORDER = ("platform_admin", "dept_admin", "researcher", "outsider")


def row(admin: int, dana: int, rita: int, otto: int) -> dict[str, int]:
    return dict(zip(ORDER, (admin, dana, rita, otto), strict=True))


def _membership(o) -> int:
    return o.researcher.memberships.get().pk


# name -> (url builder over the `org` fixture, expected status per persona)
MATRIX = {
    "home": (lambda o: "/", row(200, 200, 200, 200)),
    "department_list": (lambda o: "/departments/", row(200, 200, 403, 403)),
    "department_create": (lambda o: "/departments/new/", row(200, 403, 403, 403)),
    "department_edit": (lambda o: f"/departments/{o.dept_a.pk}/", row(200, 200, 403, 403)),
    "department_edit:other": (lambda o: f"/departments/{o.dept_b.pk}/", row(200, 404, 403, 403)),
    "department_quotas": (
        lambda o: f"/departments/{o.dept_a.pk}/quotas/",
        row(200, 403, 403, 403),
    ),
    "department_delete": (
        lambda o: f"/departments/{o.dept_a.pk}/delete/",
        row(200, 403, 403, 403),
    ),
    "project_list": (lambda o: "/projects/", row(200, 200, 200, 200)),
    "project_create": (lambda o: "/projects/new/", row(200, 200, 403, 403)),
    "project_detail": (lambda o: f"/projects/{o.project_a.pk}/", row(200, 200, 200, 404)),
    "project_detail:other": (lambda o: f"/projects/{o.project_b.pk}/", row(200, 404, 404, 200)),
    "project_edit": (lambda o: f"/projects/{o.project_a.pk}/edit/", row(200, 200, 403, 404)),
    "project_edit:other": (lambda o: f"/projects/{o.project_b.pk}/edit/", row(200, 404, 404, 403)),
    "project_quotas": (lambda o: f"/projects/{o.project_a.pk}/quotas/", row(200, 200, 403, 404)),
    "project_delete": (lambda o: f"/projects/{o.project_a.pk}/delete/", row(200, 200, 403, 404)),
    "node_pool_list": (lambda o: "/node-pools/", row(200, 403, 403, 403)),
    "node_pool_create": (lambda o: "/node-pools/new/", row(200, 403, 403, 403)),
    "node_pool_edit": (lambda o: f"/node-pools/{o.pool.pk}/", row(200, 403, 403, 403)),
    "user_list": (lambda o: "/users/", row(200, 200, 403, 403)),
    "user_invite": (lambda o: "/users/invite/", row(200, 200, 403, 403)),
    "user_edit": (lambda o: f"/users/{o.researcher.pk}/", row(200, 200, 403, 403)),
    "user_edit:other": (lambda o: f"/users/{o.outsider.pk}/", row(200, 404, 403, 403)),
    "user_edit:platform_admin": (
        lambda o: f"/users/{o.platform_admin.pk}/",
        row(200, 404, 403, 403),
    ),
    "membership_add": (
        lambda o: f"/users/{o.researcher.pk}/memberships/",
        row(405, 405, 403, 403),
    ),
    "membership_remove": (
        lambda o: f"/users/{o.researcher.pk}/memberships/{_membership(o)}/remove/",
        row(405, 405, 403, 403),
    ),
    "user_deactivate": (
        lambda o: f"/users/{o.researcher.pk}/deactivate/",
        row(200, 200, 403, 403),
    ),
    "user_deactivate:other": (
        lambda o: f"/users/{o.outsider.pk}/deactivate/",
        row(200, 404, 403, 403),
    ),
    "audit_log": (lambda o: "/audit/", row(200, 200, 403, 403)),
}

CASES = [(name, persona) for name in MATRIX for persona in (*ORDER, ANON)]


def test_the_matrix_covers_every_organisation_page():
    named = {
        p.name for p in [*org_urls.organisation, *org_urls.people_urls] if isinstance(p, URLPattern)
    }
    assert named == {name.split(":")[0] for name in MATRIX}


@pytest.mark.parametrize(("name", "persona"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_each_page_answers_each_persona_as_the_matrix_says(client_as, org, name, persona):
    build, expected = MATRIX[name]
    url = build(org)
    response = client_as(None if persona == ANON else getattr(org, persona)).get(url)
    if persona == ANON:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    else:
        assert response.status_code == expected[persona], f"{persona} GET {url}"


def test_a_researcher_never_sees_another_departments_projects_anywhere(client_as, org):
    client = client_as(org.researcher)
    for url in ("/", "/projects/"):
        body = client.get(url).content.decode()
        assert "ml-vision" in body
        assert org.project_b.name not in body.replace("ml-vision", "")
        assert "gp-nlp" not in body


def test_a_department_admin_sees_only_their_departments_people_and_audit_rows(client_as, org):
    services.department_update(actor=org.platform_admin, department=org.dept_b, name="tongues")
    services.department_update(actor=org.platform_admin, department=org.dept_a, name="sight")
    client = client_as(org.dept_admin)
    users = client.get("/users/").content.decode()
    assert "rita" in users
    assert "otto" not in users
    audit = client.get("/audit/").content.decode()
    assert "sight" in audit
    assert "tongues" not in audit
