"""The bridges between the portal and a local pod's network: `relay WATCH FORWARD...`.

A sandboxed pod lives in its gang's network namespace (sandbox.netns_create): its ports are
TCP ports on that namespace's own loopback, which nothing on the machine can reach, and it
reaches nothing of the machine. The backend starts this relay as root, outside the pod's
sandbox, with FORWARDs of three kinds:
- `unix:SOCKET>tcp:PORT`, run inside the namespace (nsenter): the portal's way in. It
  listens on SOCKET, in a folder only the portal's group enters (the pod does not see it),
  and forwards each connection to 127.0.0.1:PORT in the namespace. The portal's proxy and
  SSH tunnel dial `unix:SOCKET`, as they dial a Jupyter socket.
- `tcp:PORT>unix:SOCKET`, inside the namespace too: the pod's one way out to the portal,
  to report its checkpoints (scheduling/checkpoints.py): 127.0.0.1:PORT in the namespace,
  forwarded to SOCKET in the same folder, where
- `unix:SOCKET>door:URL`, run in the machine's namespace, lets through one request per
  connection, and only `POST` to URL's path (its checkpoint address, whose token says which
  workload it is) with a few headers, to URL's host: nothing else of the portal.

WATCH is the pod's wrapper as `pid:start-time` (local._proc_start_time): the relay removes
its sockets and exits once that process is gone, so no relay outlives its pod even when the
worker that started it has restarted since. WATCH `-`: started before the pod, it says
"ready" on stdout once it listens, then reads WATCH from stdin (end of input: the pod never
started; it exits). Stdlib only: it runs under `python -I`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

CHUNK = 64 * 1024
WATCH_S = 1.0
DOOR_HEADERS = ("authorization", "content-type", "accept", "user-agent")
DOOR_BODY_MAX = 64 * 1024
DOOR_READ_S = 10.0
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Dial = Callable[[], Awaitable[Streams]]


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other side may still answer
    except OSError:
        writer.close()


async def _forward(dial: Dial, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
    try:
        tool_r, tool_w = await dial()
    except OSError:
        client_w.close()  # nothing listens yet: the portal sees the connection refused
        return
    await _both_ways(client_r, client_w, tool_r, tool_w)


async def _both_ways(client_r, client_w, tool_r, tool_w, *, one_way: bool = False) -> None:
    try:
        pipes = [_pipe(tool_r, client_w)] + ([] if one_way else [_pipe(client_r, tool_w)])
        await asyncio.gather(*pipes)
    finally:
        for writer in (tool_w, client_w):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _door(url: str, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
    """One HTTP request, checked, then the portal's answer back; refusals in plain HTTP."""
    try:
        request = await asyncio.wait_for(_door_request(url, client_r), DOOR_READ_S)
    except (OSError, ValueError, EOFError, asyncio.LimitOverrunError, TimeoutError):
        request = b"400 Bad Request"
    if not request.startswith(b"POST "):
        client_w.write(
            b"HTTP/1.1 " + request + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        client_w.close()
        return
    target = urlsplit(url)
    secure = ssl.create_default_context() if target.scheme == "https" else None
    port = target.port or (443 if secure else 80)
    try:
        portal_r, portal_w = await asyncio.open_connection(target.hostname, port, ssl=secure)
    except OSError:
        client_w.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        client_w.close()
        return
    portal_w.write(request)
    await _both_ways(client_r, client_w, portal_r, portal_w, one_way=True)


async def _door_request(url: str, reader: asyncio.StreamReader) -> bytes:
    """The request to send to the portal, or the status line of a refusal."""
    target = urlsplit(url)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    method, path, _ = head[0].split(" ", 2)
    headers = {}
    for line in filter(None, head[1:]):
        name, _, value = line.partition(":")
        if "\n" in value or "\r" in value:
            raise ValueError("a line break inside a header")  # no header smuggled through
        headers[name.strip().lower()] = value.strip()
    if method != "POST" or path != target.path:
        return b"403 Forbidden"
    if "transfer-encoding" in headers:
        return b"411 Length Required"
    length = int(headers.get("content-length", "0"))
    if not 0 <= length <= DOOR_BODY_MAX:
        return b"413 Content Too Large"
    body = await reader.readexactly(length)
    kept = "".join(f"{n}: {headers[n]}\r\n" for n in DOOR_HEADERS if n in headers)
    return (
        f"POST {target.path} HTTP/1.1\r\nHost: {target.netloc}\r\nConnection: close\r\n"
        f"Content-Length: {length}\r\n{kept}\r\n"
    ).encode("latin-1") + body


async def _listen(forward: str) -> asyncio.Server:
    """One FORWARD (see the module's docstring): its server."""
    listen, _, dial = forward.partition(">")
    kind, _, target = dial.partition(":")
    if kind == "door":
        handler = partial(_door, target)
    elif kind == "tcp":
        handler = partial(_forward, partial(asyncio.open_connection, "127.0.0.1", int(target)))
    else:
        handler = partial(_forward, partial(asyncio.open_unix_connection, target))
    if listen.startswith("tcp:"):
        return await asyncio.start_server(handler, "127.0.0.1", int(listen.removeprefix("tcp:")))
    path = listen.removeprefix("unix:")
    Path(path).unlink(missing_ok=True)  # a relay before this one (a worker restart)
    server = await asyncio.start_unix_server(handler, path=path)
    os.chmod(path, 0o660)  # the folder's group (the portal's) connects
    return server


async def serve(forwards: list[str], watch: str) -> None:
    """Serve each FORWARD until the watched process is gone (or SIGTERM)."""
    servers = [await _listen(forward) for forward in forwards]
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        if watch == "-":
            watch = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        pid, _, started = watch.strip().partition(":")
        watch = (int(pid or 0), started)
        while start_time(watch[0]) == watch[1] and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_S)
    finally:
        for server in servers:
            server.close()
        for forward in forwards:
            if forward.startswith("unix:"):
                Path(forward.partition(">")[0].removeprefix("unix:")).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    asyncio.run(serve(argv[2:], argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
