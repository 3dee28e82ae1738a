"""Double allocation is impossible at the database, and a dead lock holder costs at most
one cycle period.

On PostgreSQL (run under `python -m tests.services -- pytest ...`): two cycles forced to
overlap (the lock bypassed, each thread on its own database connection) over many rounds
never put a GPU in two hands; with the node row locks taken away too, so that both read
the same free GPUs, the re-check under the GPU row locks makes one of them fail (rolled
back, recorded), never over-commit. A lock left by a worker that died mid-cycle is taken
over within one period, and its cycle is recorded as aborted.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

import scheduling.cycle
from scheduling.cycle import cycle_run, run_locked
from scheduling.locks import NAME, cycle_lock, lock_ttl_s
from scheduling.models import CycleRun, CycleState, PodAllocation, Workload, WorkloadState
from tests.leases import leave_dead_holder
from tests.scheduling.test_cycle_lock import run_together

pytestmark = [
    pytest.mark.services,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL's row locks: run under `python -m tests.services -- pytest ...`",
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(autouse=True)
def _no_cycle_on_commit(monkeypatch):
    """The test drives every cycle itself: submits and cycles ask for no cycle and no
    reconciliation on commit (the scheduling conftest leaves `services` tests alone)."""
    from clusters.tasks import reconcile_cluster
    from scheduling.tasks import run_cycle

    for task in (run_cycle, reconcile_cluster):
        monkeypatch.setattr(task, "delay", lambda *args, **kwargs: None)
        monkeypatch.setattr(task, "apply_async", lambda *args, **kwargs: None)


def _slow_engine(monkeypatch, barrier: threading.Barrier | None, seconds: float) -> None:
    """Both cycles reach the engine (their snapshots read) before either goes on."""
    real = scheduling.cycle.schedule

    def slow(*args, **kwargs):
        if barrier is not None:
            barrier.wait(timeout=30)
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduling.cycle, "schedule", slow)


def overcommits() -> list[str]:
    """Every GPU in more than one hand: taken whole twice, whole and shared, or shared
    beyond one GPU."""
    whole: Counter = Counter()
    shares: dict[tuple[int, int], Decimal] = {}
    for alloc in PodAllocation.objects.all():
        if alloc.shared_gpu_index is None:
            whole.update((alloc.node_id, int(i)) for i in alloc.gpu_indices)
        else:
            key = (alloc.node_id, alloc.shared_gpu_index)
            shares[key] = shares.get(key, Decimal(0)) + (alloc.gpu_share or Decimal(0))
    found = [f"GPU {key} taken {n} times" for key, n in whole.items() if n > 1]
    found += [f"GPU {key} taken whole and shared" for key in shares if key in whole]
    found += [f"GPU {key} shared {total}" for key, total in shares.items() if total > 1]
    return found


def _finish_all() -> None:
    """The round's work is done: its GPUs are free for the next round."""
    PodAllocation.objects.all().delete()
    Workload.objects.exclude(state=WorkloadState.PENDING).update(state=WorkloadState.SUCCEEDED)
    Workload.objects.filter(state=WorkloadState.PENDING).update(state=WorkloadState.STOPPED)


def _submit_round(org, submit, rnd: random.Random, index: int) -> None:
    for job in range(rnd.randint(6, 12)):
        kind = rnd.choice(["whole", "whole", "fraction"])
        extra = (
            {"gpus": rnd.choice([1, 1, 2])}
            if kind == "whole"
            else {"gpu_request": "fraction", "gpus": Decimal("0.5"), "gpu_memory_mib": 20480}
        )
        submit(org.researcher, org.project_a, f"r{index}-job-{job}", **extra)


@pytest.mark.parametrize("node_locks", [True, False], ids=["node-locks", "gpu-recheck-only"])
def test_overlapping_cycles_never_over_commit_a_gpu(org, cluster, submit, monkeypatch, node_locks):
    if not node_locks:
        # Both cycles read the same free GPUs: only the re-check under the GPU row locks
        # stands between them and a double allocation.
        monkeypatch.setattr(scheduling.cycle, "nodes_lock", lambda: None)
        _slow_engine(monkeypatch, threading.Barrier(2), 0.05)
    else:
        _slow_engine(monkeypatch, None, 0.05)
    rnd = random.Random(12)
    refused = 0
    for index in range(12):
        _submit_round(org, submit, rnd, index)
        runs = run_together(2, lambda: run_locked(timezone.now()))  # lock bypassed
        assert overcommits() == [], f"round {index}"
        for run in runs:
            assert run.state in (CycleState.OK, CycleState.FAILED)
            if run.state == CycleState.FAILED:
                assert "OvercommitRefused" in run.error, run.error
                refused += 1
        assert PodAllocation.objects.exists(), "some work was placed"
        _finish_all()
    if not node_locks:
        assert refused >= 1, "the re-check refused a cycle that read stale capacity"
    assert CycleRun.objects.filter(state=CycleState.RUNNING).count() == 0


def _dead_holder(settings) -> None:
    """What a worker killed mid-cycle leaves: the lock with its full TTL, never renewed
    again, and its CycleRun still running."""
    leave_dead_holder(NAME, lock_ttl_s())
    CycleRun.objects.create(
        started_at=timezone.now(), state=CycleState.RUNNING, holder="dead-worker"
    )


def test_a_dead_holder_delays_scheduling_by_at_most_one_period(org, cluster, submit, settings):
    settings.GPUPOOL_CYCLE_INTERVAL_S = 5
    job = submit(org.researcher, org.project_a, "waiting", gpus=1)
    _dead_holder(settings)
    died = time.monotonic()
    run = None
    while run is None and time.monotonic() - died < 3 * settings.GPUPOOL_CYCLE_INTERVAL_S:
        run = cycle_run()
        if run is None:
            time.sleep(0.25)
    waited = time.monotonic() - died
    assert run is not None and run.ok, "a cycle ran after the dead holder's lock expired"
    assert waited <= settings.GPUPOOL_CYCLE_INTERVAL_S + 1, waited
    assert Workload.objects.get(pk=job.pk).state == WorkloadState.ADMITTED
    aborted = CycleRun.objects.get(holder="dead-worker")
    assert aborted.state == CycleState.ABORTED and not aborted.ok
    assert "Aborted" in aborted.error


def test_a_long_cycle_keeps_its_lock_by_renewing_it(org, cluster, settings, monkeypatch):
    settings.GPUPOOL_CYCLE_INTERVAL_S = 5
    ttl = lock_ttl_s()
    with cycle_lock() as lease:
        assert lease
        time.sleep(ttl * 1.6)  # past the TTL: only the heartbeat keeps it
        with cycle_lock() as other:
            assert not other, "the lock expired while its holder was still running"
        assert lease.renewals >= 2
    with cycle_lock() as after:
        assert after, "released at the end"


def test_the_cycles_page_shows_an_aborted_cycle(org, settings, client_as):
    settings.GPUPOOL_CYCLE_INTERVAL_S = 5
    _dead_holder(settings)
    time.sleep(lock_ttl_s() + 0.5)
    assert cycle_run() is not None
    page = client_as(org.platform_admin).get("/workloads/cycles/").content.decode()
    assert "aborted" in page and "the worker running this cycle stopped" in page
