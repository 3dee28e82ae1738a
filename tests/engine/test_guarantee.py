"""A project's work within its deserved quota is never kept waiting by the project's own
borrowed work (issue 18): on a private cluster of its quota that borrowed work could not
have run at all. See actions/preempt.py (`Guarantee`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given

from scheduling.engine import schedule
from scheduling.engine.apply import apply_result
from scheduling.engine.types import EvictionReason, SchedulerConfig, Snapshot
from tests.engine.builders import dept, evicted, job, nodes, placed, project, run, running, snapshot
from tests.engine.test_properties import FAST, NOW, _check_no_overcommit, random_snapshot, seeds

PREEMPT = str(EvictionReason.PREEMPT)
BORROWED = str(EvictionReason.BORROWED)


def _borrower(**pending: object) -> Snapshot:
    """16 GPUs on 2 nodes: p1 (quota 4) runs an 8-GPU job on borrowed GPUs, p2 (quota 8)
    runs 8 one-GPU jobs: the cluster is full. p1 submits a 4-GPU job."""
    big = running(job("big", "p1", gpus=8), "n0", range(8), started=NOW - 3600)
    theirs = [running(job(f"o{i}", "p2"), "n1", [i], started=NOW - 3600) for i in range(8)]
    queues = [dept(), project("p1", deserved=4), project("p2", deserved=12)]
    newcomer = job("small", "p1", gpus=int(pending.pop("gpus", 4)), t=NOW - 60, **pending)
    return snapshot(nodes(2), queues, [big, *theirs, newcomer])


def test_work_within_the_quota_evicts_the_projects_own_borrowed_work() -> None:
    result = run(_borrower(), now=NOW)
    assert evicted(result) == {"big": BORROWED}
    assert [e.beneficiary for e in result.evictions] == ["small"]
    # The event's numbers: what the newcomer needs, what its project holds and is owed,
    # and (it holds more than its quota) how much of that is its own borrowed work.
    assert [e.detail for e in result.evictions] == [
        "4 GPUs in pool a; p1 holds 8 of its deserved 4, 8 of them borrowed by its own work "
        "later in its queue"
    ]
    assert list(placed(result)) == ["small"]


def test_no_eviction_when_the_newcomer_would_exceed_the_quota_anyway() -> None:
    # 5 GPUs on a quota of 4: it is borrowing too, and waits for idle GPUs.
    assert run(_borrower(gpus=5), now=NOW).evictions == ()


def test_guaranteed_work_of_the_same_priority_is_never_evicted() -> None:
    # p1 holds its 4 guaranteed GPUs with 4 one-GPU jobs plus 4 borrowed ones: a fifth
    # in-quota job does not fit beside the guaranteed four, so nothing is evicted.
    mine = [running(job(f"g{i}", "p1", t=i), "n0", [i], started=NOW - 3600) for i in range(8)]
    theirs = [running(job(f"o{i}", "p2"), "n1", [i], started=NOW - 3600) for i in range(8)]
    queues = [dept(), project("p1", deserved=4), project("p2", deserved=12)]
    snap = snapshot(nodes(2), queues, [*mine, *theirs, job("next", "p1", t=NOW - 60)])
    assert run(snap, now=NOW).evictions == ()


def test_borrowed_work_of_a_higher_priority_is_not_evicted() -> None:
    snap = _borrower(priority=-1)
    assert run(snap, now=NOW).evictions == ()


def test_the_evicted_borrower_does_not_evict_its_evictor_back_over_fifty_cycles() -> None:
    snap = _borrower()
    reasons: Counter[tuple[str, str]] = Counter()
    now = NOW
    for _ in range(50):
        result = schedule(snap, SchedulerConfig(), now)
        for e in result.evictions:
            reasons[(e.workload_id, e.beneficiary or "")] += 1
        snap = apply_result(snap, result, now)
        now += 60
    assert reasons == {("big", "small"): 1}
    held = {wl.id for wl in snap.workloads if wl.placement}
    assert "small" in held and "big" not in held


@FAST
@given(seeds)
def test_equal_priority_preemption_only_takes_borrowed_work_and_never_cycles(seed: int) -> None:
    # Over 50 cycles of a random cluster: whenever work of the same priority is preempted,
    # its project held more than its deserved quota in that pool, and no two workloads
    # ever preempt each other (a -> b, later b -> a).
    snap = random_snapshot(seed)
    pool_of = {n.id: n.pool for n in snap.nodes}
    pairs: set[tuple[str, str]] = set()
    now = NOW
    for _ in range(50):
        result = schedule(snap, SchedulerConfig(), now)
        by_id = {wl.id: wl for wl in snap.workloads}
        for e in result.evictions:
            if e.reason not in (EvictionReason.PREEMPT, EvictionReason.BORROWED):
                continue
            victim, newcomer = by_id[e.workload_id], by_id[e.beneficiary or ""]
            assert victim.queue_id == newcomer.queue_id
            # The reason names the real cause: a higher priority, or borrowed GPUs.
            outranked = victim.priority < newcomer.priority
            assert (e.reason is EvictionReason.PREEMPT) == outranked
            if victim.priority == newcomer.priority:
                pool = pool_of[(victim.placement or ())[0].node_id]
                # What the queue held in the pool at most, in this cycle: before it, plus
                # what the cycle admitted for it there (an admission may come first).
                mine = [
                    (wl.placement, by_id[wl.id])
                    for wl in snap.workloads
                    if wl.queue_id == victim.queue_id and wl.placement
                ] + [
                    (a.pods, by_id[a.workload_id])
                    for a in result.admissions
                    if by_id[a.workload_id].queue_id == victim.queue_id
                ]
                held = sum(
                    _gpus(placement)
                    for placement, _ in mine
                    if pool_of[placement[0].node_id] == pool
                )
                queue = next(q for q in snap.queues if q.id == victim.queue_id)
                deserved = sum(
                    quota.deserved
                    for (p, r), quota in queue.quotas.items()
                    if p == pool and str(r) == "gpu"
                )
                assert held > deserved, (victim.id, held, deserved)
            assert (newcomer.id, victim.id) not in pairs
            pairs.add((victim.id, newcomer.id))
        snap = apply_result(snap, result, now)
        _check_no_overcommit(snap)
        now += 60


def _gpus(placement) -> float:
    return sum(len(p.gpus) + (p.share if p.shared_gpu is not None else 0.0) for p in placement)


def _borrowers_elsewhere(**pending: object) -> Snapshot:
    """16 GPUs: p1 (quota 4) runs an 8-GPU job on borrowed GPUs; p3 (quota 2) runs 8
    one-GPU jobs, 6 of them borrowed, above its fair share (7 of 16). p1 submits a
    one-GPU job within its quota."""
    big = running(job("big", "p1", gpus=8), "n0", range(8), started=NOW - 3600)
    theirs = [running(job(f"o{i}", "p3", t=i), "n1", [i], started=NOW - 3600) for i in range(8)]
    queues = [
        dept(),
        project("p1", deserved=4),
        project("p2", deserved=10),
        project("p3", deserved=2),
    ]
    newcomer = job("small", "p1", gpus=1, t=NOW - 60, **pending)
    return snapshot(nodes(2), queues, [big, *theirs, newcomer])


def test_work_within_the_quota_takes_other_projects_borrowed_work_before_its_own() -> None:
    # One GPU of p3's borrowed work loses far less than p1's own 8-GPU job.
    result = run(_borrowers_elsewhere(), now=NOW)
    assert set(evicted(result).values()) == {str(EvictionReason.RECLAIM)}
    (victim,) = evicted(result)
    assert victim in {f"o{i}" for i in range(2, 8)}  # p3's first two are guaranteed
    assert list(placed(result)) == ["small"]


def test_guaranteed_work_of_other_projects_is_not_taken() -> None:
    # p3 at its deserved quota borrows nothing: p1 falls back to its own borrowed job.
    snap = _borrowers_elsewhere()
    snap = replace(
        snap,
        queues=tuple(
            replace(q, quotas={k: replace(v, deserved=8) for k, v in q.quotas.items()})
            if q.id == "p3"
            else q
            for q in snap.queues
        ),
    )
    assert evicted(run(snap, now=NOW)) == {"big": BORROWED}


def _over_borrower(waiting: bool) -> Snapshot:
    """16 GPUs: p1 (quota 2) runs 4 one-GPU jobs on n0 and submits a fifth; p2 (quota 14)
    runs an 8-GPU job on n1 and, when `waiting`, waits with another that needs a whole
    node: p2 is below its fair share of 14, p1 at twice its share of 2."""
    mine = [running(job(f"m{i}", "p1", t=i), "n0", [i], started=NOW - 3600) for i in range(4)]
    theirs = [running(job("b0", "p2", gpus=8), "n1", range(8), started=NOW - 3600)]
    if waiting:
        theirs.append(job("b1", "p2", gpus=8, t=NOW - 120))
    queues = [dept(), project("p1", deserved=2), project("p2", deserved=14)]
    return snapshot(nodes(2), queues, [*mine, *theirs, job("m4", "p1", t=NOW - 60)])


def test_a_queue_past_twice_its_fair_share_does_not_borrow_while_another_waits_below() -> None:
    result = run(_over_borrower(waiting=True), now=NOW)
    assert "m4" not in placed(result)
    assert "2 x its fair share" in result.pending_reasons["m4"]


def test_a_queue_past_twice_its_fair_share_borrows_idle_gpus_nobody_waits_for() -> None:
    assert "m4" in placed(run(_over_borrower(waiting=False), now=NOW))
