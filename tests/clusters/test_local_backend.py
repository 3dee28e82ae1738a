"""The local backend runs pods as real processes on this machine."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from clusters.backends import PodPhase, PodSpec, PortSpec, expand_vars
from clusters.backends import local as local_backend
from clusters.backends.local import LocalBackend
from clusters.reconcile import cluster_reconcile
from scheduling.lifecycle import workload_transition
from scheduling.models import WorkloadPolicy, WorkloadState
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload

PY = sys.executable
HAS_DRIVER = Path("/proc/driver/nvidia").exists()


def wait_until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def spec(name: str = "gp-1-0", **fields) -> PodSpec:
    fields.setdefault("command", (PY, "-c", "print('hi')"))
    return PodSpec(
        name=name, namespace="ns", workload_id=1, pod_index=0, node_name="here", **fields
    )


@pytest.fixture
def backend(db):
    return LocalBackend(make_cluster(config={"node_name": "here"}))


def test_expand_vars_follows_kubernetes_rules():
    env = {"A": "1", "PORT": "8888"}
    assert expand_vars("--port=$(PORT)", env) == "--port=8888"
    assert expand_vars("$(MISSING)-$(A)", env) == "$(MISSING)-1"
    assert expand_vars("$$(A) costs $$5", env) == "$(A) costs $5"


def test_inventory_is_one_node_with_the_pool_label_and_no_gpus_without_a_driver(backend):
    [node] = backend.list_inventory()
    assert node.name == "here"
    assert node.labels == {"gpupool.io/node-pool": "local"}
    assert node.cpu_cores >= 1 and node.memory_mib > 0
    if not HAS_DRIVER:
        assert node.gpus == ()


def test_a_pod_runs_to_completion_with_its_environment_and_logs(backend):
    code = (
        "import os; print(os.environ['GPUPOOL_PORT'], os.environ['CUDA_VISIBLE_DEVICES'],"
        " os.environ['X'], os.getcwd())"
    )
    status = backend.ensure_pod(
        spec(
            command=(PY, "-c", code, "$(X)"),
            env={"X": "hello"},
            gpu_indices=(2, 3),
            ports=(PortSpec("http", 8888),),
        )
    )
    if status.endpoint.startswith("unix:"):  # sandboxed: a port on the gang's own loopback
        assert status.endpoint.endswith("/gp-1-0.ports/http.sock")
        port = str(local_backend.netns_port(0, 0))
    else:
        assert status.endpoint.startswith("127.0.0.1:")
        port = status.endpoint.split(":")[1]
    done = wait_until(lambda: backend.pod_statuses()["gp-1-0"].phase == PodPhase.SUCCEEDED)
    assert done
    final = backend.pod_statuses()["gp-1-0"]
    assert final.exit_code == 0
    workdir = Path(backend.workload_dir(1))
    assert backend.pod_logs("gp-1-0", "ns").strip() == f"{port} 2,3 hello {workdir}"


def test_a_failing_pod_reports_its_exit_code(backend):
    backend.ensure_pod(
        spec(command=(PY, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"))
    )
    wait_until(lambda: backend.pod_statuses()["gp-1-0"].phase == PodPhase.FAILED)
    assert backend.pod_statuses()["gp-1-0"].exit_code == 3
    assert "boom" in backend.pod_logs("gp-1-0", "ns")


def test_ensure_pod_twice_starts_one_process(backend):
    first = backend.ensure_pod(spec(command=(PY, "-c", "import time; time.sleep(30)")))
    second = backend.ensure_pod(spec(command=(PY, "-c", "import time; time.sleep(30)")))
    assert first.backend_ref == second.backend_ref
    assert len(backend.pod_statuses()) == 1
    wait_until(lambda: backend.delete_pod(second, grace_period_s=5))  # a pass may find it going


def test_a_pod_another_pass_is_starting_is_pending_here_and_not_started_twice(backend):
    """Two passes of one cluster at once (two worker children): the one that finds the pod
    claimed reports it pending and starts nothing; once the claim goes, it is started."""
    with backend._spawn_claim("gp-1-0") as claimed:
        assert claimed
        status = backend.ensure_pod(spec(command=["sleep", "30"]))
        assert status.phase == PodPhase.PENDING
        assert not list(backend.state_dir.glob("gp-1-0.json"))  # nothing started
    status = backend.ensure_pod(spec(command=["sleep", "30"]))
    assert status.phase == PodPhase.RUNNING
    wait_until(lambda: backend.delete_pod(status, grace_period_s=5))  # a pass may find it going


def test_stop_sends_sigterm_to_the_whole_group_and_the_pod_can_clean_up(backend):
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('checkpointed', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    status = backend.ensure_pod(spec(command=(PY, "-c", code)))
    wait_until(lambda: "up" in backend.pod_logs("gp-1-0", "ns"))
    wait_until(lambda: backend.delete_pod(status, grace_period_s=10))  # a pass may find it going
    assert backend.pod_statuses() == {}
    assert "checkpointed" in backend.pod_logs("gp-1-0", "ns")


def test_a_pod_ignoring_sigterm_is_killed_after_the_grace_period(backend):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('up', flush=True); time.sleep(60)"
    )
    status = backend.ensure_pod(spec(command=(PY, "-c", code)))
    wait_until(lambda: "up" in backend.pod_logs("gp-1-0", "ns"))
    assert backend.delete_pod(status, grace_period_s=1) is False  # still in its grace period
    time.sleep(1.1)
    assert backend.delete_pod(status, grace_period_s=1) is True
    assert backend.pod_statuses() == {}


def test_processes_a_finished_pod_left_behind_are_stopped_with_it(db, tmp_path):
    """A daemon in a session of its own (outside the process group) that outlives its pod
    would hold the pod's GPU: it carries the pod's token, and goes with the pod. Unsandboxed
    (an admin's pod where sandboxing is off): in a sandbox the daemon dies with the pod's PID
    namespace (test_local_sandbox.py)."""
    backend = LocalBackend(make_cluster(config={"node_name": "here", "sandbox": False}))
    pid_file = tmp_path / "daemon.pid"
    code = (
        "import subprocess, sys\n"
        "daemon = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(daemon.pid))\n"
    )
    backend.ensure_pod(spec(command=(PY, "-c", code), submitted_by_admin=True))
    status = wait_until(
        lambda: (s := backend.pod_statuses()["gp-1-0"]).phase == PodPhase.SUCCEEDED and s
    )
    daemon = int(wait_until(lambda: pid_file.exists() and pid_file.read_text()))
    try:
        assert Path(f"/proc/{daemon}").exists()  # the pod is done; its daemon is not
        wait_until(lambda: backend.delete_pod(status, grace_period_s=5))
        assert not Path(f"/proc/{daemon}").exists() or "Z" in _state(daemon)
    finally:
        if Path(f"/proc/{daemon}").exists():
            os.kill(daemon, signal.SIGKILL)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_restarted_worker_finds_its_processes_again(backend, monkeypatch):
    status = backend.ensure_pod(spec(command=(PY, "-c", "import time; time.sleep(30)")))
    # A new worker process knows nothing of the Popen objects of the old one.
    monkeypatch.setattr(local_backend, "_CHILDREN", {})
    again = LocalBackend(backend.cluster).pod_statuses()["gp-1-0"]
    assert again.phase == PodPhase.RUNNING
    assert again.backend_ref == status.backend_ref
    assert LocalBackend(backend.cluster).delete_pod(again, grace_period_s=5)


def test_reconcile_runs_an_admitted_workload_to_success_and_frees_its_gpus(org):
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    workload = make_workload(
        org.project_a, org.researcher, "hello", command=[PY, "-c", "print('done')"]
    )
    admit(workload, node)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state in (
        WorkloadState.ADMITTED,
        WorkloadState.RUNNING,
        WorkloadState.SUCCEEDED,
    )

    def finished():
        cluster_reconcile(cluster)
        workload.refresh_from_db()
        return workload.state == WorkloadState.SUCCEEDED

    wait_until(finished)
    assert workload.exit_code == 0
    assert workload.allocations.count() == 0  # the second pass saw the pod gone
    assert LocalBackend(cluster).pod_statuses() == {}


def test_reconcile_stops_a_stopped_workload_and_releases_it(org):
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    workload = make_workload(
        org.project_a, org.researcher, "sleeper", command=[PY, "-c", "import time; time.sleep(60)"]
    )
    admit(workload, node)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.RUNNING
    assert workload.allocations.get().backend_ref
    workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")

    def released():
        # The GPUs are kept until the process is gone: under load that can take a pass
        # more than the SIGTERM itself.
        cluster_reconcile(cluster)
        return workload.allocations.count() == 0

    wait_until(released)
    assert LocalBackend(cluster).pod_statuses() == {}


def test_gpus_are_read_from_nvml_when_a_driver_answers(monkeypatch):
    """No GPU on this machine: NVML's answers are stood in for by a module of the same shape."""
    import types

    from clusters.backends.localgpus import local_gpus

    calls = []
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=81559 * 1024 * 1024),
        nvmlDeviceGetMigMode=lambda h: (1, 1) if h == 1 else (0, 0),  # (current, pending)
        NVMLError=RuntimeError,
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpus = local_gpus()
    assert [(g.index, g.model, g.memory_mib, g.uuid, g.mig) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559, "GPU-0", False),
        (1, "NVIDIA H100 80GB HBM3", 81559, "GPU-1", True),
    ]
    assert calls == ["init", "shutdown"]


@pytest.mark.skipif(HAS_DRIVER, reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_machine_is_cpu_only():
    from clusters.backends.localgpus import local_gpus

    assert local_gpus() == []  # nvidia-ml-py is installed; nvmlInit fails without a driver


def test_a_workload_without_a_command_fails_with_a_reason_and_frees_its_gpus(org):
    cluster = make_cluster(config={"node_name": "here"})
    workload = make_workload(org.project_a, org.researcher, "empty", command=[])
    admit(workload, make_node(cluster, "here"))
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.FAILED
    assert workload.events.last().message == (
        "The pod cannot run: it has no command to run on the local machine"
    )
    assert workload.allocations.count() == 0


def test_a_command_that_does_not_exist_fails_with_exit_code_127(backend):
    backend.ensure_pod(spec(command=("/no/such/program",)))
    wait_until(lambda: backend.pod_statuses()["gp-1-0"].phase == PodPhase.FAILED)
    assert backend.pod_statuses()["gp-1-0"].exit_code == 127
    assert "cannot run /no/such/program" in backend.pod_logs("gp-1-0", "ns")


def test_a_spawn_interrupted_by_a_crash_is_found_by_its_token_not_started_twice(
    backend, monkeypatch
):
    import json
    import subprocess

    from clusters.backends.local import WRAPPER

    # What a worker that died right after starting the process left behind: a record
    # without a pid, and the process itself carrying the record's token.
    exit_file = backend.workload_dir(1) / ".pod-0.exit"
    record = {
        "name": "gp-1-0",
        "namespace": "ns",
        "workload_id": 1,
        "pod_index": 0,
        "pid": None,
        "start_time": None,
        "token": "tok-123",
        "written_at": time.time(),
        "exit_file": str(exit_file),
        "log": "",
        "endpoint": "",
        "command": [],
        "terminating_since": None,
    }
    (backend.state_dir / "gp-1-0.json").write_text(json.dumps(record))
    orphan = subprocess.Popen(
        [PY, "-I", WRAPPER, str(exit_file), PY, "-c", "import time; time.sleep(30)"],
        env={"GPUPOOL_POD_TOKEN": "tok-123", "PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    try:
        wait_until(lambda: local_backend._find_by_token("tok-123") == orphan.pid)
        monkeypatch.setattr(local_backend, "_CHILDREN", {})
        status = backend.ensure_pod(spec(command=(PY, "-c", "import time; time.sleep(30)")))
        assert status.phase == PodPhase.RUNNING
        assert status.backend_ref.startswith(f"{orphan.pid}:")
        wait_until(lambda: backend.delete_pod(status, grace_period_s=5))  # a pass may find it going
    finally:
        orphan.kill()
        orphan.wait()


def test_a_record_whose_spawn_never_happened_is_dropped_and_the_pod_started(backend):
    import json

    stale = {
        "name": "gp-1-0",
        "namespace": "ns",
        "workload_id": 1,
        "pod_index": 0,
        "pid": None,
        "start_time": None,
        "token": "never",
        "written_at": time.time() - 60,
        "exit_file": "/nonexistent",
        "log": "",
        "endpoint": "",
        "command": [],
        "terminating_since": None,
    }
    (backend.state_dir / "gp-1-0.json").write_text(json.dumps(stale))
    assert backend.pod_statuses() == {}
    status = backend.ensure_pod(spec())
    assert status.backend_ref and not status.backend_ref.startswith("None")
    wait_until(lambda: backend.pod_statuses()["gp-1-0"].phase == PodPhase.SUCCEEDED)


def test_a_stopped_pod_gets_its_policy_grace_period_before_sigkill(org):
    """Cluster default 60 s; project A's policy says 1 s. Both processes log SIGTERM and
    ignore it: the one under the policy is killed a second later, the other still runs."""
    WorkloadPolicy.objects.create(project=org.project_a, termination_grace_s=1)
    cluster = make_cluster(config={"node_name": "here", "grace_period_s": 60})
    node = make_node(cluster, "here")
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
        "print('up', flush=True)\nwhile True: time.sleep(0.1)\n"
    )
    short = make_workload(org.project_a, org.researcher, "short", command=[PY, "-c", code])
    long = make_workload(org.project_b, org.outsider, "long", command=[PY, "-c", code])
    for workload in (short, long):
        admit(workload, node)
    backend = LocalBackend(cluster)
    cluster_reconcile(cluster)
    for workload in (short, long):
        wait_until(lambda w=workload: "up" in backend.pod_logs(f"gp-{w.pk}-0", "ns"))
        workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)  # SIGTERM to both
    for workload in (short, long):
        wait_until(lambda w=workload: "got SIGTERM" in backend.pod_logs(f"gp-{w.pk}-0", "ns"))
    time.sleep(1.1)
    cluster_reconcile(cluster)  # past the policy's second: SIGKILL for the short one only
    assert short.allocations.count() == 0
    assert long.allocations.get().phase == "Terminating"
    assert list(backend.pod_statuses()) == [f"gp-{long.pk}-0"]
    # Clean up the survivor at once: grace 0 is SIGKILL straight after SIGTERM.
    WorkloadPolicy.objects.create(project=org.project_b, termination_grace_s=0)
    wait_until(lambda: cluster_reconcile(cluster) and not long.allocations.exists())


def test_stopping_all_local_pods_waits_for_each_and_their_workloads_start_again_later(org):
    """The demo's shutdown: every process goes (one ignores SIGTERM and is killed after
    the grace period); the next reconcile requeues the workload as a lost pod."""
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('up', flush=True); time.sleep(60)"
    )
    workload = make_workload(org.project_a, org.researcher, "lab", command=[PY, "-c", stubborn])
    admit(workload, node)
    cluster_reconcile(cluster)
    backend = LocalBackend(cluster)
    [status] = backend.pod_statuses().values()
    pid = int(status.backend_ref.split(":")[0])
    wait_until(lambda: "up" in backend.pod_logs(status.name, "ns"))
    started = time.monotonic()
    assert backend.stop_all(grace_period_s=1) == 1
    assert 1 <= time.monotonic() - started < 5
    assert local_backend._proc_start_time(pid) is None  # the process is gone, not a zombie
    assert backend.pod_statuses() == {}
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (WorkloadState.PENDING, 1)


def test_the_local_pods_stop_command_stops_the_pods_of_every_local_cluster(backend):
    from io import StringIO

    from django.core.management import call_command

    backend.ensure_pod(spec(command=(PY, "-c", "import time; time.sleep(60)")))
    out = StringIO()
    call_command("local_pods_stop", stdout=out)
    assert out.getvalue() == "Cluster local: stopped 1 local pod(s).\n"
    assert backend.pod_statuses() == {}
