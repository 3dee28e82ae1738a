"""An object a user may not see answers him as one that does not exist: the same status and
the same body (but for its address), on every page, link and API endpoint. A 403 on the link
of a workspace whose page said 404 told another project's user that it exists (issue 28)."""

from __future__ import annotations

import re

import pytest

from tests import factories as f
from tests.workspaces.helpers import make_running_workspace
from tests.workspaces.test_proxy import _session_cookie, call_http, websocket_handshake

pytestmark = pytest.mark.django_db(transaction=True)

MISSING = 987654321
# Pages of a workload (a workspace's too), of a workspace, of a project and a department:
# what the outsider GETs and POSTs with {id} an object of project A, or no object at all.
PAGES_GET = [
    "/workloads/{workload}/",
    "/workloads/{workload}/status/",
    "/workloads/{workload}/clone/",
    "/workloads/{workload}/logs/",
    "/workloads/{workload}/logs/fragment/",
    "/workloads/{workload}/logs/download/",
    "/workspaces/{workspace}/",
    "/workspaces/{workspace}/status/",
    "/projects/{project}/",
    "/projects/{project}/edit/",
    "/projects/{project}/quotas/",
    "/departments/{department}/",
    "/departments/{department}/quotas/",
    "/workloads/policies/project/{project}/",
    "/workloads/policies/department/{department}/",
]
PAGES_POST = [
    "/workloads/{workload}/stop/",
    "/workloads/{workload}/delete/",
    "/workspaces/{workspace}/keep-running/",
    "/workspaces/{workspace}/share/",
    "/workspaces/{workspace}/stop/",
    "/projects/{project}/delete/",
    "/departments/{department}/delete/",
]
API_GET = [
    "/api/v1/workloads/{workload}/",
    "/api/v1/workloads/{workload}/events/",
    "/api/v1/workloads/{workload}/logs/",
    "/api/v1/workspaces/{workspace}/",
    "/api/v1/projects/{project}/",
    "/api/v1/projects/{project}/quotas/",
    "/api/v1/departments/{department}/",
    "/api/v1/departments/{department}/quotas/",
    "/api/v1/policies/project/{project}/",
    "/api/v1/policies/department/{department}/",
]
API_POST = [
    "/api/v1/workloads/{workload}/stop/",
    "/api/v1/workloads/{workload}/checkpoint/",
    "/api/v1/workspaces/{workspace}/keep-running/",
]
# Through the proxy: a workspace's JupyterLab link, a workload's port and its SSH tunnel.
LINKS = ["/workspaces/{workspace}/lab/tree", "/workloads/{workload}/ports/http/"]
TUNNELS = ["/workspaces/{workspace}/lab/api/kernels/k/channels", "/workloads/{workload}/ssh"]


@pytest.fixture
def seen(org):
    """A running workspace of project A (with an HTTP and an SSH port): the ids the
    outsider (project B) may not see."""
    lab = make_running_workspace(owner=org.researcher, project=org.project_a)
    lab.workload.spec["ports"] = [
        {"name": "http", "port": 8888},
        {"name": "ssh", "port": 22, "protocol": "tcp"},
    ]
    lab.workload.save(update_fields=["spec"])
    return {
        "workload": lab.workload_id,
        "workspace": lab.workload_id,
        "project": org.project_a.pk,
        "department": org.dept_a.pk,
    }


@pytest.fixture(params=["researcher", "department admin"])
def stranger(request, org):
    """Who may not see project A: a researcher of project B, or department B's admin."""
    if request.param == "researcher":
        return org.outsider
    admin = f.make_user("bea")
    f.make_membership(admin, role=f.Role.DEPARTMENT_ADMIN, department=org.dept_b)
    return admin


def _alike(address: str, seen: dict, answer) -> str | None:
    """None when `answer(path)` (status, body) is the same for the object the outsider may
    not see and for no object; else what differs."""
    hidden = address.format(**seen)
    missing = address.format(**dict.fromkeys(seen, MISSING))
    (status_a, body_a), (status_b, body_b) = answer(hidden), answer(missing)
    body_a, body_b = _plain(body_a, hidden), _plain(body_b, missing)
    if status_a != status_b or body_a != body_b:
        at = next((i for i, (a, b) in enumerate(zip(body_a, body_b, strict=False)) if a != b), 0)
        return f"{address}: {status_a} {body_a[at:][:200]!r} but {status_b} {body_b[at:][:200]!r}"
    return None


def _plain(body: bytes, path: str = "") -> str:
    """The body without its address and the forms' one-time CSRF token."""
    text = body.decode().replace(path, "PATH") if path else body.decode()
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "CSRF", text)


def test_pages_answer_alike_for_what_the_user_may_not_see_and_what_does_not_exist(
    client_as, stranger, seen
):
    client = client_as(stranger)

    def get(path):
        response = client.get(path)
        return response.status_code, response.content

    def post(path):
        response = client.post(path)
        return response.status_code, response.content

    differ = [_alike(a, seen, get) for a in PAGES_GET] + [_alike(a, seen, post) for a in PAGES_POST]
    assert [d for d in differ if d] == []
    # The object pages of the workload and the workspace are the one 404 page.
    status, body = get(f"/workspaces/{seen['workspace']}/")
    assert status == 404 and b"<h1>Not found</h1>" in body


def test_the_api_answers_alike_with_one_body(client_as, stranger, seen):
    client = client_as(stranger)

    def get(path):
        response = client.get(path)
        return response.status_code, response.content

    def post(path):
        response = client.post(path, content_type="application/json", data={})
        return response.status_code, response.content

    differ = [_alike(a, seen, get) for a in API_GET] + [_alike(a, seen, post) for a in API_POST]
    assert [d for d in differ if d] == []
    # One body for every 404 of the API, an unknown address's too: DRF's.
    bodies = {get(a.format(**seen)) for a in API_GET} | {get("/api/v1/no-such-thing/")}
    assert bodies == {(404, b'{"detail":"Not found."}')}


def test_links_answer_as_the_pages_do(client, stranger, seen):
    cookie = _session_cookie(client, stranger)

    def proxied(path):
        status, _, body = call_http(path, cookie)
        return status, body

    differ = [_alike(a, seen, proxied) for a in LINKS]
    assert [d for d in differ if d] == []
    # The same page as the workspace's own address answers.
    link = proxied(LINKS[0].format(**seen))
    page = client.get(f"/workspaces/{seen['workspace']}/")
    assert link[0] == page.status_code == 404
    assert _plain(link[1]) == _plain(page.content)
    for address in TUNNELS:
        hidden, missing = address.format(**seen), address.format(**dict.fromkeys(seen, MISSING))
        closed = {"type": "websocket.close", "code": 1008}
        assert websocket_handshake(hidden, cookie) == websocket_handshake(missing, cookie) == closed
