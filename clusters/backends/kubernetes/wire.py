"""The POSTs a pass makes by the thousand (a native pod's Binding and its `Scheduled`
Event, Evictions), and the GETs of the owners an intake pass reads by the hundred, written
and read here on the client's own pooled connections.

The kubernetes client's REST layer, urllib3's request machinery and http.client's response
parser (the email package's, for the headers) cost about 0.3 ms of CPU a request on this
side, five times what the request itself takes: writing the request in one piece and
reading its answer here is about 0.06 ms. What is kept: the client's configuration (its
URL with any path prefix, default headers, credentials through `update_params_for_auth`,
refreshed tokens included), its urllib3 connection pool (the same connections, TLS,
client certificates, verification, keep-alive, the check that a kept connection was not
dropped), the timeouts, and the answers' meaning: a status outside 2xx is an ApiException
with the status, reason, body and headers the generated client would give, and a broken
connection or answer is an error of the transport (OSError, urllib3's HTTPError), which
`KubernetesBackend.call` retries as before. Through an HTTP proxy (urllib3's ProxyManager)
the REST layer is used as before (`usable` is False).
"""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import urlsplit

import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

MAX_LINE = 65536  # a status or header line longer than this is not an API server's
MAX_HEADERS = 100
NO_BODY = (204, 304)
HEX = b"0123456789abcdefABCDEF"


class Answer:
    """What the server answered: what ApiException(http_resp=...) and the backend read."""

    __slots__ = ("data", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], data: bytes) -> None:
        self.status, self.reason, self.headers, self.data = status, reason, headers, data

    def getheaders(self) -> urllib3.HTTPHeaderDict:
        return urllib3.HTTPHeaderDict(self.headers)


class Wire:
    """POST JSON bytes to the API server over the client's connection pool."""

    def __init__(self, client: Any) -> None:
        self.client = client
        url = urlsplit(client.configuration.host)
        self.host = url.netloc.rpartition("@")[2]  # the Host header urllib3 would send
        self.prefix = url.path.rstrip("/")  # a server behind a path (a proxy of clusters)
        manager = client.rest_client.pool_manager
        self.pool = (
            None
            if isinstance(manager, urllib3.ProxyManager)
            else manager.connection_from_url(client.configuration.host)
        )

    @property
    def usable(self) -> bool:
        return self.pool is not None

    def post(self, path: str, body: bytes, timeout: tuple[float, float]) -> Answer:
        """POST `body` (JSON) to `path` (below the server's URL, quoted); the answer, read
        to its end. ApiException for a status outside 2xx."""
        return self.send(self._request("POST", path, body), timeout)

    def get(self, path: str, timeout: tuple[float, float]) -> Answer:
        """GET `path` (below the server's URL, quoted): one object, read to its end."""
        return self.send(self._request("GET", path, None), timeout)

    def send(self, request: bytes, timeout: tuple[float, float]) -> Answer:
        """One request on a pooled connection; its answer. ApiException outside 2xx."""
        pool = self.pool
        if pool is None:
            raise RuntimeError("no pool of direct connections: check `usable` first")
        # urllib3's own get and put: a pooled connection (checked for a drop, as urllib3
        # checks it), or a new one; always given back, closed after any failure.
        conn = pool._get_conn()
        keep = False
        try:
            if conn.sock is None:
                conn.timeout = timeout[0]
                conn.connect()
            sock = conn.sock
            if sock.gettimeout() != timeout[1]:
                sock.settimeout(timeout[1])
            sock.sendall(request)
            answer, keep = _read(sock)
        finally:
            if not keep:
                conn.close()
            pool._put_conn(conn)
        if not 200 <= answer.status < 300:
            raise ApiException(http_resp=answer)
        return answer

    def _request(self, method: str, path: str, body: bytes | None) -> bytes:
        headers = {**self.client.default_headers, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.client.update_params_for_auth(headers, [], ["BearerToken"])
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}"]
        for name, value in headers.items():
            text = str(value)
            if "\r" in text or "\n" in text or "\r" in name or "\n" in name or ":" in name:
                raise ValueError(f"invalid header {name!r}")  # as http.client refuses it
            lines.append(f"{name}: {text}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _read(sock: Any) -> tuple[Answer, bool]:
    """One answer from the socket: its status, headers and body (by Content-Length, chunked,
    or up to the close); whether the connection may be used again."""
    reader = sock.makefile("rb")
    try:
        while True:
            version, status, reason = _status_line(reader)
            headers = _headers(reader)
            if not 100 <= status < 200:  # an interim answer (100 Continue): the next
                break
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        if status in NO_BODY:
            data = b""
        elif chunked:
            data = _chunks(reader)
        elif length is not None:
            data = _exactly(reader, _length(length))
        else:  # no length: the body runs to the close
            data, keep = reader.read(), False
        return Answer(status, reason, headers, data), keep
    finally:
        reader.close()  # the file object only: the socket stays open


def _line(reader: Any) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ProtocolError("an answer's line is too long")
    return line


def _status_line(reader: Any) -> tuple[str, int, str]:
    line = _line(reader)
    if not line:
        raise http.client.RemoteDisconnected("the API server closed the connection")
    version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP answer: {line[:80]!r}")
    return version, int(code), reason.strip()


def _headers(reader: Any) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = _line(reader)
        if line in (b"\r\n", b"\n"):
            return headers
        if not line:
            raise ProtocolError("the answer ended in its headers")
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise ProtocolError(f"a malformed header line: {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise ProtocolError(f"more than {MAX_HEADERS} headers")


def _length(value: str) -> int:
    if not value.isdigit():  # also refuses "5, 5" and a negative length
        raise ProtocolError(f"Content-Length {value!r}")
    return int(value)


def _exactly(reader: Any, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise ProtocolError(f"the answer ended after {len(data)} of {size} bytes")
    return data


def _chunks(reader: Any) -> bytes:
    parts = []
    while True:
        size_text = _line(reader).split(b";", 1)[0].strip()
        if not size_text or size_text.strip(HEX):  # hex digits only: no sign, no 0x
            raise ProtocolError(f"a chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        parts.append(_exactly(reader, size))
        if _line(reader) not in (b"\r\n", b"\n"):
            raise ProtocolError("a chunk without its line end")
    while _line(reader) not in (b"\r\n", b"\n", b""):  # trailers: read past, not kept
        pass
    return b"".join(parts)
