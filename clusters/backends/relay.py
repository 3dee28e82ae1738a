"""The bridge from the portal to a local pod's declared ports: `relay WATCH SOCKET=PORT...`.

A sandboxed pod lives in its gang's network namespace (sandbox.netns_create): its ports are
TCP ports on that namespace's own loopback, which nothing on the machine can reach. The
backend starts this relay as root inside that namespace (nsenter) and outside the pod's
sandbox: it listens on one unix socket per port, in a folder only the portal's group enters
(the pod does not see it), and forwards each connection to 127.0.0.1:PORT in the namespace.
The portal's proxy and SSH tunnel dial `unix:SOCKET`, as they dial a Jupyter socket.

WATCH is the pod's wrapper as `pid:start-time` (local._proc_start_time): the relay removes
its sockets and exits once that process is gone, so no relay outlives its pod even when the
worker that started it has restarted since. Stdlib only: it runs under `python -I`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

CHUNK = 64 * 1024
WATCH_S = 1.0


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


async def _forward(port: int, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
    try:
        tool_r, tool_w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        client_w.close()  # nothing listens yet: the portal sees the connection refused
        return
    try:
        await asyncio.gather(_pipe(client_r, tool_w), _pipe(tool_r, client_w))
    finally:
        for writer in (tool_w, client_w):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def serve(sockets: dict[str, int], watch: tuple[int, str]) -> None:
    """Listen on each socket until the watched process is gone (or SIGTERM)."""
    servers = []
    for path, port in sockets.items():
        Path(path).unlink(missing_ok=True)  # a relay before this one (a worker restart)
        server = await asyncio.start_unix_server(
            lambda r, w, port=port: _forward(port, r, w), path=path
        )
        os.chmod(path, 0o660)  # the folder's group (the portal's) connects
        servers.append(server)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while start_time(watch[0]) == watch[1] and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_S)
    finally:
        for server in servers:
            server.close()
        for path in sockets:
            Path(path).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    pid, _, started = argv[1].partition(":")
    sockets = {}
    for pair in argv[2:]:
        path, _, port = pair.rpartition("=")
        sockets[path] = int(port)
    asyncio.run(serve(sockets, (int(pid), started)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
