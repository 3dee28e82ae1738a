"""The demo stays up: `scripts/demo.py` on the embedded default (SQLite, the SQLite broker),
with its web server, worker and beat, under a steady stream of API submits for
GPUPOOL_SOAK_S seconds (600 unless set). No process dies or is restarted, and every
workload submitted reaches a final state.

Only in make test's embedded pass (the demo is the embedded default; the services pass would
run it a second time). Everything listens on loopback.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path

import pytest

from tests.portal.demo_process import FINAL, DemoProcess

ROOT = Path(__file__).resolve().parents[2]
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
        projects = {"alice": "ml-vision", "bob": "nlp-llm"}
        submitted: dict[int, str] = {}
        stopped = 0
        backlog: list[int] = []
        deadline = time.monotonic() + SOAK_S
        for n in itertools.count():
            if time.monotonic() >= deadline:
                break
            user = ("alice", "bob")[n % 2]
            status, body = clients[user](
                "POST",
                "/api/v1/workloads/",
                {
                    "project": projects[user],
                    "kind": "training",
                    "name": f"soak-{n}",
                    "image": "pytorch/pytorch:2.3",
                    "command": ["python", "train.py"],
                    "gpus": 1 + n % 2,
                    "node_pools": ["a100"],
                    "duration_s": 1 + n % 4,
                },
            )
            assert status == 201, (status, body, demo.tail())
            submitted[body["id"]] = user
            if n % 10 == 5:  # now and then a user stops one of hers, whatever its state
                status, body = clients[user]("POST", f"/api/v1/workloads/{body['id']}/stop/")
                assert status == 200, (status, body, demo.tail())
                stopped += 1
            demo.assert_nothing_restarted()
            backlog.append(demo.broker_backlog())
            assert backlog[-1] <= MAX_BACKLOG, (backlog[-20:], demo.tail())
            time.sleep(SUBMIT_EVERY_S)
        assert len(submitted) >= SOAK_S / (SUBMIT_EVERY_S + 5)

        # Every workload reaches a final state (the longest runs 4 s; the cycle runs every 2 s).
        states: dict[int, str] = {}
        settle = time.monotonic() + 180
        while time.monotonic() < settle:
            states = {pk: demo.state(clients[user], pk) for pk, user in submitted.items()}
            if set(states.values()) <= FINAL:
                break
            time.sleep(3)
        open_ones = {pk: s for pk, s in states.items() if s not in FINAL}
        assert not open_ones, (open_ones, demo.tail())
        assert list(states.values()).count("stopped") >= stopped
        assert "succeeded" in states.values()
        demo.assert_nothing_restarted()
        assert not re.search(r"JSONDecodeError|Unrecoverable error|Traceback", demo.log()), (
            demo.tail()
        )
    print(
        f"soak: {len(submitted)} workloads in {SOAK_S:.0f} s, states {_count(states)}, "
        f"broker backlog max {max(backlog)} mean {sum(backlog) / len(backlog):.1f}"
    )


def _count(states: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for state in states.values():
        out[state] = out.get(state, 0) + 1
    return out
