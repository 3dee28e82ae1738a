"""The fake API server reads a request's head as the real one's HTTP layer (Go's net/http)
does (tests/clusters/fake_http.py): what Go refuses is refused with its answer and the
connection closed; what it takes (any case of header names, keep-alive, HTTP/1.0 without
Host, Expect: 100-continue) is served."""

from __future__ import annotations

import socket

import pytest

from tests.clusters.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fake():
    with FakeApiServer() as server:
        yield server


def exchange(fake: FakeApiServer, request: bytes) -> tuple[bytes, bool]:
    """What the server answers to `request` on a fresh connection, and whether it closed
    the connection after."""
    host, port = fake.server.server_address[:2]
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(request)
        data = b""
        conn.settimeout(0.5)
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except TimeoutError:
            return data, False
        return data, True


def head(line: str, *headers: str, body: bytes = b"") -> bytes:
    return (line + "\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + body


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        (("Host: x", "Accept application/json"), b"malformed MIME header line"),
        (("Host: x", "Accept : application/json"), b'malformed MIME header: invalid key "Accept "'),
        (("Host: x", "Accept: a,", " b"), b"malformed MIME header line"),
        (("Host: x", "Content-Length: 2", "Content-Length: 3"), b"invalid Content-Length"),
        (("Host: x", "Content-Length: -1"), b"invalid Content-Length"),
        (("Accept: application/json",), b"missing required Host header"),
    ],
)
def test_a_head_go_refuses_is_400_and_the_connection_closed(fake, headers, said):
    answer, closed = exchange(fake, head("GET /version HTTP/1.1", *headers))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"\r\n\r\n400 Bad Request: " + said in answer
    assert closed
    assert fake.requests == []  # never reached the API


def test_other_versions_and_oversized_heads_are_refused_as_go_refuses_them(fake):
    answer, closed = exchange(fake, head("GET /version HTTP/2.0", "Host: x"))
    assert answer.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n") and closed
    answer, closed = exchange(fake, head("GET /version HTTP/1.1 extra", "Host: x"))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and closed
    many = [f"X-{i}: y" for i in range(101)]
    answer, closed = exchange(fake, head("GET /version HTTP/1.1", "Host: x", *many))
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") and closed


def test_a_head_go_takes_is_served_and_kept_alive(fake):
    body = b'{"metadata":{"name":"team"}}'
    create = head(
        "POST /api/v1/namespaces HTTP/1.1",
        "host: x",
        "content-TYPE: application/json",
        f"content-length: {len(body)}",
        body=body,
    )
    answer, closed = exchange(fake, create + head("GET /version HTTP/1.1", "Host: x"))
    assert answer.startswith(b"HTTP/1.1 201 Created\r\n")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 1  # the second, on the same connection
    assert not closed
    assert "team" in fake.namespaces()


def test_http_1_0_needs_no_host_and_closes_and_expect_100_continue_is_answered(fake):
    answer, closed = exchange(fake, head("GET /version HTTP/1.0"))
    assert answer.split(b"\r\n", 1)[0].endswith(b" 200 OK") and closed
    body = b'{"metadata":{"name":"later"}}'
    asked = head(
        "POST /api/v1/namespaces HTTP/1.1",
        "Host: x",
        "Expect: 100-continue",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        body=body,
    )
    answer, _ = exchange(fake, asked)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n")
