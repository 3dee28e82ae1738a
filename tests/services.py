"""Start throw-away PostgreSQL and Redis servers on free loopback ports, then run a command.

    python -m tests.services -- pytest -q          # run the suite against real servers
    python -m tests.services --print-env            # start them and print the variables

The servers are the Debian packages' binaries, started in a temporary folder and stopped
(and their data deleted) when the command ends. PostgreSQL refuses to run as root, so as
root its processes run as the `postgres` system user.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing is listening on 127.0.0.1:{port} after {timeout}s")


def pg_bin(name: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    found = candidates[0] if candidates else shutil.which(name)
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is missing: apt-get install postgresql")
    return found


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    pwd.getpwnam("postgres")  # raises KeyError with a clear name if the user is missing
    return ["runuser", "-u", "postgres", "--", *cmd]


@contextlib.contextmanager
def postgres_server(workdir: Path) -> Iterator[str]:
    """A PostgreSQL cluster on a free port; yields its DATABASE_URL."""
    datadir = workdir / "pgdata"
    datadir.mkdir()
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres")
        shutil.chown(datadir, "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres(
            [
                pg_bin("initdb"),
                "-D",
                str(datadir),
                "-U",
                "gpupool",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = (
        f"-h 127.0.0.1 -p {port} -k {workdir} -F -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    subprocess.run(
        _as_postgres(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(datadir),
                "-o",
                options,
                "-l",
                str(workdir / "postgres.log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            _as_postgres(
                [pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "gpupool", "gpupool"]
            ),
            check=True,
        )
        yield f"postgres://gpupool@127.0.0.1:{port}/gpupool"
    finally:
        subprocess.run(
            _as_postgres([pg_bin("pg_ctl"), "-D", str(datadir), "-m", "immediate", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A Redis server on a free port, no persistence; yields its REDIS_URL."""
    binary = shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server is missing: apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def services() -> Iterator[dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="gpupool-services-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        pg_dir = workdir / "pg"
        pg_dir.mkdir()
        with postgres_server(pg_dir) as database_url, redis_server(workdir) as redis_url:
            yield {"DATABASE_URL": database_url, "REDIS_URL": redis_url}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-env", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    with services() as env:
        if args.print_env or not command:
            for key, value in env.items():
                print(f"export {key}={value}")
            if not command:
                return 0
        return subprocess.call(command, env={**os.environ, **env})


if __name__ == "__main__":
    sys.exit(main())
