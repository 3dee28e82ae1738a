"""The demo stays up: `scripts/demo.py` on the embedded default (SQLite, the SQLite broker),
with its web server, worker and beat, under a steady stream of API submits for
GPUPOOL_SOAK_S seconds (600 unless set), while one of the worker's pool children is killed
(SIGKILL, as the OOM killer would) every GPUPOOL_SOAK_KILL_EVERY_S seconds (120 unless set;
0: never). The demo's processes are never restarted (Celery replaces a lost child), every
workload submitted reaches a final state once: nothing lost, nothing run twice.

Only in make test's embedded pass (the demo is the embedded default; the services pass would
run it a second time). Everything listens on loopback.
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import time
from collections import Counter
from datetime import datetime

import pytest

from tests.portal.demo_process import FINAL, DemoProcess, children_of

SOAK_S = float(os.environ.get("GPUPOOL_SOAK_S", "600"))
KILL_EVERY_S = float(os.environ.get("GPUPOOL_SOAK_KILL_EVERY_S", "120"))
SUBMIT_EVERY_S = 2.0
ERRORS = re.compile(r"JSONDecodeError|Unrecoverable error|Traceback")
# How Celery logs the task of a pool child that was killed (it then runs it again).
CHILD_LOST = "Task handler raised error: WorkerLostError('Worker exited prematurely: signal 9"
# Tasks waiting in the broker: beat sends about 3.5 a second here (a reconcile every second,
# a cycle every 2), so a worker that keeps up holds a handful, one that lags a growing pile.
MAX_BACKLOG = 60

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("GPUPOOL_TEST_EMBEDDED"),
        reason="runs once, in make test's embedded pass (GPUPOOL_TEST_EMBEDDED=1)",
    ),
]


def test_the_demo_runs_a_steady_stream_of_work_without_a_process_dying(tmp_path):
    with DemoProcess(tmp_path) as demo:
        clients = {user: demo.api_client(user) for user in ("admin", "alice", "bob")}
        # The seed's own workloads run for ever and fill the cluster: the admin stops them.
        demo.stop_all_workloads(clients["admin"])
        submitted, stopped, backlog, kills = _stream_of_submits(demo, clients)
        assert len(submitted) >= SOAK_S / (SUBMIT_EVERY_S + 5)
        assert kills >= max(1, math.ceil(SOAK_S / KILL_EVERY_S) - 2) if KILL_EVERY_S else kills == 0
        # Every workload reaches a final state (the longest runs 4 s; a cycle every 2 s),
        # and ran once: a task of a killed child that ran again never started it twice.
        rows = _when_all_final(demo, clients["admin"], submitted, timeout=180)
        states = [row["state"] for row in rows]
        assert states.count("stopped") >= stopped
        assert "succeeded" in states
        assert [row["id"] for row in rows if row["restart_count"]] == []
        names = [row["name"] for row in demo.workloads(clients["admin"])]
        assert sorted(n for n in names if n.startswith("soak-")) == sorted(
            f"soak-{n}" for n in range(len(submitted))
        )
        demo.assert_nothing_restarted()
        lost = [r for r in _records(demo.log()) if r.startswith(CHILD_LOST)]
        assert len(lost) <= kills, lost  # a task of each killed child, at most, is requeued
        errors = [r for r in _records(demo.log()) if ERRORS.search(r) and r not in lost]
        assert not errors, errors[0]
    turnaround = sorted(_seconds(row["finished_at"]) - _seconds(row["created_at"]) for row in rows)
    print(
        f"soak: {len(rows)} workloads in {SOAK_S:.0f} s, states {dict(Counter(states))}, "
        f"submit to final p50 {turnaround[len(rows) // 2]:.1f} s "
        f"p95 {turnaround[len(rows) * 95 // 100]:.1f} s max {turnaround[-1]:.1f} s; "
        f"broker backlog max {max(backlog)} mean {sum(backlog) / len(backlog):.1f}; "
        f"{kills} pool children killed"
    )


def _stream_of_submits(demo: DemoProcess, clients: dict) -> tuple[set[int], int, list[int], int]:
    """For SOAK_S seconds alice and bob take turns submitting short jobs on the simulated
    cluster, one every SUBMIT_EVERY_S, and now and then stop one; every KILL_EVERY_S a pool
    child of the worker is killed. After each: no process died, and the broker's backlog
    stays small. Returns the ids, the stops, the backlog, the kills."""
    projects = {"alice": "ml-vision", "bob": "nlp-llm"}
    submitted: set[int] = set()
    stopped = 0
    backlog: list[int] = []
    kills = 0
    started = time.monotonic()
    deadline = started + SOAK_S
    n = 0
    while time.monotonic() < deadline:
        if KILL_EVERY_S and time.monotonic() - started >= (kills + 1) * KILL_EVERY_S:
            kills += _kill_a_pool_child(demo)
        user = ("alice", "bob")[n % 2]
        status, body = clients[user]("POST", "/api/v1/workloads/", _job(projects[user], n))
        assert status == 201, (status, body, demo.tail())
        submitted.add(body["id"])
        if n % 10 == 5:  # whatever its state by now
            status, body = clients[user]("POST", f"/api/v1/workloads/{body['id']}/stop/")
            assert status == 200, (status, body, demo.tail())
            stopped += 1
        demo.assert_nothing_restarted()
        backlog.append(demo.broker_backlog())
        assert backlog[-1] <= MAX_BACKLOG, (backlog[-20:], demo.tail())
        n += 1
        time.sleep(SUBMIT_EVERY_S)
    return submitted, stopped, backlog, kills


def _records(log: str) -> list[str]:
    """The log's records, each with the lines that follow it (a traceback), less the
    `[time: LEVEL/process]` prefix."""
    parts = re.split(r"^\[[^\]]*\] ", log, flags=re.MULTILINE)
    return [part.strip() for part in parts if part.strip()]


def _kill_a_pool_child(demo: DemoProcess) -> int:
    """SIGKILL one of the worker's pool children, whatever it is doing; 1 if one was."""
    worker = demo.pid_of("worker")
    children = children_of(worker) if worker else []
    if not children:
        return 0
    os.kill(random.choice(children), signal.SIGKILL)
    print(f"soak: killed a pool child at {time.strftime('%H:%M:%S')}", flush=True)
    return 1


def _job(project: str, n: int) -> dict:
    return {
        "project": project,
        "kind": "training",
        "name": f"soak-{n}",
        "image": "pytorch/pytorch:2.3",
        "command": ["python", "train.py"],
        "gpus": 1 + n % 2,
        "node_pools": ["a100"],
        "duration_s": 1 + n % 4,
    }


def _when_all_final(demo: DemoProcess, admin, ids: set[int], timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = [row for row in demo.workloads(admin) if row["id"] in ids]
        assert len(rows) == len(ids)
        open_ones = {row["id"]: row["state"] for row in rows if row["state"] not in FINAL}
        if not open_ones:
            return rows
        assert time.monotonic() < deadline, (open_ones, demo.tail())
        time.sleep(3)


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()
