"""The ASGI proxy in front of workspace tools: who passes, and what reaches Jupyter."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from portal.asgi import django_application
from tests import factories as f
from tests.workspaces.helpers import free_port, jupyter_server, make_running_workspace
from workspaces.proxy import WorkspaceProxy

pytestmark = pytest.mark.django_db(transaction=True)


def _session_cookie(client, user) -> bytes:
    client.logout()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}; csrftoken=x".encode()


def _scope(kind: str, path: str, cookie: bytes | None, origin: bytes | None = None) -> dict:
    headers = [(b"host", b"testserver")] + ([(b"cookie", cookie)] if cookie else [])
    headers += [(b"origin", origin)] if origin else []
    scope = {
        "type": kind,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "scheme": "http" if kind == "http" else "ws",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        "asgi": {"version": "3.0"},
        "root_path": "",
        "subprotocols": [],
    }
    if kind == "http":
        scope.update(method="GET", http_version="1.1")
    return scope


def _run(coroutine):
    """asyncio.run in a thread of its own: Playwright's sync API may already run an event
    loop in the test's thread (the browser tests share one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _serve(scope: dict, receive, send) -> None:
    """One request through the real ASGI stack (proxy + Django); a fresh proxy per event
    loop, as its HTTP client belongs to the loop that made it."""
    app = WorkspaceProxy(django_application)
    try:
        await app(scope, receive, send)
    finally:
        if app.client is not None:
            await app.client.aclose()


def call_http(
    path: str, cookie: bytes | None = None, origin: bytes | None = None
) -> tuple[int, dict, bytes]:
    sent: list[dict] = []
    asked: list[bool] = []

    async def receive() -> dict:
        # The request once; then, as a server does, nothing until the client goes away
        # (Django listens for that while it answers).
        if asked:
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    _run(_serve(_scope("http", path, cookie, origin), receive, send))
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def websocket_handshake(path: str, cookie: bytes | None, origin: bytes | None = None) -> dict:
    """The server's first answer to a WebSocket connect: accept, or close (HTTP 403)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    _run(_serve(_scope("websocket", path, cookie, origin), receive, send))
    return sent[0]


def _without_csrf(body: bytes) -> bytes:
    return re.sub(rb'name="csrfmiddlewaretoken" value="[^"]*"', b"", body)


@pytest.fixture
def lab(org):
    # Nothing listens on the endpoint until a test starts Jupyter there.
    endpoint = f"127.0.0.1:{free_port()}"
    return make_running_workspace(owner=org.researcher, project=org.project_a, endpoint=endpoint)


def test_a_user_of_another_project_gets_404_for_pages_and_websockets(client, org, lab):
    """What the workspace's page answers him: a 403 told him the workspace exists."""
    cookie = _session_cookie(client, org.outsider)
    status, _, body = call_http(f"/workspaces/{lab.workload_id}/lab/tree", cookie)
    assert status == 404 and b"There is nothing here, or nothing you may see." in body
    assert client.get(f"/workspaces/{lab.workload_id}/").status_code == 404
    absent = call_http(f"/workspaces/{lab.workload_id + 999}/lab/tree", cookie)
    # The same answer as for no workspace (but the log-out form's one-time CSRF token).
    assert absent[0] == 404 and _without_csrf(absent[2]) == _without_csrf(body)
    # The portal's styled page, with its navigation.
    assert b"<h1>Not found</h1>" in body and b'href="/workloads/queue/"' in body
    ws = f"/workspaces/{lab.workload_id}/lab/api/kernels/abc/channels"
    assert websocket_handshake(ws, cookie) == {"type": "websocket.close", "code": 1008}


def test_an_anonymous_visitor_is_sent_to_the_login_page(lab):
    status, headers, _ = call_http(f"/workspaces/{lab.workload_id}/lab/tree")
    assert status == 302
    assert headers["location"] == f"/accounts/login/?next=/workspaces/{lab.workload_id}/lab/tree"


def test_project_members_pass_only_when_the_owner_shares_the_workspace(client, org, lab):
    colleague = f.make_user("carl")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    cookie = _session_cookie(client, colleague)
    path = f"/workspaces/{lab.workload_id}/lab/api/status"
    assert call_http(path, cookie)[0] == 403
    lab.shared_with_project = True
    lab.save()
    # Let through, to a tool that is not listening yet: the proxy says so.
    assert call_http(path, cookie)[0] == 502
    # Department and platform admins are not members: a tool is its owner's shell.
    assert call_http(path, _session_cookie(client, org.dept_admin))[0] == 403


def test_a_workspace_that_is_not_running_answers_503(client, org, lab):
    lab.workload.state = "stopped"
    lab.workload.save()
    status, _, body = call_http(
        f"/workspaces/{lab.workload_id}/lab/", _session_cookie(client, org.researcher)
    )
    assert status == 503 and b"not running" in body


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_owner_reaches_jupyter_with_the_token_added_by_the_proxy(client, org, lab, tmp_path):
    cookie = _session_cookie(client, org.researcher)
    with jupyter_server(lab.workload_id, tmp_path) as server:
        lab.workload.allocations.update(endpoint=server.endpoint)
        lab.token = server.token
        lab.save()
        status, headers, body = call_http(f"/workspaces/{lab.workload_id}/lab/api/status", cookie)
        assert status == 200, body
        assert headers["content-type"].startswith("application/json")
        assert b'"kernels": 0' in body
        # Without the proxy's token Jupyter refuses: the browser could not do this alone.
        lab.token = "wrong"
        lab.save()
        assert call_http(f"/workspaces/{lab.workload_id}/lab/api/status", cookie)[0] == 403


def test_an_owner_removed_from_the_project_no_longer_passes(client, org, lab):
    cookie = _session_cookie(client, org.researcher)
    path = f"/workspaces/{lab.workload_id}/lab/api/status"
    assert call_http(path, cookie)[0] == 502  # let through, to a tool not listening yet
    org.researcher.memberships.filter(project=org.project_a).delete()
    status, _, body = call_http(path, cookie)
    assert (
        status == 404 and b"There is nothing here, or nothing you may see." in body
    )  # he no longer sees the project
    # The portal's styled page, with its navigation.
    assert b"<h1>Not found</h1>" in body and b'href="/workloads/queue/"' in body
    ws = f"/workspaces/{lab.workload_id}/lab/api/kernels/abc/channels"
    assert websocket_handshake(ws, cookie) == {"type": "websocket.close", "code": 1008}


def test_requests_a_browser_sends_from_another_site_are_refused(client, org, lab, settings):
    """Jupyter skips its origin and XSRF checks for token-authenticated requests, and the
    proxy adds the token: a page elsewhere on the same site must not drive the kernels."""
    cookie = _session_cookie(client, org.researcher)
    http = f"/workspaces/{lab.workload_id}/lab/api/status"
    ws = f"/workspaces/{lab.workload_id}/lab/api/kernels/abc/channels"
    evil = b"http://evil.testserver"
    status, _, body = call_http(http, cookie, origin=evil)
    assert status == 403 and b"another site" in body
    assert websocket_handshake(ws, cookie, origin=evil) == {"type": "websocket.close", "code": 1008}
    # The portal's own pages (same host), and origins the settings trust, pass.
    assert call_http(http, cookie, origin=b"http://testserver")[0] == 502
    assert websocket_handshake(ws, cookie, origin=b"http://testserver")["code"] == 1011
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.testserver"]
    assert call_http(http, cookie, origin=b"https://evil.testserver")[0] == 502
    assert call_http(http, cookie, origin=evil)[0] == 403


def _stop_sharing(workspace_id: int) -> None:
    """From the test's event loop thread: its own connection, closed after (PostgreSQL
    would otherwise keep the test database from being dropped)."""
    from django.db import connection

    from workspaces.models import Workspace

    try:
        Workspace.objects.filter(pk=workspace_id).update(shared_with_project=False)
    finally:
        connection.close()


def test_an_open_websocket_is_closed_once_the_owner_stops_sharing(client, org, lab, monkeypatch):
    """Access is asked again while a kernel's WebSocket stays open, not only at the
    handshake: a colleague's open kernel connection ends when sharing ends."""
    from asgiref.sync import sync_to_async
    from websockets.asyncio.server import serve

    from workspaces import proxy

    monkeypatch.setattr(proxy, "RECHECK_S", 0.2)
    colleague = f.make_user("carl")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    lab.shared_with_project = True
    lab.save()
    cookie = _session_cookie(client, colleague)
    path = f"/workspaces/{lab.workload_id}/lab/api/kernels/abc/channels"
    host, port = lab.workload.allocations.get().endpoint.split(":")

    async def echo(ws) -> None:
        async for message in ws:
            await ws.send(message)

    async def scenario() -> list[dict]:
        sent: list[dict] = []
        inbox: asyncio.Queue = asyncio.Queue()
        for message in ({"type": "websocket.connect"}, {"type": "websocket.receive", "text": "hi"}):
            inbox.put_nowait(message)

        async def send(message: dict) -> None:
            sent.append(message)

        async with serve(echo, host, int(port)):
            scope = _scope("websocket", path, cookie)
            session = asyncio.create_task(_serve(scope, inbox.get, send))
            for _ in range(200):  # the echo came back through the proxy
                if {"type": "websocket.send", "text": "hi"} in sent:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # re-asked meanwhile, still allowed: still open
            assert not session.done()
            await sync_to_async(_stop_sharing, thread_sensitive=False)(lab.pk)
            await asyncio.wait_for(session, 10)
        return sent

    sent = _run(scenario())
    assert sent[0]["type"] == "websocket.accept"
    assert sent[-1] == {"type": "websocket.close", "code": 1008}


def test_a_tool_cannot_set_the_portals_cookies(client, org, lab):
    """The tool runs its owner's code: through a shared workspace it must not plant a
    portal session or CSRF cookie in a colleague's browser. Its own cookies pass."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Tool(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            for cookie in ("sessionid=planted; Path=/", "csrftoken=x; Path=/", "_xsrf=ok"):
                self.send_header("Set-Cookie", cookie)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:
            pass

    host, port = lab.workload.allocations.get().endpoint.split(":")
    server = ThreadingHTTPServer((host, int(port)), Tool)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sent: list[dict] = []
    asked: list[bool] = []

    async def receive() -> dict:
        # The request once; then, as a server does, nothing until the client goes away
        # (Django listens for that while it answers).
        if asked:
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    cookie = _session_cookie(client, org.researcher)
    try:
        _run(_serve(_scope("http", f"/workspaces/{lab.workload_id}/lab/x", cookie), receive, send))
    finally:
        server.shutdown()
        server.server_close()
    assert sent[0]["status"] == 200
    assert [v for k, v in sent[0]["headers"] if k == b"set-cookie"] == [b"_xsrf=ok"]
