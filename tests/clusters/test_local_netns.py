"""Each local gang in a network namespace of its own, tried from inside real pods: what bob's
pod did (connect to every loopback listener of the machine: the portal, PostgreSQL, Redis,
alice's HTTP and SSH ports) must fail; a pod's own declared port is reached by the portal
through a unix socket, and a gang's pods still meet on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.db import connection

from clusters.backends import PodStatus, PortSpec, sandbox
from clusters.backends import local as local_backend
from clusters.backends.local import LocalBackend
from tests.clusters.conftest import make_cluster
from tests.clusters.test_local_backend import wait_until
from tests.clusters.test_local_sandbox import needs_sandbox, run_to_its_report, spec
from workspaces.jupyter import port_answers

PY = sys.executable
pytestmark = needs_sandbox

# Run inside a pod: connect to each host:port, report what happened, and the interfaces.
CONNECT = """
import json, socket, sys
def connect(host, port):
    if host == "abstract":  # a unix socket of the abstract namespace: the network's
        conn = socket.socket(socket.AF_UNIX)
        conn.connect("\\0" + port)
        return conn
    return socket.create_connection((host, port), timeout=3)
def attempt(host, port):
    try:
        with connect(host, port) as conn:
            conn.settimeout(3)
            return "ok:" + conn.recv(64).decode("latin-1")
    except OSError as exc:
        return type(exc).__name__
targets = json.loads(sys.argv[1])
report = {f"{host}:{port}": attempt(host, port) for host, port in targets}
report["interfaces"] = [line.split(":")[0].strip()
                        for line in open("/proc/net/dev").read().splitlines()[2:]]
try:
    report["resolv.conf"] = open("/etc/resolv.conf").read()
except OSError as exc:
    report["resolv.conf"] = type(exc).__name__
print(json.dumps(report), flush=True)
"""
# Serves one greeting on its declared port, forever (127.0.0.1 in its namespace).
GREETER = (
    "import os, socket\n"
    "s = socket.create_server(('127.0.0.1', int(os.environ['GPUPOOL_PORT'])))\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(os.environ['GREETING'].encode()); c.close()\n"
)


@pytest.fixture
def backend(db):
    backend = LocalBackend(make_cluster(config={"node_name": "here"}))
    yield backend
    backend.stop_all(grace_period_s=0)


@pytest.fixture
def listen():
    """Servers on this machine (the portal, PostgreSQL and Redis listen on its loopback):
    `listen(host)` starts one that says "host secret", and returns its port."""
    servers, done = [], threading.Event()

    def serve(server):
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"host secret")
            conn.close()

    def start(host: str) -> int | str:
        if host == "abstract":  # "\0name": in the network namespace, not the filesystem
            server = socket.socket(socket.AF_UNIX)
            server.bind(f"\0gpupool-test-{os.getpid()}-{len(servers)}")
            server.listen()
        else:
            server = socket.create_server((host, 0))
        server.settimeout(0.2)
        thread = threading.Thread(target=serve, args=(server,), daemon=True)
        thread.start()
        servers.append((server, thread))
        name = server.getsockname()
        return name[1:].decode() if host == "abstract" else name[1]

    yield start
    done.set()
    for server, thread in servers:
        thread.join()
        server.close()


def connect_from_pod(backend, workload_id: int, targets, pod_index: int = 0, **fields) -> dict:
    pod = spec(workload_id, (PY, "-c", CONNECT, json.dumps(targets)), **fields)
    name = f"gp-{workload_id}-{pod_index}"
    return run_to_its_report(backend, dataclasses.replace(pod, name=name, pod_index=pod_index))


def through_socket(path: Path | str) -> bytes:
    """What the portal reads from a pod's port, by its unix socket (b"" while it cannot)."""
    try:
        with socket.socket(socket.AF_UNIX) as portal:
            portal.connect(str(path))
            return portal.recv(64)
    except OSError:
        return b""


def _machine_address() -> str:
    """An address of this machine other than loopback, where it has one."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout
    return (out.split() or ["127.0.0.2"])[0]


def test_a_pod_reaches_no_listener_of_this_machine_and_has_only_a_loopback(backend, listen):
    """From a pod, 127.0.0.1 is the gang's own, where nothing listens, and nothing else
    routes: not this machine's address either, nor its abstract unix sockets (X11's,
    D-Bus's), which belong to the network namespace."""
    loopback, address, abstract = listen("127.0.0.1"), _machine_address(), listen("abstract")
    outside = listen(address)
    assert socket.create_connection(("127.0.0.1", loopback)).recv(11) == b"host secret"
    targets = [["127.0.0.1", loopback], [address, outside], ["abstract", abstract]]
    report = connect_from_pod(backend, 1, targets)
    assert report[f"127.0.0.1:{loopback}"] == "ConnectionRefusedError"
    assert report[f"{address}:{outside}"] == "OSError"  # Network is unreachable: no route
    assert report[f"abstract:{abstract}"] == "ConnectionRefusedError"
    assert report["interfaces"] == ["lo"]


@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="scripts/install-test-deps.sh")
def test_with_egress_a_pod_reaches_the_network_but_not_this_machines_loopback(db, listen):
    """`egress: true`: slirp4netns gives the namespace a way out; this machine's loopback
    stays out of reach (127.0.0.1 is the pod's own, slirp's gateway to it is off)."""
    backend = LocalBackend(make_cluster(config={"node_name": "here", "egress": True}))
    loopback, address = listen("127.0.0.1"), _machine_address()
    outside = listen(address)
    targets = [["127.0.0.1", loopback], ["10.0.2.2", loopback], [address, outside]]
    try:
        report = connect_from_pod(backend, 1, targets)
        netns = backend.state_dir.parent / "netns" / "1"
        slirp = int((netns.parent / "1.egress").read_text().split(":")[0])
    finally:
        backend.stop_all(grace_period_s=0)
    assert report[f"{address}:{outside}"] == "ok:host secret"  # out, through the NAT
    assert report[f"127.0.0.1:{loopback}"] == "ConnectionRefusedError"
    assert report[f"10.0.2.2:{loopback}"] == "OSError"  # slirp's way to the host loopback: off
    assert report["interfaces"] == ["lo", "tap0"]
    assert report["resolv.conf"] == "nameserver 10.0.2.3\n"  # slirp4netns's DNS forwarder
    assert local_backend._proc_start_time(slirp) is None  # gone with the namespace


def test_a_pod_cannot_reach_another_workloads_port_and_the_portal_reaches_it_by_socket(
    backend,
):
    """Alice's pod serves its declared port; bob's pod dials the same port number (the one
    alice's pod was given) and finds nothing; the portal reaches hers through her socket."""
    alice = backend.ensure_pod(
        spec(1, (PY, "-c", GREETER), env={"GREETING": "alice's files"},
             ports=(PortSpec("http", 8888),))
    )  # fmt: skip
    assert alice.ports == {"http": alice.endpoint}
    path = Path(alice.endpoint.removeprefix("unix:"))
    assert path.parent.name == "gp-1-0.ports"
    assert wait_until(lambda: through_socket(path), timeout=15) == b"alice's files"
    folder = path.parent.stat()
    assert (folder.st_uid, folder.st_mode & 0o777) == (0, 0o750)  # not the pod's to replace
    port = local_backend.netns_port(0, 0)
    report = connect_from_pod(backend, 2, [["127.0.0.1", port]], project_id=2)
    assert report[f"127.0.0.1:{port}"] == "ConnectionRefusedError"


def test_a_gangs_pods_share_one_namespace_which_goes_with_the_last_of_them(backend):
    """Pod 1 of the same workload reaches pod 0's port on 127.0.0.1 (rendezvous); once both
    pods are deleted, the namespace and the relay are gone too."""
    backend.ensure_pod(
        spec(1, (PY, "-c", GREETER), env={"GREETING": "rank 0"}, ports=(PortSpec("http", 80),))
    )
    netns = backend.state_dir.parent / "netns" / "1"
    assert sandbox.netns_exists(netns)
    port = local_backend.netns_port(0, 0)

    def peer_met() -> bool:
        report = connect_from_pod(backend, 1, [["127.0.0.1", port]], pod_index=1)
        backend.delete_pod(backend.pod_statuses()["gp-1-1"], grace_period_s=0)
        return report[f"127.0.0.1:{port}"] == "ok:rank 0"

    assert wait_until(peer_met, timeout=30)
    assert sandbox.netns_exists(netns)  # pod 0 still runs in it
    record = json.loads((backend.state_dir / "gp-1-0.json").read_text())
    relay = record["relay_pid"]
    assert relay and local_backend._proc_start_time(relay) == record["relay_start"]
    wait_until(lambda: backend.delete_pod(backend.pod_statuses()["gp-1-0"], grace_period_s=0))
    assert not sandbox.netns_exists(netns) and not netns.exists()
    wait_until(lambda: local_backend._proc_start_time(relay) is None)


def test_a_relay_that_died_is_started_again_while_its_pod_runs(backend):
    status = backend.ensure_pod(
        spec(1, (PY, "-c", GREETER), env={"GREETING": "still here"},
             ports=(PortSpec("http", 80),))
    )  # fmt: skip
    path = status.endpoint.removeprefix("unix:")
    record = json.loads((backend.state_dir / "gp-1-0.json").read_text())
    wait_until(lambda: Path(path).exists())
    local_backend._CHILDREN[record["relay_pid"]].kill()
    wait_until(lambda: not local_backend._alive(record["relay_pid"], record["relay_start"]))
    backend.ensure_pod(spec(1, (PY, "-c", GREETER), ports=(PortSpec("http", 80),)))
    assert wait_until(lambda: through_socket(path), timeout=15) == b"still here"


def test_the_probe_says_when_no_network_namespace_or_no_egress_can_be_made(db, monkeypatch):
    real_which = shutil.which
    cluster = make_cluster(config={"node_name": "here", "egress": True})
    monkeypatch.setattr(shutil, "which", lambda n: None if n == "slirp4netns" else real_which(n))
    assert LocalBackend(cluster).isolation() == sandbox.Isolation(False, sandbox.NO_EGRESS)
    assert "slirp4netns" in sandbox.NO_EGRESS
    monkeypatch.setattr(shutil, "which", real_which)
    monkeypatch.setattr(sandbox, "_probed", None)
    missing = {"nsenter": None}
    monkeypatch.setattr(sandbox.shutil, "which", lambda n: missing.get(n, real_which(n)))
    assert sandbox.probe() == sandbox.Isolation(
        False, "nsenter is not installed (Debian package util-linux)"
    )
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(sandbox.shutil, "which", real_which)
    monkeypatch.setattr(sandbox, "LOOPBACK_UP", "raise SystemExit('no loopback here')")
    isolation = sandbox.probe()
    assert not isolation.available
    assert isolation.reason == "no network namespace of its own for a pod: no loopback here"
    monkeypatch.setattr(sandbox, "_probed", None)


def test_a_port_answers_only_once_its_pods_server_listens_behind_the_relay(backend):
    """The relay's socket always accepts; with nothing on the port behind it, it hangs up,
    and the workspace page must not say the tool (an SSH server) answers."""
    quiet = backend.ensure_pod(
        spec(1, (PY, "-c", "import time; time.sleep(60)"), ports=(PortSpec("ssh", 22),))
    )
    wait_until(lambda: Path(quiet.endpoint.removeprefix("unix:")).exists())
    assert not port_answers(quiet.endpoint, timeout=2)
    serving = backend.ensure_pod(
        spec(2, (PY, "-c", GREETER), env={"GREETING": "SSH-2.0"}, ports=(PortSpec("ssh", 22),))
    )
    assert wait_until(lambda: port_answers(serving.endpoint, timeout=2), timeout=15)


@pytest.mark.services
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="run under `python -m tests.services -- pytest`"
)
def test_a_pod_reaches_neither_the_portals_postgresql_nor_its_redis(backend):
    """As the test set-up starts them (loopback, trust auth, no Redis password): what bob's
    pod used to set the cycle's lock and read the user table."""
    database = connection.settings_dict
    redis = urlsplit(os.environ["REDIS_URL"])
    targets = [[database["HOST"], int(database["PORT"])], [redis.hostname, redis.port]]
    for host, port in targets:
        socket.create_connection((host, port), timeout=5).close()  # both listen here
    report = connect_from_pod(backend, 1, targets)
    for host, port in targets:
        assert report[f"{host}:{port}"] == "ConnectionRefusedError", (host, port)


def test_a_namespace_made_for_a_spawn_that_never_happened_goes_when_its_pod_is_deleted(backend):
    """The worker made the gang's namespace, wrote the pod's record, and died before the
    process started: deleting the pod forgets the record and the namespace with it."""
    netns = backend.state_dir.parent / "netns" / "1"
    sandbox.netns_create(netns)
    stale = {"name": "gp-1-0", "workload_id": 1, "pid": None, "token": "never",
             "written_at": 0, "exit_file": "/nonexistent"}  # fmt: skip
    (backend.state_dir / "gp-1-0.json").write_text(json.dumps(stale))
    assert backend.delete_pod(PodStatus("gp-1-0", "ns", 1, 0), grace_period_s=0)
    assert not sandbox.netns_exists(netns) and not (backend.state_dir / "gp-1-0.json").exists()


# Run inside a pod: requests to its checkpoint URL as given, and to other paths of its door.
REPORTER = """
import json, os, urllib.request, urllib.error
url = os.environ["GPUPOOL_CHECKPOINT_URL"]
def ask(method, to, headers):
    request = urllib.request.Request(to, method=method, data=b"" if method == "POST" else None,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return f"{answer.status} {answer.read().decode()}"
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        return type(exc).__name__
token = {"Authorization": "Bearer " + os.environ["GPUPOOL_CHECKPOINT_TOKEN"],
         "X-Forwarded-Proto": "https"}
base = url.split("/api/")[0]
print(json.dumps({
    "url": url,
    "report": ask("POST", url, token),
    "read": ask("GET", url, token),
    "elsewhere": ask("POST", base + "/api/v1/users/", token),
}), flush=True)
"""


@pytest.fixture
def portal():
    """An HTTP server on this machine's loopback standing in for the portal's checkpoint
    API: what reaches it, it records."""
    seen = []

    class Portal(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            body = b"recorded"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    thread.join()


def test_a_pods_only_way_to_the_portal_is_posting_its_own_checkpoint_report(backend, portal):
    """A workload that keeps checkpoints reports them to the portal (scheduling/checkpoints.py):
    through its door, one POST to its own checkpoint address, with its token; any other
    method or path is refused before the portal, and headers beyond a few are dropped."""
    address, seen = portal
    path = "/api/v1/workloads/1/checkpoint/"
    env = {"GPUPOOL_CHECKPOINT_URL": address + path, "GPUPOOL_CHECKPOINT_TOKEN": "t0k"}
    report = run_to_its_report(backend, spec(1, (PY, "-c", REPORTER), env=env))
    door = local_backend.netns_port(0, local_backend.PORTS_MAX)
    assert report["url"] == f"http://127.0.0.1:{door}{path}"
    assert report["report"] == "200 recorded"
    assert (report["read"], report["elsewhere"]) == ("403", "403")
    [(method, reached, headers)] = seen
    assert (method, reached, headers["authorization"]) == ("POST", path, "Bearer t0k")
    assert "x-forwarded-proto" not in headers
    assert headers["host"] == address.removeprefix("http://")
