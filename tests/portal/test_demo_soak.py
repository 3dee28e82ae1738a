"""The demo stays up: `scripts/demo.py` on the embedded default (SQLite, the SQLite broker),
with its web server, worker and beat, under a steady stream of API submits for
GPUPOOL_SOAK_S seconds (600 unless set). No process dies or is restarted, and every
workload submitted reaches a final state.

Only in make test's embedded pass (the demo is the embedded default; the services pass would
run it a second time). Everything listens on loopback.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from datetime import datetime

import pytest

from tests.portal.demo_process import FINAL, DemoProcess

SOAK_S = float(os.environ.get("GPUPOOL_SOAK_S", "600"))
SUBMIT_EVERY_S = 2.0
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
        submitted, stopped, backlog = _stream_of_submits(demo, clients)
        assert len(submitted) >= SOAK_S / (SUBMIT_EVERY_S + 5)
        # Every workload reaches a final state (the longest runs 4 s; a cycle every 2 s).
        rows = _when_all_final(demo, clients["admin"], submitted, timeout=180)
        states = [row["state"] for row in rows]
        assert states.count("stopped") >= stopped
        assert "succeeded" in states
        demo.assert_nothing_restarted()
        assert not re.search(r"JSONDecodeError|Unrecoverable error|Traceback", demo.log()), (
            demo.tail()
        )
    turnaround = sorted(_seconds(row["finished_at"]) - _seconds(row["created_at"]) for row in rows)
    print(
        f"soak: {len(rows)} workloads in {SOAK_S:.0f} s, states {dict(Counter(states))}, "
        f"submit to final p50 {turnaround[len(rows) // 2]:.1f} s "
        f"p95 {turnaround[len(rows) * 95 // 100]:.1f} s max {turnaround[-1]:.1f} s; "
        f"broker backlog max {max(backlog)} mean {sum(backlog) / len(backlog):.1f}"
    )


def _stream_of_submits(demo: DemoProcess, clients: dict) -> tuple[set[int], int, list[int]]:
    """For SOAK_S seconds alice and bob take turns submitting short jobs on the simulated
    cluster, one every SUBMIT_EVERY_S, and now and then stop one. After each: no process
    died, and the broker's backlog stays small. Returns the ids, the stops, the backlog."""
    projects = {"alice": "ml-vision", "bob": "nlp-llm"}
    submitted: set[int] = set()
    stopped = 0
    backlog: list[int] = []
    deadline = time.monotonic() + SOAK_S
    n = 0
    while time.monotonic() < deadline:
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
    return submitted, stopped, backlog


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
