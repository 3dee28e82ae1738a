"""`scripts/demo.py` run for real by a test: its own var/ folder and a free loopback port,
its output in a log file, the API reached over HTTP with the passwords the demo prints."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from portal import broker

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0
HTTP_TIMEOUT_S = 30.0
FINAL = {"succeeded", "failed", "stopped"}
RESTART_LINE = re.compile(r"^(web|worker|beat) exited \(code [^)]*\)", re.MULTILINE)

Client = Callable[..., tuple[int, Any]]
# Loopback only: never through a proxy named in the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (a Celery worker's pool children)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def embedded_env(var: Path, **settings: str) -> dict[str, str]:
    """This environment on the embedded default (no PostgreSQL, no Redis), var/ at `var`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(GPUPOOL_VAR_DIR=str(var), PYTHONUNBUFFERED="1", **settings)
    return env


def start_logged(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """`command` from the project's root in a session of its own, its output in `log_path`."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def broker_client(path: Path) -> Celery:
    """A Celery app that sends tasks by name into the embedded broker's file at `path`."""
    app = Celery("tests", broker=f"{broker.ALIAS}://localhost")
    app.conf.broker_transport_options = {"path": str(path)}
    return app


class DemoProcess:
    def __init__(self, tmp_path: Path) -> None:
        self.var = tmp_path / "var"
        self.log_path = tmp_path / "demo.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ports_port = free_port()  # users' HTTP ports: an origin of their own
        self.proc: subprocess.Popen[bytes] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> DemoProcess:
        env = embedded_env(
            self.var,
            GPUPOOL_HOST="127.0.0.1",
            GPUPOOL_PORT=str(self.port),
            GPUPOOL_PORTS_ORIGIN=f":{self.ports_port}",
            GPUPOOL_CYCLE_INTERVAL_S="2",
            GPUPOOL_RECONCILE_INTERVAL_S="1",
        )
        self.proc = start_logged([sys.executable, "scripts/demo.py"], env, self.log_path)
        try:
            self._wait_until_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        code = self.stop()
        if exc[0] is None:
            assert code == 0, (code, self.tail())
            assert "stopping..." in self.log(), self.tail()

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            if "GPUPool is running" in self.log():
                try:
                    status, _ = request(self.url, "GET", "/api/v1/users/me")
                except OSError:
                    status = 0
                if status in (401, 403):  # Django answers (and wants a login)
                    return
            time.sleep(1)
        raise AssertionError(f"the demo did not come up in {START_TIMEOUT_S:.0f} s\n{self.tail()}")

    def stop(self, again_after_s: float | None = None) -> int | None:
        """SIGTERM, as Ctrl-C does: the demo stops its processes and local pods. With
        `again_after_s`, a second SIGTERM that long after the first, while it stops (an
        impatient user, or `make` passing its own on)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if again_after_s is not None:
                time.sleep(again_after_s)
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    # --- reading it -----------------------------------------------------------------------
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def restarts(self) -> list[str]:
        return RESTART_LINE.findall(self.log())

    def assert_nothing_restarted(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.tail()
        assert not self.restarts(), self.tail()

    def pid_of(self, name: str) -> int | None:
        """The pid of the demo's latest `name` process (web, worker, beat), from its log."""
        started = re.findall(rf"^started {name} \(pid (\d+)\)", self.log(), re.MULTILINE)
        return int(started[-1]) if started else None

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(1)
        raise AssertionError(f"timed out waiting until {what}\n{self.tail()}")

    def broker_backlog(self) -> int:
        """Messages waiting in the embedded broker: grows without end if the worker lags."""
        db = sqlite3.connect(self.var / "celery-broker.sqlite3", timeout=30)
        try:
            return db.execute("SELECT count(*) FROM message").fetchone()[0]
        finally:
            db.close()

    def password(self, username: str) -> str:
        found = re.search(rf"^  {username}\s+(\S+)", self.log(), re.MULTILINE)
        assert found, self.tail()
        return found.group(1)

    # --- the API --------------------------------------------------------------------------
    def api_client(self, username: str) -> Client:
        status, body = request(
            self.url,
            "POST",
            "/api/v1/auth/token",
            {"username": username, "password": self.password(username)},
        )
        assert status == 200, (status, body)
        headers = {"Authorization": f"Token {body['token']}"}

        def call(method: str, path: str, data: Any = None) -> tuple[int, Any]:
            return request(self.url, method, path, data, headers)

        return call

    @staticmethod
    def workloads(client: Client) -> list[dict]:
        """Every workload the client may see, page by page."""
        rows: list[dict] = []
        while True:
            status, page = client("GET", f"/api/v1/workloads/?limit=100&offset={len(rows)}")
            assert status == 200, (status, page)
            rows += page["results"]
            if not page["next"]:
                return rows

    def stop_all_workloads(self, client: Client, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [w for w in self.workloads(client) if w["state"] not in FINAL]
            if not live:
                return
            for workload in live:
                status, body = client("POST", f"/api/v1/workloads/{workload['id']}/stop/")
                assert status in (200, 400), (status, body)  # 400: stopped meanwhile (a trial)
            time.sleep(2)
        raise AssertionError(f"workloads still live after {timeout:.0f} s: {live}")

    def browser(self, username: str) -> Callable[[str], tuple[int, str]]:
        """Signs in on the login form (session and CSRF cookies) as a browser does; returns
        get(path) -> (status, body), for pages such as a workspace's JupyterLab behind the
        proxy (redirects followed)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(jar)
        )
        with opener.open(f"{self.url}/accounts/login/", timeout=HTTP_TIMEOUT_S) as response:
            page = response.read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, page[:2000]
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": username,
                "password": self.password(username),
            }
        ).encode()
        login = urllib.request.Request(f"{self.url}/accounts/login/", data=form)
        login.add_header("Referer", f"{self.url}/accounts/login/")
        with opener.open(login, timeout=HTTP_TIMEOUT_S) as response:
            assert "/accounts/login/" not in response.url, "signed in"

        def get(path: str) -> tuple[int, str]:
            try:
                with opener.open(f"{self.url}{path}", timeout=HTTP_TIMEOUT_S) as response:
                    return response.status, response.read().decode(errors="replace")
            except urllib.error.HTTPError as err:
                return err.code, ""

        return get

    @staticmethod
    def state(client: Client, pk: int) -> str:
        status, body = client("GET", f"/api/v1/workloads/{pk}/")
        assert status == 200, (status, body)
        return body["state"]


def request(
    base: str, method: str, path: str, data: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    payload = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(f"{base}{path}", data=payload, method=method)
    req.add_header("Accept", "application/json")
    if payload is not None:
        req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with OPENER.open(req, timeout=HTTP_TIMEOUT_S) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        body = err.read()
        status = err.code
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode(errors="replace")[:2000]
