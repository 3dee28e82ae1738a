"""The fake API server's request heads, read as the real server's HTTP/1.1 layer (Go's net/http
and net/textproto) reads them, and its whole answer written at once.

http.server reads headers with the email package's parser, which takes nearly anything
(a line without a colon, a space before the colon, a request without Host) and costs more
than a Binding's whole handling here. This reader refuses what Go's server refuses, with
its answers: a request line that is not METHOD SP TARGET SP HTTP/1.x is 400 (another major
version 505); a header line without a colon, a name that is not a token (a space before
the colon), a folded (continued) line, a Content-Length that is not a number or repeated
with another value, and an HTTP/1.1 request without Host are 400 with net/http's text, and
the connection is closed. Lines over 64 KiB or more than 100 headers are 431.
"""

from __future__ import annotations

import re
from typing import Any

MAX_LINE = 65536
MAX_HEADERS = 100
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
REQUEST_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/(\d)\.(\d)")


class BadRequest(Exception):
    """What Go's server answers a request it cannot read, before closing the connection."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code
        self.text = text


class Headers(dict):
    """A request's headers by lower-case name; `get` takes any case and gives the first
    value (Go's Header.Get), `values` all of them."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        found = dict.get(self, name.lower())
        return found[0] if found else default

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())[0]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())

    def values_of(self, name: str) -> list[str]:
        return list(dict.get(self, name.lower()) or [])


def request_line(raw: bytes) -> tuple[str, str, str]:
    """(method, target, version) of the request line."""
    line = raw.decode("latin-1").rstrip("\r\n")
    found = REQUEST_LINE.fullmatch(line)
    if found is None:
        raise BadRequest(400, f"400 Bad Request: malformed HTTP request {line[:64]!r}")
    method, target, major, minor = found.groups()
    if major != "1":
        raise BadRequest(505, "505 HTTP Version Not Supported: unsupported protocol version")
    return method, target, f"HTTP/1.{minor}"


def read_headers(rfile: Any, version: str) -> Headers:
    """The header lines up to the blank one, checked as textproto.ReadMIMEHeader and the
    server check them."""
    headers = Headers()
    for _ in range(MAX_HEADERS + 1):
        raw = rfile.readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise BadRequest(431, "431 Request Header Fields Too Large")
        if raw in (b"\r\n", b"\n"):
            break
        if not raw:
            raise BadRequest(400, "400 Bad Request: unexpected EOF in the headers")
        line = raw.decode("latin-1").rstrip("\r\n")
        if line[:1] in (" ", "\t"):
            raise BadRequest(400, f"400 Bad Request: malformed MIME header line: {line}")
        name, colon, value = line.partition(":")
        if not colon:
            raise BadRequest(400, f"400 Bad Request: malformed MIME header line: {line}")
        if not TOKEN.fullmatch(name):
            raise BadRequest(400, f'400 Bad Request: malformed MIME header: invalid key "{name}"')
        headers.setdefault(name.lower(), []).append(value.strip(" \t"))
    else:
        raise BadRequest(431, "431 Request Header Fields Too Large")
    lengths = set(headers.values_of("Content-Length"))
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise BadRequest(400, "400 Bad Request: invalid Content-Length")
    if version == "HTTP/1.1" and "Host" not in headers:
        raise BadRequest(400, "400 Bad Request: missing required Host header")
    return headers


def refusal(error: BadRequest) -> bytes:
    """net/http's answer to a request it could not read (then it closes the connection)."""
    reason = error.text.split(": ", 1)[0].split(" ", 1)[1]
    body = error.text.encode()
    return (
        f"HTTP/1.1 {error.code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
