"""Two cycles at once: the lock lets one decide at a time, so no GPU is handed out twice."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import scheduling.cycle
from portal.leases import _database_lease
from portal.models import Lease as LeaseRow
from scheduling.cycle import cycle_run
from scheduling.locks import NAME, cycle_lock, lock_ttl_s
from scheduling.models import CycleRun, PodAllocation, Workload, WorkloadState


def _slow_engine(monkeypatch, seconds: float) -> None:
    """Hold each cycle inside the engine long enough for the other one to start."""
    real = scheduling.cycle.schedule

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduling.cycle, "schedule", slow)


def run_together(count: int, call=cycle_run) -> list:
    """`call()` in `count` threads at once, each on its own database connection."""
    barrier = threading.Barrier(count)
    results: list = []
    errors: list = []

    def worker():
        try:
            barrier.wait()
            results.append(call())
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="threads cannot share SQLite's in-memory test database; the process test covers it",
)
@pytest.mark.django_db(transaction=True)
def test_two_cycles_at_once_never_give_a_gpu_twice(org, cluster, submit, monkeypatch):
    # Eight one-GPU jobs and eight GPUs: two unlocked cycles would both place all eight.
    for i in range(8):
        submit(org.researcher, org.project_a, f"job-{i}", gpus=1)
    _slow_engine(monkeypatch, 0.5)
    results = run_together(2)
    ran = [r for r in results if r is not None]
    assert len(ran) == 1, "exactly one cycle holds the lock, the other stands aside"
    devices = [(a.node_id, int(i)) for a in PodAllocation.objects.all() for i in a.gpu_indices]
    assert len(devices) == len(set(devices)) == 8
    assert Workload.objects.filter(state=WorkloadState.ADMITTED).count() == 8
    assert CycleRun.objects.count() == 1
    # The lock is free again for the next cycle.
    assert cycle_run() is not None


@pytest.mark.django_db
def test_the_database_lock_is_exclusive_and_released_after_use(settings):
    settings.REDIS_URL = ""
    with cycle_lock() as first, cycle_lock() as second:
        assert (first, second) == (True, False)
    with cycle_lock() as again:
        assert bool(again) is True


@pytest.mark.django_db
def test_a_lock_left_by_a_dead_worker_expires(settings):
    settings.REDIS_URL = ""
    LeaseRow.objects.create(
        name=NAME, holder="dead-worker", locked_until=timezone.now() - timedelta(seconds=1)
    )
    with cycle_lock() as acquired:
        assert bool(acquired) is True


@pytest.mark.django_db
def test_the_database_lock_lasts_one_period_and_renewal_extends_it_for_its_holder_only(
    settings,
):
    settings.REDIS_URL = ""
    settings.GPUPOOL_CYCLE_INTERVAL_S = 7
    assert lock_ttl_s() == 7, "a dead holder's lock is free again by the next beat"
    with _database_lease(NAME, lock_ttl_s()) as (lease, renew):
        assert lease
        until = LeaseRow.objects.get(name=NAME).locked_until
        assert timedelta(seconds=6) < until - timezone.now() <= timedelta(seconds=7)
        LeaseRow.objects.filter(name=NAME).update(locked_until=timezone.now())
        assert renew() is True
        assert LeaseRow.objects.get(name=NAME).locked_until - timezone.now() > timedelta(seconds=6)
        LeaseRow.objects.filter(name=NAME).update(holder="someone-else")
        assert renew() is False, "a lock taken over is not renewed by its old holder"


def _worker(var_dir, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["GPUPOOL_VAR_DIR"] = str(var_dir)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.scheduling.cycle_worker", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _output(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_two_cycle_processes_on_one_sqlite_file_never_give_a_gpu_twice(tmp_path):
    """The embedded mode for real: two processes, one database file, the row lock.

    The loser either finds the lock taken and stands aside, or (SQLite makes it wait for
    the winner's write transaction) runs after the winner released it; either way the
    cycles never overlap and it sees the winner's allocations.
    """
    _output(_worker(tmp_path, "setup"))
    barrier = str(tmp_path / "barrier")
    runs = [_output(p) for p in [_worker(tmp_path, "run", barrier, "2") for _ in range(2)]]
    assert sorted(r["admitted"] for r in runs) == [0, 8]
    check = _output(_worker(tmp_path, "check"))
    devices = [tuple(d) for d in check["devices"]]
    assert len(devices) == len(set(devices)) == 8
    cycles = check["cycles"]
    assert len(cycles) == sum(r["ran"] for r in runs) >= 1
    for (_, first_end), (second_start, _) in itertools.pairwise(cycles):
        assert second_start >= first_end, "two cycles overlapped"


def test_a_worker_killed_inside_a_cycle_delays_scheduling_by_at_most_one_period(
    tmp_path, monkeypatch
):
    """A real process takes the lock, starts a cycle and is SIGKILLed inside the engine:
    no `finally` runs, so only the lock's expiry frees the next cycle, and the dead
    worker's cycle row is marked aborted rather than left running."""
    period_s = 5
    monkeypatch.setenv("GPUPOOL_CYCLE_INTERVAL_S", str(period_s))
    _output(_worker(tmp_path, "setup"))
    hung = _worker(tmp_path, "hang")
    database = sqlite3.connect(tmp_path / "gpupool.sqlite3", timeout=30)
    deadline = time.monotonic() + 60
    while not database.execute(
        "SELECT 1 FROM scheduling_cyclerun WHERE state = 'running'"
    ).fetchone():
        assert hung.poll() is None and time.monotonic() < deadline, hung.stderr.read()
        time.sleep(0.05)
    database.close()
    os.kill(hung.pid, signal.SIGKILL)
    killed_at = time.time()
    hung.communicate()
    result = _output(_worker(tmp_path, "probe", str(killed_at)))
    # What the delay is made of, not a wall-clock budget (a loaded machine stretches
    # those): the dead worker's lease ends at most one period after the kill (its last
    # renewal came before it), and once it has ended the next try runs a cycle.
    assert result["lock_until"] <= killed_at + period_s, result
    assert result["refused_after_expiry"] == 0, result
    assert result["state"] == "ok" and result["admitted"] == 8
    (dead,) = result["others"]
    assert dead["state"] == "aborted" and not dead["ok"]
    assert "lock expired without renewal" in dead["error"]
