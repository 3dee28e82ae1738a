"""The portal's web server: uvicorn serving `portal.asgi:application` at --host:--port and,
when GPUPOOL_PORTS_ORIGIN is `:<port>`, at that port of the same host too, where users'
HTTP ports and workspaces' JupyterLab are served on an origin apart from the portal's
(workspaces/ports_origin.py).
One process and one event loop for both, so a signal stops both.

    python -m portal.serve --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import os
import socket

import uvicorn

from workspaces.ports_origin import parse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m portal.serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    config = uvicorn.Config(
        "portal.asgi:application", host=args.host, port=args.port, log_level=args.log_level
    )
    sockets = [config.bind_socket()]
    _, host, ports_port = parse(os.environ.get("GPUPOOL_PORTS_ORIGIN", ""))
    if ports_port is not None and not host and ports_port != args.port:
        sockets.append(_bound(args.host, ports_port))
    uvicorn.Server(config).run(sockets=sockets)


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
