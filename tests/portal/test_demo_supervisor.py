"""`scripts/demo.py` restarts a process that dies, saying so, with a pause that doubles; a
process that crash-loops stops the demo. Run for real: a killed worker comes back while
the web server and a running local workload carry on."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from tests.portal.demo_process import DemoProcess

ROOT = Path(__file__).resolve().parents[2]


def _demo_module():
    spec = importlib.util.spec_from_file_location("gpupool_demo", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _demo_module()


def _pids_with(marker: str) -> list[int]:
    """The processes on this machine whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if marker.encode() in argv:
                found.append(int(proc.name))
    return found


def _jupyter_answers(browser, status_url: str) -> bool:
    """Jupyter Server's own /api/status (not a login page a redirect led to)."""
    status, body = browser(status_url)
    return status == 200 and '"last_activity"' in body


def _wait_dead(process, timeout: float = 30.0) -> None:
    process.proc.wait(timeout)


def test_a_process_that_dies_is_started_again_after_a_pause_with_a_line_saying_so(capsys):
    process = demo.Supervised("worker", [sys.executable, "-c", "import sys; sys.exit(3)"])
    process.start()
    first = process.proc.pid
    _wait_dead(process)
    now = time.monotonic()
    assert process.check(now) is True
    assert "worker exited (code 3); restarting it in 1 s (restart 1 of at most 5" in (
        capsys.readouterr().out
    )
    assert process.check(now + 0.5) is True
    assert process.proc.pid == first, "not before its pause is over"
    assert process.check(now + 1.0) is True
    assert process.proc.pid != first
    assert f"started worker (pid {process.proc.pid})" in capsys.readouterr().out
    _wait_dead(process)


def test_the_pause_doubles_up_to_its_cap_and_a_crash_loop_gives_up(capsys, monkeypatch):
    monkeypatch.setattr(demo, "MAX_RESTARTS", 6)
    process = demo.Supervised("beat", [sys.executable, "-c", "raise SystemExit(2)"])
    process.start()
    now = time.monotonic()
    pauses = []
    while True:
        _wait_dead(process)
        alive = process.check(now)
        if not alive:
            break
        pauses.append(process.restart_at - now)
        now = process.restart_at
        process.check(now)  # starts it again
    assert pauses == [1, 2, 4, 8, 16, 30]
    out = capsys.readouterr().out
    assert "beat exited (code 2) 7 times within 300 s; it is crash-looping" in out


def test_deaths_outside_the_window_are_forgotten(capsys):
    process = demo.Supervised("web", [sys.executable, "-c", "pass"])
    process.start()
    now = time.monotonic()
    for _ in range(demo.MAX_RESTARTS * 3):  # a death every 101 s: 3 in any 300, no loop
        _wait_dead(process)
        assert process.check(now) is True
        assert process.restart_at - now <= 4
        now += 101
        process.check(now)  # starts it again
    _wait_dead(process)
    out = capsys.readouterr().out
    assert "crash-looping" not in out
    assert out.count("restarting it in 4 s (restart 3 of") == demo.MAX_RESTARTS * 3 - 2


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("GPUPOOL_TEST_EMBEDDED"),
    reason="runs once, in make test's embedded pass (GPUPOOL_TEST_EMBEDDED=1)",
)
def test_a_killed_worker_comes_back_and_the_web_server_local_work_and_jupyterlab_carry_on(tmp_path):
    with DemoProcess(tmp_path) as running:
        admin, alice = running.api_client("admin"), running.api_client("alice")
        running.stop_all_workloads(admin)
        # 1. A job on the local cluster and a JupyterLab run.
        marker = f"gpupool-test-{uuid.uuid4().hex}"
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)", marker]
        job = _submit(alice, "long-local", command=sleeper, gpus=0, node_pools=["local"])
        lab = _submit(alice, "lab", path="/api/v1/workspaces/", environment="JupyterLab")
        browser = running.browser("alice")
        lab_answers = partial(_jupyter_answers, browser, f"/workspaces/{lab}/lab/api/status")
        running.wait_for(lambda: running.state(alice, job) == "running", "the local job runs")
        running.wait_for(lab_answers, "JupyterLab answers through the proxy")
        pods = _pids_with(marker)
        assert pods, "the local job is a process on this machine"
        # 2. The worker is killed; the demo says so and starts another.
        worker = running.pid_of("worker")
        os.kill(worker, signal.SIGKILL)
        running.wait_for(lambda: running.pid_of("worker") not in (None, worker), "a new worker")
        assert "worker exited (code -9); restarting it in 1 s" in running.log()
        # 3. The new worker runs cycles and reconciles: a short job goes through...
        short = _submit(alice, "after-restart", duration_s=1)
        running.wait_for(lambda: running.state(alice, short) == "succeeded", "it succeeds")
        # 4. ...and what ran before still runs: the very processes, never restarted.
        for pk in (job, lab):
            _, row = alice("GET", f"/api/v1/workloads/{pk}/")
            assert (row["state"], row["restart_count"]) == ("running", 0), row
        assert _pids_with(marker) == pods
        assert lab_answers()
        assert running.restarts() == ["worker"]
        # 5. Stopped, with a second SIGTERM while it stops: everything it started ends, the
        # local job's processes too, and no traceback (one once left beat and a pod).
        started = [running.pid_of(name) for name in ("web", "worker", "beat")]
        assert running.stop(again_after_s=1.0) == 0, running.tail()
        assert "Traceback" not in running.log(), running.tail()
        running.wait_for(lambda: not any(map(_alive, started)), "web, worker and beat end")
        running.wait_for(lambda: not _pids_with(marker), "the local job's processes end")


def _alive(pid: int | None) -> bool:
    """Whether the process runs (a zombie, waiting for its parent, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _submit(client, name: str, path: str = "/api/v1/workloads/", **fields) -> int:
    """A workload (a training job on the simulated pool unless told) or, at the workspaces
    path, a workspace; in project ml-vision. Returns its id."""
    body = {"project": "ml-vision", "name": name, **fields}
    if path == "/api/v1/workloads/":
        body = {
            "kind": "training",
            "image": "pytorch/pytorch:2.3",
            "command": ["python", "train.py"],
            "gpus": 1,
            "node_pools": ["a100"],
            **body,
        }
    status, created = client("POST", path, body)
    assert status == 201, (status, created)
    return created["id"]
