"""Users' HTTP ports and workspaces' JupyterLab on an origin apart from the portal's
(workspaces/ports_origin.py).

A tool's page runs its owner's scripts, and a notebook's output its author's. On the
portal's origin they ran with the visitor's session: one added an SSH key to the visitor's
profile. Served here as `make demo` serves them (portal.serve: one uvicorn, the portal's
port and the ports' port), over real HTTP and WebSocket."""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from django.core.exceptions import ImproperlyConfigured
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from portal.asgi import django_application
from portal.models import SshKey
from portal.serve import _bound
from tests import factories as f
from tests.workspaces.helpers import (
    execute_request,
    jupyter_server,
    make_running_workspace,
    start_kernel,
    wait_until,
)
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
    assert ports_origin.parse("https://*.ports.example.com") == (
        "https",
        "*.ports.example.com",
        443,
    )
    for bad in ("ports.example.com", ":0", ":99999", ":x", "http://h/path", "ftp://h",
                "http://u@h", "http://h:port", "https://*ports.example.com",
                "https://a.*.example.com", "https://*", "https://*."):  # fmt: skip
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
                 f"/workspaces/{board.pk}/", "/static/css/app.css"):  # fmt: skip
        answer = httpx.get(ports + path, cookies=cookies)
        assert (answer.status_code, answer.text) == (404, "Not found.\n"), path
    # Someone who may not see the workload gets the same plain answer, not the portal's page.
    outsider = _signed_in(client, f.make_user("mallory"))
    for path in (f"/workloads/{board.pk}/ports/http/", f"/workspaces/{board.pk}/lab/"):
        answer = httpx.get(ports + path, cookies=outsider)
        assert (answer.status_code, answer.text) == (404, "Not found.\n"), path


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


def test_a_lab_asked_of_the_portal_is_sent_to_the_ports_origin(
    client, org, board, served, settings
):
    """The workspace's link (`/workspaces/<id>/lab/`, on the portal's pages) still opens
    JupyterLab: on the ports' origin, where a notebook's scripts cannot act as its viewer."""
    portal, ports = served
    settings.SITE_URL = portal
    cookies = _signed_in(client, org.researcher)
    path = f"/workspaces/{board.pk}/lab/tree/notes.ipynb?reset"
    answer = httpx.get(portal + path, cookies=cookies)
    assert (answer.status_code, answer.headers["location"]) == (307, ports + path)
    # Also for someone not signed in: the ports' origin sends him to the portal's login,
    # which brings him back to the link on the portal's origin.
    answer = httpx.get(portal + path, follow_redirects=True)
    assert str(answer.url).startswith(f"{portal}/accounts/login/?next=/workspaces/{board.pk}/")
    assert answer.status_code == 200 and "csrfmiddlewaretoken" in answer.text
    assert [r.status_code for r in answer.history] == [307, 302]


def test_a_refusal_on_the_ports_origin_links_to_the_portal(client, org, board, served, settings):
    """The portal's pages are not served there: a refusal's navigation and styles are the
    portal's own, at SITE_URL."""
    portal, ports = served
    settings.SITE_URL = portal
    cookies = _signed_in(client, org.researcher)
    answer = httpx.get(ports + f"/workspaces/{board.pk}/lab/", cookies=cookies)
    assert answer.status_code == 503 and "This workspace is not running." in answer.text
    assert f'<base href="{portal}/">' in answer.text
    assert answer.text.index("<base ") < answer.text.index('rel="stylesheet"')
    # On the portal's own origin its links stay its own.
    settings.PORTS_ORIGIN = ""
    answer = httpx.get(portal + f"/workspaces/{board.pk}/lab/", cookies=cookies)
    assert answer.status_code == 503 and "<base " not in answer.text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jupyter_answers_on_the_ports_origin_with_the_viewers_session(
    client, org, served, tmp_path
):
    """HTTP and a kernel's WebSocket (what JupyterLab opens from its page, whose Origin is
    the ports' origin) through the proxy to a real Jupyter server, with the session only:
    the proxy adds Jupyter's token, so Jupyter's own origin and XSRF checks pass."""
    _, ports = served
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a)
    cookies = _signed_in(client, org.researcher)
    base = f"/workspaces/{workspace.pk}/lab/"
    with jupyter_server(workspace.pk, tmp_path) as server:
        workspace.workload.allocations.update(endpoint=server.endpoint)
        workspace.token = server.token
        workspace.save()
        answer = httpx.get(ports + base + "api/status", cookies=cookies)
        assert answer.status_code == 200 and answer.json()["kernels"] == 0, answer.text
        assert "frame-ancestors 'self'" in answer.headers.get_list("content-security-policy")
        kernel = start_kernel(server)
        ws_url = ports.replace("http://", "ws://") + f"{base}api/kernels/{kernel}/channels"
        session = "; ".join(f"{k}={v}" for k, v in cookies.items())
        headers = {"Cookie": session, "Origin": ports}
        with connect(ws_url, additional_headers=headers, open_timeout=30) as ws:
            ws.send(execute_request("print(6*7)"))
            assert _printed(ws) == "42\n"
        # Without the session, or from a page of another site, the handshake is refused.
        for refused in ({"Origin": ports}, {"Cookie": session, "Origin": "http://evil.test"}):
            with pytest.raises(InvalidStatus) as handshake:
                connect(ws_url, additional_headers=refused, open_timeout=30)
            assert handshake.value.response.status_code == 403


def _printed(ws) -> str:
    """The text a kernel printed, from its messages on the WebSocket."""
    while True:
        message = json.loads(ws.recv(timeout=60))
        if message["msg_type"] == "stream":
            return message["content"]["text"]


def test_with_a_host_name_per_workload_each_serves_its_own_workload_only(
    client, org, board, served, settings
):
    """`*.ports...`: workload 7's page can neither read workload 8's answers (another
    origin) nor act on it through the proxy: its host serves 8 nothing, and what its
    scripts send 8's host carries its own Origin."""
    portal, ports = served
    port = urlsplit(ports).port
    settings.PORTS_ORIGIN = f"http://*.ports.test:{port}"
    cookies = _signed_in(client, org.researcher)
    own, other = f"{board.pk}.ports.test:{port}", f"{board.pk + 1}.ports.test:{port}"
    for path in (f"/workloads/{board.pk}/ports/http/", f"/workspaces/{board.pk}/lab/tree"):
        answer = httpx.get(portal + path, cookies=cookies)
        assert (answer.status_code, answer.headers["location"]) == (307, f"http://{own}{path}")
        answer = httpx.get(ports + path, cookies=cookies, headers={"Host": other})
        assert (answer.status_code, answer.text) == (404, "Not found.\n"), path
    path = f"/workloads/{board.pk}/ports/http/"
    answer = httpx.get(ports + path, cookies=cookies, headers={"Host": own})
    assert (answer.status_code, answer.content) == (200, TOOL_PAGE)
    # What another workload's page sends this one's host is refused (its Origin).
    evil = {"Host": own, "Origin": f"http://{other}"}
    answer = httpx.post(ports + path, cookies=cookies, headers=evil)
    assert answer.status_code == 403 and "another site" in answer.text
