"""An eviction waits for a victim's checkpoint that is due within half its interval
(actions/victims.checkpoint_due), within bounds: only claims between over-quota work
wait (work within its guarantee never does: reclaim, and taking back borrowed GPUs), and a
newcomer that has waited a whole interval takes the victim anyway."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.actions.victims import checkpoint_due
from scheduling.engine.types import EvictionReason
from tests.engine.builders import dept, evicted, job, nodes, placed, project, run, running, snapshot

NOW = 100_000.0
RECLAIM = str(EvictionReason.RECLAIM)
PREEMPT = str(EvictionReason.PREEMPT)


def test_checkpoint_due_in_the_second_half_of_the_interval_only() -> None:
    wl = replace(job("a", "p"), started_at=NOW - 5000, checkpoint_interval_s=600.0)
    assert not checkpoint_due(replace(wl, last_checkpoint_time=NOW - 299), NOW)
    assert checkpoint_due(replace(wl, last_checkpoint_time=NOW - 300), NOW)
    assert checkpoint_due(replace(wl, last_checkpoint_time=NOW - 599), NOW)
    assert not checkpoint_due(replace(wl, last_checkpoint_time=NOW - 600), NOW)  # overdue
    assert not checkpoint_due(
        replace(wl, checkpoint_interval_s=None, last_checkpoint_time=NOW - 400), NOW
    )
    # Resumed after its last checkpoint: counted from the restart.
    assert not checkpoint_due(
        replace(wl, started_at=NOW - 100, last_checkpoint_time=NOW - 400), NOW
    )


def _reclaim(saved_ago: float, submitted_ago: float = 60.0):
    """p2 (quota 4) ran 4 borrowed one-GPU jobs on a node of p1 (quota 4), whose job
    arrives: reclaim takes one victim, whose last checkpoint was saved_ago seconds ago
    (interval 600 s)."""
    theirs = [
        replace(
            running(job(f"o{i}", "p2"), "n0", [i], started=NOW - 3600),
            checkpoint_interval_s=600.0,
            last_checkpoint_time=NOW - saved_ago,
        )
        for i in range(8)
    ]
    queues = [dept(), project("p1", deserved=4), project("p2", deserved=4)]
    newcomer = job("mine", "p1", gpus=1, t=NOW - submitted_ago)
    return run(snapshot(nodes(1), queues, [*theirs, newcomer]), now=NOW)


def test_reclaim_for_guaranteed_work_never_waits_for_a_checkpoint() -> None:
    # A reclaimer is within its deserved quota: the guarantee means now (issue 24).
    for saved_ago in (100, 400, 599):
        result = _reclaim(saved_ago=saved_ago)
        assert set(evicted(result).values()) == {RECLAIM}
        assert "mine" in placed(result)


def _preempt(saved_ago: float, submitted_ago: float = 60.0):
    """p (quota 0) runs an 8-GPU job on borrowed GPUs, its last checkpoint saved_ago
    seconds ago (interval 600 s); p's urgent 8-GPU job arrives: an over-quota claim."""
    low = replace(
        running(job("low", "p", gpus=8), "n0", range(8), started=NOW - 3600),
        checkpoint_interval_s=600.0,
        last_checkpoint_time=NOW - saved_ago,
    )
    urgent = job("urgent", "p", gpus=8, priority=10, t=NOW - submitted_ago)
    return run(snapshot(nodes(1), [dept(), project("p")], [low, urgent]), now=NOW)


def test_an_over_quota_claim_waits_for_a_checkpoint_due_within_half_an_interval() -> None:
    waiting = _preempt(saved_ago=400)
    assert waiting.evictions == ()
    # Its reason says what it waits for, and for how long: the checkpoint is due in 200 s.
    assert waiting.pending_reasons["urgent"].endswith(
        "; waiting about 200 s for low's checkpoint before preempting it"
    )
    # Waited 500 of its 600 s bound already: 100 s left, sooner than the checkpoint.
    assert "waiting about 100 s for low's" in _preempt(400, 500).pending_reasons["urgent"]
    result = _preempt(saved_ago=100)
    assert evicted(result) == {"low": PREEMPT}
    assert "urgent" in placed(result)


def test_a_newcomer_that_waited_a_whole_interval_does_not_wait_for_checkpoints() -> None:
    result = _preempt(saved_ago=400, submitted_ago=600)
    assert evicted(result) == {"low": PREEMPT}


def test_work_within_its_guarantee_does_not_wait_for_a_borrowed_victims_checkpoint() -> None:
    # p1 (quota 4) runs an 8-GPU job on borrowed GPUs, 400 s past its checkpoint
    # (interval 600): its own 4-GPU job within the quota still evicts it at once.
    big = replace(
        running(job("big", "p1", gpus=8), "n0", range(8), started=NOW - 3600),
        checkpoint_interval_s=600.0,
        last_checkpoint_time=NOW - 400,
    )
    theirs = [running(job(f"o{i}", "p2"), "n1", [i], started=NOW - 3600) for i in range(8)]
    queues = [dept(), project("p1", deserved=4), project("p2", deserved=12)]
    snap = snapshot(nodes(2), queues, [big, *theirs, job("small", "p1", gpus=4, t=NOW - 60)])
    assert evicted(run(snap, now=NOW)) == {"big": str(EvictionReason.BORROWED)}
