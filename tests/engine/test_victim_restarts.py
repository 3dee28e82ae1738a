"""Victim choice counts earlier restarts, so one job is not evicted over and over."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.actions.victims import victim_cost
from scheduling.engine.types import SchedulerConfig, Workload
from tests.engine.builders import cycles, dept, evicted, job, nodes, project, run, running, snapshot

NOW = 10_000.0


def _borrowers(*restarts: int, started: float = NOW) -> list[Workload]:
    """p2's one-GPU jobs on n0, all resumed at `started` (nothing unsaved), the later
    ones more recently (the plain tie-break would evict the last)."""
    return [
        replace(running(job(f"b{i}", "p2"), "n0", [i], started=started + i), restarts=r)
        for i, r in enumerate(restarts)
    ]


def _queues() -> list:
    return [dept(), project("p1", deserved=2), project("p2", deserved=2)]


def test_a_job_that_was_restarted_before_is_not_the_first_victim_again() -> None:
    snap = snapshot(nodes(1, gpus=4), _queues(), [*_borrowers(0, 0, 0, 3), job("mine", "p1")])
    assert evicted(run(snap, now=NOW + 10)) == {"b2": "reclaim"}
    # Without the restart charge the most recently resumed job (b3) goes, as before.
    unpriced = SchedulerConfig(restart_cost_s=0)
    assert evicted(run(snap, unpriced, now=NOW + 10)) == {"b3": "reclaim"}


def test_a_restarted_job_is_still_chosen_when_a_fresh_one_would_lose_more_work() -> None:
    # b0 never restarted but has 700 s unsaved; b1 restarted twice (one charged: 600 s)
    # and has 50 s unsaved.
    fresh = replace(running(job("b0", "p2"), "n0", [0], started=NOW - 700), restarts=0)
    again = replace(running(job("b1", "p2"), "n0", [1], started=NOW - 50), restarts=2)
    held = [running(job(f"c{i}", "p2"), "n0", [2 + i], started=NOW - 5000) for i in range(2)]
    snap = snapshot(nodes(1, gpus=4), _queues(), [fresh, again, *held, job("mine", "p1")])
    assert evicted(run(snap, now=NOW)) == {"b1": "reclaim"}


def test_the_restart_charge_is_per_gpu_and_spares_the_first_restart() -> None:
    wl = replace(job("w", "p", gpus=4), started_at=NOW - 100, restarts=3)
    assert victim_cost(wl, 4.0, NOW, 600.0)[0] == 4 * (100 + 2 * 600)
    assert victim_cost(replace(wl, restarts=1), 4.0, NOW, 600.0)[0] == 4 * 100
    assert victim_cost(wl, 4.0, NOW)[0] == 4 * 100


def test_a_job_sent_back_once_is_as_cheap_a_victim_as_one_never_sent_back() -> None:
    # b3 restarted once (no charge) and is the most recently resumed: it goes.
    snap = snapshot(nodes(1, gpus=4), _queues(), [*_borrowers(0, 0, 0, 1), job("mine", "p1")])
    assert evicted(run(snap, now=NOW + 10)) == {"b3": "reclaim"}


def test_victim_choice_never_makes_reclaim_flip_flop_with_restarted_jobs() -> None:
    # Everyone has restarted a different number of times; over 30 cycles GPUs only ever
    # move from p2 to p1, and reclaim settles.
    work = [*_borrowers(5, 1, 3, 0, started=0.0), *(job(f"m{i}", "p1", t=i) for i in range(3))]
    steps = cycles(snapshot(nodes(1, gpus=4), _queues(), work), 30)
    moves = [(e.workload_id, e.beneficiary) for _, r in steps for e in r.evictions]
    assert [m for m, _ in moves] and all(m.startswith("b") for m, _ in moves)
    assert all(b is not None and b.startswith("m") for _, b in moves)
    assert sum(len(r.evictions) for _, r in steps[5:]) == 0
