"""Tenants on the local backend: each pod in a bubblewrap sandbox, as a user of its own, with
a clean environment. Tried from inside real pods: what alice did from her notebook (read the
portal's database and credentials, another department's token in /proc/*/environ, its files)
must fail."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from clusters.agent.procmap import Owner, ProcessMap
from clusters.backends import PodPhase, PodSpec, PortSpec, VolumeSpec, sandbox
from clusters.backends.local import LocalBackend
from clusters.pod_users import pod_uid
from clusters.reconcile import cluster_reconcile
from scheduling.models import WorkloadState
from tests import isolation
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.clusters.test_local_backend import wait_until

PY = sys.executable
needs_sandbox = pytest.mark.usefixtures("sandbox_required")

# Run inside a pod: try each path, report what happened, as JSON on stdout.
PROBE = """
import json, os, sys
def attempt(path, mode="r"):
    try:
        with open(path, mode) as handle:
            if mode == "r":
                handle.read(64)
            else:
                handle.write("x")
        return "ok"
    except OSError as exc:
        return type(exc).__name__
paths = json.loads(sys.argv[1])
writes = json.loads(sys.argv[2])
report = {path: attempt(path) for path in paths}
report.update({"write:" + path: attempt(path, "w") for path in writes})
environs = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs[pid] = open(f"/proc/{pid}/environ", "rb").read().decode("latin-1")
        except OSError as exc:
            environs[pid] = type(exc).__name__
report["environs"] = environs
report["env"] = dict(os.environ)
report["uid"], report["gid"] = os.getuid(), os.getgid()
print(json.dumps(report), flush=True)
"""


def spec(workload_id: int, command: tuple[str, ...], **fields) -> PodSpec:
    return PodSpec(
        name=f"gp-{workload_id}-0",
        namespace="ns",
        workload_id=workload_id,
        pod_index=0,
        node_name="here",
        command=command,
        **fields,
    )


def run_probe(backend: LocalBackend, workload_id: int, reads: list[str], writes=(), **fields):
    command = (PY, "-c", PROBE, json.dumps(reads), json.dumps(list(writes)))
    return run_to_its_report(backend, spec(workload_id, command, **fields))


def run_to_its_report(backend: LocalBackend, pod: PodSpec) -> dict:
    """Run the pod to its end; the JSON its last line of output says."""
    backend.ensure_pod(pod)
    name = pod.name
    status = wait_until(
        lambda: (s := backend.pod_statuses()[name]).phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
        and s,
        timeout=30,
    )
    output = backend.pod_logs(name, "ns")
    assert status.phase == PodPhase.SUCCEEDED, output
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture
def backend(db):
    return LocalBackend(make_cluster(config={"node_name": "here"}))


@pytest.fixture
def portal_files():
    """What the portal keeps in var/: its SQLite database and the demo's credentials."""
    var = Path(settings.VAR_DIR)
    files = {
        "database": var / "gpupool.sqlite3",
        "credentials": var / "demo-credentials.txt",
        "kubeconfig key": var / "local" / "secret.key",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("token-abc123")
    return files


@needs_sandbox
def test_a_pod_cannot_read_the_portals_database_or_credentials_nor_write_its_virtualenv(
    backend, portal_files
):
    readable_before = {str(path): "ok" for path in portal_files.values()}
    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    report = run_probe(
        backend,
        1,
        reads=[*readable_before, str(venv_file)],
        writes=[str(Path(sys.prefix) / "planted.py"), str(Path(settings.VAR_DIR) / "x")],
    )
    for path in portal_files.values():
        assert report[str(path)] == "FileNotFoundError"  # var/ is not in the sandbox at all
    assert report[str(venv_file)] == "ok"  # the interpreter's files are there, read-only
    assert report[f"write:{Path(sys.prefix) / 'planted.py'}"] == "OSError"  # read-only fs
    assert report[f"write:{Path(settings.VAR_DIR) / 'x'}"] == "PermissionError"
    assert (report["uid"], report["gid"]) == (pod_uid(1), sandbox.project_gid(0))


@needs_sandbox
def test_a_pod_sees_neither_another_pods_environment_nor_its_files(backend):
    """Pod 1 (another department) holds a token in its environment and a file in its folder;
    pod 2 looks for both, in /proc and by path."""
    secret = "other-department-secret-7f3a"
    holder = (PY, "-c", "open('notes.txt', 'w').write('private'); import time; time.sleep(60)")
    backend.ensure_pod(spec(1, holder, env={"JUPYTER_TOKEN": secret}, project_id=1))
    other_folder = backend.workload_dir(1)
    wait_until(lambda: (other_folder / "notes.txt").exists())
    try:
        report = run_probe(backend, 2, reads=[str(other_folder / "notes.txt")], project_id=2)
    finally:
        backend.delete_pod(backend.pod_statuses()["gp-1-0"], grace_period_s=0)
    assert report[str(other_folder / "notes.txt")] == "FileNotFoundError"
    assert not any(secret in environ for environ in report["environs"].values())
    # Its own PID namespace: the sandbox's init, the command, and nothing of this machine.
    assert len(report["environs"]) <= 3
    # On the machine itself, the folder belongs to pod 1's user alone.
    info = other_folder.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (
        pod_uid(1), sandbox.project_gid(1), 0o700
    )  # fmt: skip


@needs_sandbox
def test_a_pods_environment_holds_no_portal_secret(backend, monkeypatch):
    """The worker's own environment (SECRET_KEY, DATABASE_URL, mail password in production)
    never reaches a pod: only its workload's variables and GPUPool's."""
    for name in ("SECRET_KEY", "DATABASE_URL", "EMAIL_HOST_PASSWORD", "GPUPOOL_KUBECONFIG_KEY"):
        monkeypatch.setenv(name, f"portal-secret-{name}")
    report = run_probe(backend, 1, reads=[], env={"WANDB_MODE": "offline"})
    env = report["env"]
    assert not any("portal-secret" in value for value in env.values())
    assert env["WANDB_MODE"] == "offline" and env["CUDA_VISIBLE_DEVICES"] == ""
    gpupool = {k for k in env if k.startswith("GPUPOOL_")}
    assert gpupool == {"GPUPOOL_POD_TOKEN", "GPUPOOL_BIND_HOST"}
    # What else is there is the backend's fixed list, set by nobody's environment.
    assert set(env) - gpupool <= {
        "PATH", "HOME", "LANG", "LC_ALL", "PYTHONUNBUFFERED", "WANDB_MODE",
        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PWD",  # PWD: bwrap sets it
    }  # fmt: skip


@needs_sandbox
def test_a_daemon_a_pod_leaves_behind_dies_with_the_pods_namespace(backend):
    code = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
    )
    backend.ensure_pod(spec(1, (PY, "-c", code)))
    status = wait_until(
        lambda: (s := backend.pod_statuses()["gp-1-0"]).phase == PodPhase.SUCCEEDED and s
    )
    record = json.loads((backend.state_dir / "gp-1-0.json").read_text())
    wait_until(lambda: not _pids_with(record["token"]))
    wait_until(lambda: backend.delete_pod(status, grace_period_s=0))  # a pass may find it going


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _pids_with(token: str) -> list[int]:
    from clusters.backends.local import _pids_with_token

    return _pids_with_token(token)


@needs_sandbox
def test_sigterm_reaches_the_sandboxed_command_which_may_checkpoint(backend):
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('checkpointed', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    status = backend.ensure_pod(spec(1, (PY, "-c", code)))
    wait_until(lambda: "up" in backend.pod_logs("gp-1-0", "ns"))
    wait_until(lambda: backend.delete_pod(status, grace_period_s=30))
    assert "checkpointed" in backend.pod_logs("gp-1-0", "ns")


@needs_sandbox
def test_a_pod_stopped_as_it_starts_goes_at_once_not_after_its_grace_period(backend):
    """SIGTERM may arrive while bwrap still builds the sandbox: it waits for the command."""
    status = backend.ensure_pod(spec(1, (PY, "-c", "import time; time.sleep(60)")))
    token = json.loads((backend.state_dir / "gp-1-0.json").read_text())["token"]
    while not any(_comm(pid) == "bwrap" for pid in _pids_with(token)):
        pass  # the moment the sandbox is being built, before the command runs
    backend.delete_pod(status, grace_period_s=60)  # SIGTERM, now
    wait_until(lambda: backend.delete_pod(status, grace_period_s=60), timeout=15)
    assert backend.pod_statuses() == {}


@needs_sandbox
def test_a_data_volume_is_bound_only_under_the_clusters_roots(db, tmp_path):
    root = tmp_path / "datasets"
    (root / "imagenet").mkdir(parents=True)
    (root / "imagenet" / "README").write_text("images")
    (root / "imagenet").chmod(0o777)
    cluster = make_cluster(config={"node_name": "here"}, data_volume_roots=[str(root)])
    backend = LocalBackend(cluster)
    volume = VolumeSpec("data", str(root / "imagenet"), "/data")
    report = run_probe(
        backend, 1, reads=["/data/README", "/etc/shadow"], writes=["/data/out"], volumes=(volume,)
    )
    assert report["/data/README"] == "ok" and report["write:/data/out"] == "ok"
    assert report["/etc/shadow"] == "FileNotFoundError"
    assert (root / "imagenet" / "out").stat().st_uid == pod_uid(1)

    for number, outside in enumerate(("/etc", str(root / "imagenet" / ".." / ".." / "..")), 2):
        for fields in (
            {"volumes": (VolumeSpec("data", outside, "/data"),)},
            {"checkpoint_dir": outside},
        ):
            status = backend.reconcile(
                [spec(number, (PY, "-c", "pass"), **fields)], grace_period_s=0
            ).statuses[f"gp-{number}-0"]
            assert status.phase == PodPhase.FAILED
            assert "not a directory under this cluster's data-volume roots" in status.message


@needs_sandbox
def test_an_absolute_checkpoint_directory_under_a_root_is_writable_in_the_pod(db, tmp_path):
    checkpoints = tmp_path / "checkpoints" / "run-1"
    checkpoints.mkdir(parents=True)
    checkpoints.chmod(0o777)
    cluster = make_cluster(config={"node_name": "here"}, data_volume_roots=[str(tmp_path)])
    report = run_probe(
        LocalBackend(cluster),
        1,
        reads=[],
        writes=[f"{checkpoints}/step-100.pt"],
        checkpoint_dir=str(checkpoints),
        env={"GPUPOOL_CHECKPOINT_DIR": str(checkpoints)},
    )
    assert report[f"write:{checkpoints}/step-100.pt"] == "ok"
    assert (checkpoints / "step-100.pt").read_text() == "x"


@needs_sandbox
def test_a_tool_on_the_pods_socket_is_reached_by_the_portal_alone(backend):
    """A port another user of the machine could connect to is replaced by a unix socket in a
    folder that only the pod's user and the portal's group enter."""
    server = (
        "import os, socket\n"
        "path = os.environ['GPUPOOL_SOCKET']\n"
        # The socket appears under its name once it listens: bind makes the file, and a
        # connect between bind and listen is refused.
        "s = socket.socket(socket.AF_UNIX); s.bind(path + '.new'); s.listen()\n"
        "os.rename(path + '.new', path)\n"
        "c, _ = s.accept(); c.sendall(b'hello portal'); c.close()\n"
    )
    status = backend.ensure_pod(
        spec(1, (PY, "-c", server, "$(GPUPOOL_SOCKET)"), ports=(PortSpec("http", 8888),))
    )
    assert status.endpoint.startswith("unix:")
    path = Path(status.endpoint.removeprefix("unix:"))
    wait_until(lambda: path.exists())
    assert path.parent.stat().st_mode & 0o007 == 0  # no one else may even look
    report = run_probe(backend, 2, reads=[str(path), "/run/gpupool/tool.sock"])
    assert report[str(path)] == "FileNotFoundError"  # pod 2 does not see pod 1's folder
    assert report["/run/gpupool/tool.sock"] == "FileNotFoundError"  # nor its socket
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        assert client.recv(100) == b"hello portal"


def test_a_machine_that_cannot_sandbox_runs_only_platform_admins_work(org):
    """Turned off here (the same answer as a missing bwrap or a worker not running as root):
    the cluster page says so, a researcher's workload fails with the reason, an admin's runs."""
    cluster = make_cluster(config={"node_name": "here", "sandbox": False})
    node = make_node(cluster, "here")
    theirs = make_workload(org.project_a, org.researcher, "theirs", command=[PY, "-c", "pass"])
    mine = make_workload(org.project_a, org.platform_admin, "mine", command=[PY, "-c", "pass"])
    for workload in (theirs, mine):
        admit(workload, node)
    cluster_reconcile(cluster)
    theirs.refresh_from_db()
    assert theirs.state == WorkloadState.FAILED
    assert "cannot isolate pods (sandboxing is turned off" in theirs.events.last().message
    assert not theirs.allocations.exists()
    wait_until(lambda: cluster_reconcile(cluster) or _state(mine) == WorkloadState.SUCCEEDED)


def _state(workload) -> str:
    workload.refresh_from_db()
    return workload.state


def test_the_probe_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "does not run as root" in sandbox.probe().reason
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    assert sandbox.probe() == sandbox.Isolation(
        False, "bwrap is not installed (Debian package bubblewrap)"
    )
    monkeypatch.setattr(sandbox, "_probed", None)


def test_the_clusters_page_says_whether_the_local_machine_isolates_tenants(client_as, org):
    make_cluster(config={"node_name": "here", "sandbox": False})
    page = client_as(org.platform_admin).get("/clusters/").content.decode()
    assert "not isolated" in page and "sandboxing is turned off" in page
    assert "only platform administrators" in page


def test_the_page_shows_the_workers_answer_not_the_web_processs(client_as, org, monkeypatch):
    """The worker (root) syncs the inventory and finds it can sandbox; a web process that runs
    as another user could not, and must not say otherwise."""
    cluster = make_cluster(config={"node_name": "here"})
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(sandbox, "probe", lambda enabled=True: sandbox.Isolation(True))
    LocalBackend(cluster).list_inventory()  # in the worker
    monkeypatch.setattr(
        sandbox, "probe", lambda enabled=True: sandbox.Isolation(False, "not root here")
    )
    page = client_as(org.platform_admin).get("/clusters/").content.decode()
    assert "tenants isolated" in page and "not root here" not in page
    assert "on a network of its workload's own with no way out (egress off)" in page


@needs_sandbox
def test_a_pod_cannot_make_the_portal_read_or_write_a_file_through_its_log(backend, tmp_path):
    """The log lies in the pod's own folder: a link (or a FIFO) put in its place must neither
    show the portal's files in the pod's logs nor make the worker write to them, or hang."""
    secret = tmp_path / "root-only.txt"
    secret.write_text("root-secret\n")
    secret.chmod(0o600)
    swap = f"import os; os.remove('pod-0.log'); os.symlink({str(secret)!r}, 'pod-0.log')"
    backend.ensure_pod(spec(1, (PY, "-c", swap)))
    status = wait_until(lambda: (s := backend.pod_statuses()["gp-1-0"]).phase.value in (
        "Succeeded", "Failed") and s)  # fmt: skip
    assert (backend.workload_dir(1) / "pod-0.log").is_symlink()
    assert "root-secret" not in backend.pod_logs("gp-1-0", "ns")
    wait_until(lambda: backend.delete_pod(status, grace_period_s=0))  # a pass may find it going
    os.mkfifo(backend.workload_dir(1) / "pod-0.log.fifo")
    (backend.workload_dir(1) / "pod-0.log").unlink()
    os.rename(backend.workload_dir(1) / "pod-0.log.fifo", backend.workload_dir(1) / "pod-0.log")
    backend.ensure_pod(spec(1, (PY, "-c", "print('again')")))  # a restart: a fresh log
    wait_until(lambda: "again" in backend.pod_logs("gp-1-0", "ns"))
    assert secret.read_text() == "root-secret\n"


@needs_sandbox
def test_a_virtualenv_under_tmp_is_seen_inside_the_sandbox(monkeypatch):
    """A project cloned under /tmp has its virtualenv there: the pod's private /tmp must not
    be laid over it (every pod of such a clone failed one second after admission)."""
    prefix = Path(tempfile.mkdtemp(prefix="gpupool-venv-", dir="/tmp"))
    prefix.chmod(0o755)  # as a clone's .venv is
    try:
        (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
        monkeypatch.setattr(sys, "prefix", str(prefix))
        monkeypatch.setattr(sys, "exec_prefix", str(prefix))
        monkeypatch.setattr(sys, "executable", os.path.realpath(sys.executable))
        argv = sandbox.wrap(["cat", str(prefix / "pyvenv.cfg")], uid=pod_uid(1),
                            gid=sandbox.project_gid(1), workdir=None, mounts=())  # fmt: skip
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False, env={})
    finally:
        shutil.rmtree(prefix)
    assert (done.returncode, done.stdout) == (0, b"home = /usr/bin\n"), done.stderr


def test_isolation_tests_fail_rather_than_skip_where_pods_cannot_be_sandboxed(monkeypatch):
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Isolation(False, "no bubblewrap"))
    monkeypatch.delenv(isolation.OPT_OUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="no bubblewrap"):
        isolation.require_sandbox()
    monkeypatch.setenv(isolation.OPT_OUT, "1")
    with pytest.raises(pytest.skip.Exception, match="no bubblewrap"):
        isolation.require_sandbox()


@pytest.mark.django_db
@needs_sandbox
def test_a_report_left_by_another_cluster_of_the_same_name_is_not_this_ones():
    """The worker's isolation report is kept under the cluster's name: one left by a
    deleted cluster with sandboxing turned off said so for the next cluster of that name
    (its researchers' submits were refused as unisolated)."""
    old = make_cluster("same-name", config={"sandbox": False})
    assert not LocalBackend(old).isolation().available  # the worker's report, kept in var/
    old.delete()
    new = make_cluster("same-name")
    assert LocalBackend(new).reported_isolation() == sandbox.probe()  # available here


@needs_sandbox
def test_the_agent_maps_a_pods_process_by_its_uid_not_the_workload_its_environment_names(
    backend,
):
    # Workload 3's pod names workload 4 in its environment, then starts the process that
    # would use a GPU: the node agent still counts that process as workload 3's.
    code = (
        "import os, sys, time\n"
        "env = {**os.environ, 'GPUPOOL_WORKLOAD_ID': '4', 'GPUPOOL_POD_INDEX': '0'}\n"
        "os.execve(sys.executable, [sys.executable, '-c', "
        "'print(\"up\", flush=True); import time; time.sleep(60)'], env)\n"
    )
    status = backend.ensure_pod(spec(3, (PY, "-c", code)))
    wait_until(lambda: "up" in backend.pod_logs("gp-3-0", "ns"))
    record = json.loads((backend.state_dir / "gp-3-0.json").read_text())
    forged = [
        pid
        for pid in _members_of(record)
        if b"GPUPOOL_WORKLOAD_ID=4" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    ]
    assert forged, "the pod's process with the forged environment was not found"
    procmap = ProcessMap()
    procmap.update([
        {"workload_id": 3, "pod_index": 0, "backend_ref": f"{record['pid']}:x"},
        {"workload_id": 4, "pod_index": 0, "backend_ref": "1:x"},
    ])  # fmt: skip
    assert {procmap.owner(pid) for pid in forged} == {Owner(3, 0)}
    wait_until(lambda: backend.delete_pod(status, grace_period_s=0))


def _members_of(record: dict) -> list[int]:
    from clusters.backends.local import _members

    return _members(record)


@needs_sandbox
def test_without_a_cgroup_a_pod_that_copies_anothers_token_is_not_taken_for_it(backend):
    # Pod B's processes are found by its token where there is no cgroup (a machine
    # without controllers). Pod A learns B's token and carries it: A's processes are not
    # B's (else stopping B would signal A, and A's process could pass for B's).
    sleeper = "print('up', flush=True); import time; time.sleep(60)"
    b = backend.ensure_pod(spec(6, (PY, "-c", sleeper)))
    wait_until(lambda: "up" in backend.pod_logs("gp-6-0", "ns"))
    b_record = {**json.loads((backend.state_dir / "gp-6-0.json").read_text()), "cgroup": None}
    code = (
        "import os, sys\n"
        f"env = {{**os.environ, 'GPUPOOL_POD_TOKEN': {b_record['token']!r}}}\n"
        f"os.execve(sys.executable, [sys.executable, '-c', {sleeper!r}], env)\n"
    )
    a = backend.ensure_pod(spec(5, (PY, "-c", code)))
    wait_until(lambda: "up" in backend.pod_logs("gp-5-0", "ns"))
    a_record = json.loads((backend.state_dir / "gp-5-0.json").read_text())
    a_pids = set(_members_of(a_record))
    try:
        copied = {pid for pid in _pids_with(b_record["token"]) if pid in a_pids}
        assert copied, "pod A's process does not carry B's token"
        assert not copied & set(_members_of(b_record))
        assert _members_of(b_record)  # B's own processes are still found
    finally:
        for status in (a, b):
            wait_until(lambda s=status: backend.delete_pod(s, grace_period_s=0))
