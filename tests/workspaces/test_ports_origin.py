"""Users' HTTP ports on an origin apart from the portal's (workspaces/ports_origin.py).

A tool's page runs its owner's scripts. On the portal's origin they ran with the visitor's
session: one added an SSH key to the visitor's profile. Served here as `make demo` serves
them (portal.serve: one uvicorn, the portal's port and the ports' port), over real HTTP."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import uvicorn
from django.core.exceptions import ImproperlyConfigured

from portal.asgi import django_application
from portal.models import SshKey
from portal.serve import _bound
from tests import factories as f
from tests.workspaces.helpers import make_running_workspace, wait_until
from workspaces import ports_origin
from workspaces.proxy import WorkspaceProxy

pytestmark = pytest.mark.django_db(transaction=True)

# A tool's page whose script, once in a browser, tries to act as its visitor.
TOOL_PAGE = b"<!doctype html><title>tool</title><p id=out>the tool</p>"
KEY = (
    "ssh-ed25519 "
    + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + os.urandom(32)).decode()
)


class Tool(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(TOOL_PAGE)))
        self.end_headers()
        self.wfile.write(TOOL_PAGE)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def tool() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Tool)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture
def served(settings) -> Iterator[tuple[str, str]]:
    """The portal and the ports' origin, as `python -m portal.serve` serves them."""
    portal, ports = _bound("127.0.0.1", 0), _bound("127.0.0.1", 0)
    settings.PORTS_ORIGIN = f":{ports.getsockname()[1]}"
    app = WorkspaceProxy(django_application)  # as portal.asgi's, with a client of its own
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [portal, ports]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "uvicorn to start", interval=0.1)
    try:
        yield (f"http://127.0.0.1:{portal.getsockname()[1]}",
               f"http://127.0.0.1:{ports.getsockname()[1]}")  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def board(org, tool):
    """alice's running workload whose HTTP port `http` is the tool."""
    workload = make_running_workspace(owner=org.researcher, project=org.project_a).workload
    workload.allocations.update(ports={"http": tool})  # as the backend reports it
    return workload


def _signed_in(client, user) -> dict[str, str]:
    client.force_login(user)
    client.get("/")  # a page sets the CSRF cookie
    return {"sessionid": client.cookies["sessionid"].value}


def test_the_setting_takes_a_port_or_an_origin_and_refuses_anything_else():
    assert ports_origin.parse("") == ("", "", None)
    assert ports_origin.parse(":8001") == ("", "", 8001)
    assert ports_origin.parse("https://ports.example.com") == ("https", "ports.example.com", 443)
    assert ports_origin.parse("http://ports.example.com:9000/") == (
        "http",
        "ports.example.com",
        9000,
    )
    for bad in ("ports.example.com", ":0", ":99999", ":x", "http://h/path", "ftp://h",
                "http://u@h", "http://h:port"):  # fmt: skip
        with pytest.raises(ImproperlyConfigured, match="GPUPOOL_PORTS_ORIGIN"):
            ports_origin.parse(bad)


def test_a_port_asked_of_the_portal_is_sent_to_the_ports_origin(client, org, board, served):
    portal, ports = served
    cookies = _signed_in(client, org.researcher)
    path = f"/workloads/{board.pk}/ports/http/logs/run1?tab=scalars"
    answer = httpx.get(portal + path, cookies=cookies)
    assert (answer.status_code, answer.headers["location"]) == (307, ports + path)
    # The browser follows it with the same session: the tool answers there.
    answer = httpx.get(portal + path, cookies=cookies, follow_redirects=True)
    assert (answer.status_code, answer.content, str(answer.url)) == (200, TOOL_PAGE, ports + path)
    assert answer.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert "sandbox" not in answer.headers["content-security-policy"]  # tools work whole


def test_the_ports_origin_serves_ports_and_nothing_of_the_portals(client, org, board, served):
    _, ports = served
    cookies = _signed_in(client, org.researcher)
    for path in ("/", "/api/v1/workloads/", "/api/v1/users/me/ssh-keys/", "/accounts/login/",
                 f"/workspaces/{board.workspace.pk}/lab/", "/static/css/app.css"):  # fmt: skip
        answer = httpx.get(ports + path, cookies=cookies)
        assert (answer.status_code, answer.text) == (404, "Not found.\n"), path
    # Someone who may not see the workload gets the same plain answer, not the portal's page.
    outsider = _signed_in(client, f.make_user("mallory"))
    answer = httpx.get(ports + f"/workloads/{board.pk}/ports/http/", cookies=outsider)
    assert (answer.status_code, answer.text) == (404, "Not found.\n")


def test_a_tools_page_cannot_post_to_the_portal_as_its_visitor(client, org, board, served):
    """What a tool's script would send with the visitor's cookies: the portal refuses a
    post from the ports' origin, CSRF token and all."""
    portal, ports = served
    cookies = _signed_in(client, org.researcher)
    cookies["csrftoken"] = client.cookies["csrftoken"].value

    def add_key(origin: str) -> httpx.Response:
        return httpx.post(
            portal + "/api/v1/users/me/ssh-keys/",
            json={"public_key": KEY},
            cookies=cookies,
            headers={"Origin": origin, "X-CSRFToken": cookies["csrftoken"], "Referer": origin},
        )

    answer = add_key(ports)
    assert answer.status_code == 403, answer.text
    assert not SshKey.objects.filter(user=org.researcher).exists()
    # The same post from the portal's own origin passes: the refusal is the origin's.
    assert add_key(portal).status_code == 201


def test_without_a_ports_origin_a_tools_page_is_a_sandboxed_document(
    client, org, board, served, settings
):
    portal, _ = served
    settings.PORTS_ORIGIN = ""
    cookies = _signed_in(client, org.researcher)
    answer = httpx.get(portal + f"/workloads/{board.pk}/ports/http/", cookies=cookies)
    assert (answer.status_code, answer.content) == (200, TOOL_PAGE)
    policy = answer.headers["content-security-policy"]
    assert policy.startswith("sandbox allow-scripts") and "allow-same-origin" not in policy
