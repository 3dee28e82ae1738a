"""The embedded worker heals itself, run for real: `celery -A portal worker --concurrency 2`
(as the demo starts it) on the embedded SQLite broker, in a var/ folder of its own.

- Pool children killed outright (SIGKILL, as the OOM killer does), one of them mid-cycle: the
  worker starts new ones, the killed cycle's task is delivered again, and the next cycle is
  `ok`. (It once kept its prefetched messages held and consumed nothing more, for good.)
- A message in the queue that cannot be decoded goes to the dead-letter table with a log
  line, and the next message runs. (The worker once raised on it, restarted, took it again.)

Breaks checked: with the transport's `asynchronous=False` (Celery's blocking loop and pool
again) the first test times out waiting for an ok cycle (the worker holds its two messages
and runs nothing); without CELERY_TASK_REJECT_ON_WORKER_LOST the killed cycle's task never
runs again; with `_get` decoding the row bare the worker dies on the first malformed row.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

import pytest

from tests.portal.demo_process import broker_client, children_of, embedded_env, start_logged

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).parent / "celery"
PERIOD_S = 2  # GPUPOOL_CYCLE_INTERVAL_S: the cycle lock's lease is max(5 s, one period)
WAIT_S = 120.0  # a bound for a loaded machine, not a budget

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("GPUPOOL_TEST_EMBEDDED"),
        reason="the embedded broker is the embedded run's (GPUPOOL_TEST_EMBEDDED=1)",
    ),
]


def wait_for(check: Callable[[], object], what: str, worker: EmbeddedWorker) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        assert worker.proc.poll() is None, f"the worker exited\n{worker.tail()}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting until {what}\n{worker.tail()}")


class EmbeddedWorker:
    """The demo's worker command (plus this folder's test tasks) on `var`, its output in
    worker.log beside it; tasks are sent to it through its broker file."""

    def __init__(self, var: Path, migrate: bool = False) -> None:
        self.var = var
        self.log_path = var.parent / "worker.log"
        self.broker_path = var / "celery-broker.sqlite3"
        self.migrate = migrate

    def __enter__(self) -> EmbeddedWorker:
        env = embedded_env(self.var, GPUPOOL_CYCLE_INTERVAL_S=str(PERIOD_S))
        if self.migrate:
            manage = [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"]
            subprocess.run(manage, cwd=ROOT, env=env, check=True)
        command = [str(CELERY), "-A", "portal", "worker", "-I", "tests.portal.worker_tasks"]
        command += ["--loglevel", "INFO", "--concurrency", "2"]
        self.proc = start_logged(command, env, self.log_path)
        self.app = broker_client(self.broker_path)
        wait_for(lambda: "ready." in self.log(), "the worker is ready", self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.app.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def send(self, task: str, *args: object, queue: str = "celery") -> None:
        self.app.send_task(task, args=args, queue=queue)

    def children(self) -> list[int]:
        """The pool's processes: the worker's children."""
        return children_of(self.proc.pid)

    def rows(self, sql: str, *params: object) -> list[tuple]:
        db = sqlite3.connect(self.broker_path, timeout=30, isolation_level=None)
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def _cycles_since(var: Path, since: float) -> list[tuple[float, str, int]]:
    """(started at, state, ok) of the cycles started after `since` (epoch s), oldest first."""
    db = sqlite3.connect(var / "gpupool.sqlite3", timeout=30)
    try:
        rows = db.execute("SELECT started_at, state, ok FROM scheduling_cyclerun").fetchall()
    finally:
        db.close()
    started = [(datetime.fromisoformat(at).timestamp(), state, ok) for at, state, ok in rows]
    return [(at, state, ok) for at, state, ok in sorted(started) if at > since]


def _succeeded(worker: EmbeddedWorker) -> list[tuple[str, str]]:
    """(name, what it returned) of each task the worker logged as succeeded."""
    return re.findall(r"Task (\S+)\[[^]]+\] succeeded in \S+: (.*)", worker.log())


def test_pool_children_killed_mid_cycle_are_replaced_and_the_next_cycle_is_ok(tmp_path):
    var, flag, marked = tmp_path / "var", tmp_path / "in-cycle", tmp_path / "marked"
    with EmbeddedWorker(var, migrate=True) as worker:
        worker.send("tests.slow_cycle", str(flag), 600)
        wait_for(flag.exists, "a pool child is inside the cycle", worker)
        in_cycle, children = int(flag.read_text()), worker.children()
        assert in_cycle in children and len(children) == 2, (in_cycle, children)
        # Both: the one inside the cycle, and the idle one (which waits for the next task
        # inside the pipe the blocking pool's children share, holding its semaphore).
        killed_at = time.time()
        for child in children:
            os.kill(child, signal.SIGKILL)
        worker.send("scheduling.tasks.run_cycle", queue="cycle")
        ok_since_kill = lambda: any(ok for *_, ok in _cycles_since(var, killed_at))  # noqa: E731
        wait_for(ok_since_kill, "a cycle started after the kill is ok", worker)
        # Every cycle since is ok: none failed on what the killed one left (its lock, its
        # run row); the first began once its lease (max(5 s, a period)) ran out.
        since_kill = _cycles_since(var, killed_at)
        assert all(ok for *_, ok in since_kill), since_kill
        print(f"first ok cycle {since_kill[0][0] - killed_at:.1f} s after the kill")
        # The killed cycle's task is delivered again and runs to its end, and the worker
        # goes on consuming: a task sent now runs, and nothing is left in the queues.
        again = partial(_results, worker, "tests.slow_cycle")
        wait_for(again, "the cycle task again", worker)
        worker.send("tests.mark", str(marked))
        wait_for(marked.exists, "a task sent after the kill runs", worker)
        wait_for(lambda: not worker.rows("SELECT id FROM message"), "the queues empty", worker)
        assert len(set(worker.children()) - set(children)) == 2, "two new pool children"


def test_a_pool_child_killed_mid_reconcile_holds_its_cluster_up_for_one_period(tmp_path):
    """The lease a killed pass cannot release runs out by the next period; a reconcile sent
    right after the kill is refused while it holds, and one a period later runs. (A 300 s
    lock once held the demo's clusters up after its worker was killed mid-pass.)"""
    var, flag = tmp_path / "var", tmp_path / "in-reconcile"
    with EmbeddedWorker(var, migrate=True) as worker:
        worker.send("tests.slow_reconcile", str(flag), 600)
        wait_for(flag.exists, "a pool child is inside the reconcile", worker)
        killed_at = time.monotonic()
        os.kill(int(flag.read_text()), signal.SIGKILL)
        redelivered = partial(_results, worker, "tests.slow_reconcile")
        wait_for(redelivered, "the killed reconcile's task runs again", worker)
        cluster_id = int(redelivered()[0])
        passes = partial(_results, worker, "clusters.tasks.reconcile_cluster")
        ran = lambda: any(result.startswith("{") for result in passes())  # noqa: E731
        while not ran():
            assert time.monotonic() - killed_at < WAIT_S, worker.tail()
            worker.send("clusters.tasks.reconcile_cluster", cluster_id)
            time.sleep(1)
        waited = time.monotonic() - killed_at
        print(f"first pass {waited:.1f} s after the kill")
        assert waited < 5 + 5, "one lease (max(5 s, the 5 s reconcile period)) and slack"
        assert "reconcile of heals already running" in worker.log(), "refused while held"


def _results(worker: EmbeddedWorker, task: str) -> list[str]:
    """What `task` returned each time it succeeded, as the worker logged it."""
    return [result for name, result in _succeeded(worker) if name == task]


def test_a_message_that_cannot_be_decoded_is_set_aside_and_the_next_one_runs(tmp_path):
    var, marked = tmp_path / "var", tmp_path / "marked"
    with EmbeddedWorker(var) as worker:
        # Malformed before the good one, in the same queue: not JSON, and JSON that is no
        # message (no properties).
        for payload in ("{not json", '{"body": "x"}'):
            worker.rows("INSERT INTO message (queue, payload) VALUES ('celery', ?)", payload)
        worker.send("tests.mark", str(marked))
        wait_for(marked.exists, "the good message after the bad ones runs", worker)
        dead = worker.rows("SELECT payload, reason FROM dead_letter ORDER BY id")
        assert [payload for payload, _ in dead] == ["{not json", '{"body": "x"}']
        assert all(reason.startswith("cannot be decoded: ") for _, reason in dead), dead
        assert worker.log().count("moved to the dead-letter table: cannot be decoded") == 2
        assert not worker.rows("SELECT id FROM message")
        assert worker.proc.poll() is None
