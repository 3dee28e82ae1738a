"""The authenticated reverse proxy in front of workspace tools, as ASGI middleware.

`/workspaces/<id>/lab/...` (HTTP and WebSocket; Jupyter's kernels speak WebSocket) goes to
the workspace's tool; `/workloads/<id>/ports/<name>/...` to a workload's HTTP port (with
that prefix taken off: TensorBoard, a web demo); the WebSocket `/workloads/<id>/ssh`
carries a TCP stream to its SSH server (`gpupool ssh-proxy`); everything else goes to
Django. With `GPUPOOL_PORTS_ORIGIN` set, a browser asking the portal's origin for a port
or a workspace's tool is sent to that origin (307; workspaces/ports_origin.py). Every HTTP
request and every WebSocket handshake is checked against the portal's session (or an API
token: the CLI): only the owner, or the project's members when the owner shares it, get
through. The tool's token is added here, server-side, so the browser never
holds it.

On the local backend a tool listens on a unix socket (`unix:/path` as its upstream) in a
folder only the portal and the pod's own user may enter: no other user of the machine can
reach it past this proxy. Elsewhere the upstream is host:port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed

from scheduling import load
from workspaces import activity, ports_origin, proxy_auth

log = logging.getLogger(__name__)

LAB_PATH = re.compile(r"^/workspaces/(?P<id>\d{1,18})/lab(?:/|\Z)")
# The paths of scheduling.selectors.port_path and ssh_path; ids fit the database's integers.
PORT_PATH = re.compile(
    r"^/workloads/(?P<id>\d{1,18})/ports/(?P<name>[a-z0-9-]{1,15})(?P<rest>/(?s:.*))?\Z"
)
SSH_PATH = re.compile(r"^/workloads/(?P<id>\d{1,18})/ssh/?\Z")
# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself.
DROP_REQUEST = {
    "host",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "transfer-encoding",
    "proxy-authorization",
    "proxy-connection",
    "authorization",
    "cookie",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
}
DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "upgrade", "trailer"}

UNIX_PREFIX = "unix:"
Scope = dict[str, Any]
Check = Callable[[], Awaitable[proxy_auth.Access]]
Touch = Callable[[], Awaitable[None]]
# How often an open WebSocket's access is asked again (a DB read per socket).
RECHECK_S = 30.0
TIMEOUT = httpx.Timeout(120.0, connect=5.0)
SSH_PORT = "ssh"  # the port named so (scheduling.specs.SSH_PORT_NAME)
TUNNEL_CHUNK = 64 * 1024


@dataclass
class WorkspaceProxy:
    """Wraps the Django ASGI application."""

    app: Any
    client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        path = scope.get("path", "")
        port, lab = PORT_PATH.match(path), LAB_PATH.match(path)
        workload_id = int((port or lab)["id"]) if port or lab else 0
        there = ports_origin.on_ports_origin(scope)
        if there and not ports_origin.serves(scope, workload_id):
            port = lab = None  # another workload's host name: nothing of this one's
        if (port or lab) and not there and ports_origin.enabled() and scope["type"] == "http":
            # A browser that asks the portal's origin for a tool (a port, JupyterLab) is
            # sent to the ports' origin: the tool's scripts never run with the portal's.
            location = ports_origin.url_on_ports_origin(scope, workload_id)
            return await send_refusal(send, proxy_auth.Access(307, location=location))
        if lab is not None:
            return await self.lab(scope, receive, send, workload_id, there)
        if port is not None or there:
            return await self.ports(scope, receive, send, port)
        if (ssh := SSH_PATH.match(path)) is not None and scope["type"] == "websocket":
            return await self.ssh(scope, receive, send, int(ssh["id"]))
        return await self.app(scope, receive, send)

    async def lab(
        self, scope: Scope, receive: Any, send: Any, workspace_id: int, there: bool
    ) -> None:
        """A workspace's tool (JupyterLab) at `/workspaces/<id>/lab/`, the path unchanged
        (its base URL). On the ports' origin, framed only by pages of that origin."""
        check = partial(proxy_auth.authorize, scope["headers"], workspace_id, scope["path"])
        access = await check()
        if access.allowed:
            await activity.proxied(workspace_id)
        if scope["type"] == "websocket":
            touch = partial(activity.proxied, workspace_id)
            return await proxy_websocket(scope, receive, send, access, check, touch)
        policy = ports_origin.OWN_ORIGIN.encode() if there else b""
        return await self.proxy_http(scope, receive, send, access, policy=policy)

    async def ports(self, scope: Scope, receive: Any, send: Any, port: re.Match | None) -> None:
        """A port's address, or anything else asked of the ports' origin, which serves
        nothing but ports and workspaces' tools (workspaces/ports_origin.py)."""
        if port is None and scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        if port is None:
            return await send_not_found(send)
        return await self.port(scope, receive, send, int(port["id"]), port["name"], port["rest"])

    async def port(
        self, scope: Scope, receive: Any, send: Any, workload_id: int, name: str, rest: str | None
    ) -> None:
        """A workload's HTTP port, at its stable address; the tool sees the path below it."""
        check = partial(
            proxy_auth.authorize_port, scope["headers"], workload_id, name, scope["path"], "http"
        )
        access = await check()
        if access.allowed:
            await activity.proxied(workload_id)
            await load.request_seen(workload_id)  # scale-on-requests (scheduling/load.py)
        if rest is None and scope["type"] == "http" and access.allowed:
            # Relative links of the tool resolve below its address only with the slash.
            return await send_refusal(send, proxy_auth.Access(308, location=scope["path"] + "/"))
        below = rest or "/"
        if scope["type"] == "websocket":
            touch = partial(activity.proxied, workload_id)
            return await proxy_websocket(scope, receive, send, access, check, touch, path=below)
        policy = ports_origin.response_policy().encode()
        return await self.proxy_http(scope, receive, send, access, path=below, policy=policy)

    async def ssh(self, scope: Scope, receive: Any, send: Any, workload_id: int) -> None:
        check = partial(
            proxy_auth.authorize_port, scope["headers"], workload_id, SSH_PORT, scope["path"], "tcp"
        )
        access = await check()
        touch = partial(activity.proxied, workload_id)
        if access.allowed:
            await touch()
        return await proxy_tunnel(receive, send, access, check, touch)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        # Django's handler does not speak lifespan; the proxy uses it for its HTTP client.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._client()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
        return self.client

    async def proxy_http(
        self,
        scope: Scope,
        receive: Any,
        send: Any,
        access: proxy_auth.Access,
        path: str = "",
        policy: bytes = b"",
    ) -> None:
        """`policy`: a Content-Security-Policy added to the tool's answers."""
        there = ports_origin.on_ports_origin(scope)
        if access.status == 404 and there:
            return await send_not_found(send)  # the portal's page is not for this origin
        if access.status == 404:
            # The portal's own 404 page, as for an address it does not know (no route of
            # its lies below the proxy's paths): a link of what one may not see answers as
            # its page does, with the same body, navigation and log-out form.
            return await self.app(scope, receive, send)
        if access.status == 302 and there:
            # Nobody signed in: the login page is the portal's, on its origin; it sends the
            # browser back to the tool's path there, and from there here (307).
            access = replace(access, location=settings.SITE_URL + access.location)
        if not access.allowed:
            return await send_refusal(send, access, there)
        body = await read_body(receive)
        host, socket_path = upstream_address(access.upstream)
        # A socket's client lives for one request: sockets come and go with workspaces.
        client = self._client() if socket_path is None else socket_client(socket_path)
        request = client.build_request(
            scope["method"],
            upstream_url("http", host, scope, path),
            headers=upstream_headers(scope, access),
            content=body,
        )
        try:
            await forward(client, request, send, access, policy, there)
        finally:
            if socket_path is not None:
                await client.aclose()


async def forward(
    client: httpx.AsyncClient,
    request: httpx.Request,
    send: Any,
    access: proxy_auth.Access,
    policy: bytes = b"",
    on_ports_origin: bool = False,
) -> None:
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        log.warning("workspace proxy: %s unreachable: %s", access.upstream, exc)
        refusal = proxy_auth.Access(502, message="The workspace's tool did not answer.")
        return await send_refusal(send, refusal, on_ports_origin)
    try:
        await relay_response(response, send, access.token, policy)
    finally:
        await response.aclose()


def upstream_address(upstream: str) -> tuple[str, str | None]:
    """The host for URLs and the Host header, and the unix socket to dial (None: TCP)."""
    if upstream.startswith(UNIX_PREFIX):
        return "localhost", upstream.removeprefix(UNIX_PREFIX)
    return upstream, None


def socket_client(path: str) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=path)
    return httpx.AsyncClient(transport=transport, timeout=TIMEOUT, follow_redirects=False)


async def read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def upstream_url(scheme: str, upstream: str, scope: Scope, path: str = "") -> str:
    """The upstream's URL for the request: its own path, or `path` (a port's, below the
    port's address; decoded, so quoted again here)."""
    if path:
        path = quote(path, safe="/:@!$&'()*+,;=-._~%")
    else:
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{scheme}://{upstream}{path}" + (f"?{query}" if query else "")


def upstream_headers(scope: Scope, access: proxy_auth.Access) -> list[tuple[str, str]]:
    headers = []
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name not in DROP_REQUEST:
            headers.append((name, raw_value.decode("latin-1")))
        elif name == "cookie":
            # The portal's own cookies (session, CSRF) are none of the tool's business.
            kept = proxy_auth.cookies_without_portal(raw_value.decode("latin-1"))
            if kept:
                headers.append(("cookie", kept))
    headers.append(("host", upstream_address(access.upstream)[0]))
    if access.token:  # a workspace's tool; a workload's own port has no token of ours
        headers.append(("authorization", f"token {access.token}"))
    return headers


async def relay_response(
    response: httpx.Response, send: Any, token: str, policy: bytes = b""
) -> None:
    headers = [
        (name.lower(), value)
        for name, value in response.headers.raw
        if name.decode("latin-1").lower() not in DROP_RESPONSE
        and not proxy_auth.sets_portal_cookie(name, value)
    ]
    if policy:  # beside the tool's own: a browser enforces every policy it is sent
        headers.append((b"content-security-policy", policy))
    content_type = response.headers.get("content-type", "")
    html = content_type.startswith("text/html") and "content-encoding" not in response.headers
    if token and html:
        # JupyterLab writes its token into the page's config; the browser does not need it
        # (the proxy authenticates every request), so it never reaches the user.
        body = b"".join([chunk async for chunk in response.aiter_raw()])
        body = body.replace(token.encode(), b"")
        headers = [(n, v) for n, v in headers if n != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    async for chunk in response.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def send_not_found(send: Any) -> None:
    """The ports' origin's answer to anything but a port: plain, nothing of the portal's."""
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": b"Not found.\n"})


async def send_refusal(send: Any, access: proxy_auth.Access, on_ports_origin: bool = False) -> None:
    headers = [(b"content-type", b"text/html; charset=utf-8")]
    if access.location:
        headers.append((b"location", access.location.encode()))
    body = proxy_auth.refusal_page(access, on_ports_origin=on_ports_origin).encode()
    await send({"type": "http.response.start", "status": access.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def handshake_allowed(receive: Any, send: Any, access: proxy_auth.Access) -> bool:
    """Whether a WebSocket's handshake may go on; if not, it is refused."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return False
    if not access.allowed:
        # Closing before accepting makes the server answer the handshake with HTTP 403.
        await send({"type": "websocket.close", "code": 1008})
        return False
    return True


async def proxy_websocket(
    scope: Scope,
    receive: Any,
    send: Any,
    access: proxy_auth.Access,
    check: Check,
    touch: Touch,
    path: str = "",
) -> None:
    """Checks the handshake, then pumps frames both ways until either side closes, or the
    access is withdrawn (the owner stops sharing, a member leaves the project, the
    workspace stops): asked again every RECHECK_S seconds."""
    if not await handshake_allowed(receive, send, access):
        return
    headers = [(n, v) for n, v in upstream_headers(scope, access) if n != "host"]
    host, socket_path = upstream_address(access.upstream)
    options = {
        "additional_headers": headers,
        "subprotocols": scope.get("subprotocols") or None,
        "max_size": None,
        "open_timeout": 15,
    }
    url = upstream_url("ws", host, scope, path)
    try:
        if socket_path is None:
            upstream = await connect(url, **options)
        else:
            upstream = await unix_connect(socket_path, url, **options)
    except Exception as exc:  # refused, unreachable, timed out: the handshake fails
        log.warning("workspace proxy: WebSocket to %s failed: %s", access.upstream, exc)
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    await pump(upstream, receive, send, check, touch)


async def proxy_tunnel(
    receive: Any, send: Any, access: proxy_auth.Access, check: Check, touch: Touch
) -> None:
    """A WebSocket carrying one TCP connection (the SSH tunnel): binary messages both ways.
    The same checks as any WebSocket: refused handshakes get HTTP 403, and access is asked
    again while it is open."""
    if not await handshake_allowed(receive, send, access):
        return
    host, socket_path = upstream_address(access.upstream)
    try:
        if socket_path is not None:
            opening = asyncio.open_unix_connection(socket_path)
        else:
            address, _, port = host.rpartition(":")
            opening = asyncio.open_connection(address, int(port))
        reader, writer = await asyncio.wait_for(opening, timeout=15)
    except (OSError, ValueError, TimeoutError) as exc:
        log.warning("workload tunnel: %s unreachable: %s", access.upstream, exc)
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.accept"})
    await pump(TcpStream(reader, writer), receive, send, check, touch)


@dataclass
class TcpStream:
    """A TCP connection with the face of a WebSocket client connection, for `pump`."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    close_code: int = 1000

    async def send(self, data: str | bytes) -> None:
        self.writer.write(data.encode() if isinstance(data, str) else data)
        await self.writer.drain()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await self.reader.read(TUNNEL_CHUNK):
            yield chunk

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def pump(
    upstream: ClientConnection | TcpStream, receive: Any, send: Any, check: Check, touch: Touch
) -> None:
    async def still_allowed() -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            if not (await check()).allowed:
                await send({"type": "websocket.close", "code": 1008})
                return

    async def client_to_upstream() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text") if message.get("text") is not None else message["bytes"]
            await upstream.send(data)
            await touch()  # the user typed or ran something (throttled: see activity)

    async def upstream_to_client() -> None:
        try:
            async for data in upstream:
                key = "text" if isinstance(data, str) else "bytes"
                await send({"type": "websocket.send", key: data})
        except (ConnectionClosed, OSError):
            pass
        await send({"type": "websocket.close", "code": upstream.close_code or 1000})

    tasks = [
        asyncio.create_task(client_to_upstream()),
        asyncio.create_task(upstream_to_client()),
        asyncio.create_task(still_allowed()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        # Collect the tasks' errors (a send after the browser left): they end the session.
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
