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

from tests.portal.demo_process import DemoProcess, broker_client, embedded_env

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


def test_a_worker_is_stalled_when_a_queue_keeps_its_oldest_ready_message_for_the_bound():
    watch = demo.StallWatch(Path("unused"), stall_s=60)
    assert watch.observe({"celery": (7, 3), "cycle": (2, 1)}, now=0) is None
    # celery's oldest was taken (a new oldest); cycle's still waits: not yet for 60 s.
    assert watch.observe({"celery": (9, 5), "cycle": (2, 1)}, now=59) is None
    line = watch.observe({"celery": (10, 8), "cycle": (2, 4)}, now=60)
    assert line == "consumed nothing for 60 s while messages waited (4 in 'cycle')"


def test_a_worker_is_not_stalled_while_it_takes_messages_or_its_queues_are_empty():
    watch = demo.StallWatch(Path("unused"), stall_s=60)
    for minute in range(10):  # a backlog that never empties, but moves
        assert watch.observe({"celery": (100 + minute, 50)}, now=minute * 60) is None
    assert watch.observe({}, now=600) is None  # all taken
    assert watch.observe({"celery": (200, 1)}, now=601) is None  # new: waits from now
    assert watch.observe({"celery": (200, 1)}, now=661) is not None
    watch.reset()  # a restarted worker gets the whole bound again
    assert watch.observe({"celery": (200, 1)}, now=662) is None


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("GPUPOOL_TEST_EMBEDDED"),
    reason="the embedded broker is the embedded run's (GPUPOOL_TEST_EMBEDDED=1)",
)
def test_a_live_worker_that_consumes_nothing_is_killed_and_started_again(
    tmp_path, monkeypatch, capsys
):
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    for name, value in embedded_env(var).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(demo, "STALL_LOOK_EVERY_S", 0.5)
    celery = [str(demo.BIN / "celery"), "-A", "portal", "worker", "-I", "tests.portal.worker_tasks"]
    broker = var / "celery-broker.sqlite3"
    watch = demo.StallWatch(broker, stall_s=demo.STALL_S)
    worker = demo.Supervised("worker", [*celery, "--concurrency", "2"], stalled=watch)
    app = broker_client(broker)
    before, after = tmp_path / "before", tmp_path / "after"
    try:
        worker.start()
        first = worker.proc.pid
        app.send_task("tests.mark", args=[str(before)], queue="celery")
        _supervise(worker, before.exists, "the worker runs a task")
        # Alive (poll() sees it running) but taking nothing: as wedged as it once was. The
        # bound is short now that the worker is up (starting one takes longer on a loaded
        # machine), and the whole one again for the next to start.
        os.kill(first, signal.SIGSTOP)
        watch.stall_s = 3
        app.send_task("tests.mark", args=[str(after)], queue="celery")
        _supervise(worker, lambda: worker.proc.pid != first, "the worker is started again")
        watch.stall_s = demo.STALL_S
        _supervise(worker, after.exists, "the task that waited runs")
        out = capsys.readouterr().out
        assert f"worker (pid {first}) is alive but consumed nothing for " in out, out
        assert "while messages waited (1 in 'celery'); killing it" in out, out
        assert "worker exited (code -9); restarting it in 1 s" in out, out
        assert not _alive(first)
    finally:
        app.close()
        if worker.proc is not None and worker.proc.poll() is None:
            demo.kill_with_children(worker.proc.pid)
            worker.proc.wait()


def _supervise(worker, done, what: str, timeout: float = 120.0) -> None:
    """Run the supervisor's checks on `worker` until `done()`."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        assert worker.check(time.monotonic()), "crash-looping"
        time.sleep(0.2)


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
