"""Preemption inside a project: rules that mutation testing found unguarded (docs/engine.md,
"Mutation testing", the fourth run)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.engine.types import PodPlacement, SchedulerConfig, Workload
from tests.engine.builders import (
    dept,
    evicted,
    in_pools_a_b,
    job,
    nodes,
    placed,
    project,
    run,
    running,
    snapshot,
)

NOW = 100_000.0
PREEMPT = "preempt"
Outcome = tuple[dict[str, list[tuple[str, tuple[int, ...]]]], dict[str, str]]


def _elastic_on_n0(owner_priority: int, preemptible: bool = False) -> Workload:
    """p's elastic job (1 to 4 pods) running all 4 pods on n0's 4 GPUs."""
    e = job("e", "p", pods=4, min_pods=1, elastic=True, priority=owner_priority)
    e = replace(e, preemptible=preemptible)
    pods = tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(4))
    return replace(e, placement=pods, started_at=0.0)


def _extras_case(owner_priority: int, config: SchedulerConfig | None = None) -> object:
    """p (quota 4) runs the elastic job (non-preemptible: nothing of p is a victim, only
    its extra pods) on a full 4-GPU node and submits a 1-GPU job of priority 5."""
    snap = snapshot(
        nodes(1, 4),
        [dept(), project("p", deserved=4)],
        [_elastic_on_n0(owner_priority), job("w", "p", priority=5, t=10.0)],
    )
    result = run(snap, config, now=NOW)
    return placed(result), evicted(result), [(r.workload_id, r.removed) for r in result.resizes]


@pytest.mark.parametrize("owner_priority", [0, 5])
def test_a_newcomer_takes_an_extra_pod_of_its_projects_elastic_job_of_at_most_its_priority(
    owner_priority: int,
) -> None:
    # Nothing of p may be evicted whole, yet preemption runs for it: it takes the newest
    # extra pod (device 3) and evicts nothing.
    expected = ({"w": [("n0", (3,))]}, {}, [("e", (3,))])
    assert _extras_case(owner_priority) == expected


def test_an_extra_pod_of_a_higher_priority_elastic_job_is_not_taken() -> None:
    assert _extras_case(owner_priority=9) == ({}, {}, [])


def test_an_extra_pod_of_another_projects_elastic_job_is_not_preempted() -> None:
    # q (quota 4) runs the elastic job on n0's 4 GPUs; p (no quota) runs a job of
    # priority 9 on n1 and waits with one of priority 5: q's extras are not p's to take.
    e = replace(_elastic_on_n0(0), queue_id="q")
    hi = running(job("hi", "p", priority=9), "n1", [0])
    cluster = (*nodes(1, 4), *nodes(1, 1, start=1))
    queues = [dept(), project("p"), project("q", deserved=4)]
    result = run(snapshot(cluster, queues, [e, hi, job("w", "p", priority=5, t=10.0)]))
    assert (placed(result), evicted(result), result.resizes) == ({}, {}, ())


@pytest.mark.parametrize(("searches", "taken"), [(0, False), (1, True)])
def test_no_search_left_means_no_preemption_even_of_extra_pods(searches: int, taken: bool) -> None:
    outcome = _extras_case(0, SchedulerConfig(max_victim_searches=searches))
    assert bool(outcome[0]) is taken  # type: ignore[index]


def _two_preemptions(config: SchedulerConfig | None = None) -> Outcome:
    """p (quota 2) runs two low-priority jobs on a full 2-GPU node; two jobs of priority
    5 wait."""
    lows = [running(job(f"low{i}", "p"), "n0", [i]) for i in range(2)]
    waiting = [job(f"w{i}", "p", priority=5, t=i) for i in range(2)]
    result = run(
        snapshot(nodes(1, 2), [dept(), project("p", deserved=2)], [*lows, *waiting]), config
    )
    return placed(result), evicted(result)


def test_one_preemption_does_not_end_the_phase() -> None:
    assert _two_preemptions() == (
        {"w0": [("n0", (0,))], "w1": [("n0", (1,))]},
        {"low0": PREEMPT, "low1": PREEMPT},
    )


def test_the_last_search_of_the_cycle_is_still_used() -> None:
    config = SchedulerConfig(max_victim_searches=1)
    assert _two_preemptions(config) == ({"w0": [("n0", (0,))]}, {"low0": PREEMPT})


def test_a_waiting_job_of_a_project_with_nothing_to_evict_does_not_end_the_phase() -> None:
    # q1's job comes first (priority 9), but q1 runs nothing: q2's job still preempts.
    low = running(job("low", "q2"), "n0", [0])
    waiting = [job("w1", "q1", priority=9), job("w2", "q2", priority=5, t=1.0)]
    queues = [dept(), project("q1"), project("q2", deserved=1)]
    result = run(snapshot(nodes(1, 1), queues, [low, *waiting]))
    assert (placed(result), evicted(result)) == ({"w2": [("n0", (0,))]}, {"low": PREEMPT})


def _fails_in_a_then_b(config: SchedulerConfig | None = None, a_nodes: int = 2) -> Outcome:
    """Pool a: `a_nodes` 1-GPU nodes, a low job on each (with two, GPUs enough in total,
    but a 2-GPU pod fits on neither; with one, not enough in total); pool b: two 2-GPU
    nodes, a low 2-GPU job on each. Two 2-GPU jobs of priority 5 wait for pools a then
    b, and a 1-GPU job of priority 4 for pool b."""
    work = [running(job(f"la{i}", "p"), f"a{i}", [0]) for i in range(a_nodes)]
    work += [running(job(f"lb{i}", "p", gpus=2), f"b{i}", [0, 1]) for i in range(2)]
    work += [job(f"w{i}", "p", gpus=2, priority=5, t=i, pools=("a", "b")) for i in range(2)]
    work.append(job("x", "p", priority=4, pools=("b",)))
    cluster = (*nodes(a_nodes, 1, prefix="a"), *nodes(2, 2, pool="b", prefix="b"))
    result = run(snapshot(cluster, [dept(), in_pools_a_b("p", 2, 4)], work), config)
    return placed(result), evicted(result)


@pytest.mark.parametrize("a_nodes", [1, 2])
def test_a_pool_where_preemption_fails_is_passed_over_for_the_next_one(a_nodes: int) -> None:
    # Both 2-GPU jobs fail in pool a (the first searches, or sees too few GPUs there; the
    # second finds that failure remembered) and preempt in pool b; x then finds nothing
    # lower to evict there.
    assert _fails_in_a_then_b(a_nodes=a_nodes) == (
        {"w0": [("b0", (0, 1))], "w1": [("b1", (0, 1))]},
        {"lb0": PREEMPT, "lb1": PREEMPT},
    )


def test_a_remembered_failure_spends_no_search() -> None:
    # Three searches: w0 in a (fails) and b, w1 in b; w1's try in pool a is answered
    # from the failure w0 left, so the third search is still there for w1 in pool b.
    placements, _ = _fails_in_a_then_b(SchedulerConfig(max_victim_searches=3))
    assert set(placements) == {"w0", "w1"}


def test_non_preemptible_work_over_its_quota_in_one_pool_preempts_in_the_next() -> None:
    # p has no quota in pool a for non-preemptible work, 1 GPU in pool b.
    work = [running(job("la", "p"), "a0", [0]), running(job("lb", "p"), "b0", [0])]
    w = job("w", "p", priority=5, preemptible=False, pools=("a", "b"))
    cluster = (*nodes(1, 1, prefix="a"), *nodes(1, 1, pool="b", prefix="b"))
    result = run(snapshot(cluster, [dept(), in_pools_a_b("p", 0, 1)], [*work, w]))
    assert (placed(result), evicted(result)) == ({"w": [("b0", (0,))]}, {"lb": PREEMPT})


def test_free_gpus_count_toward_the_room_a_preemption_makes() -> None:
    # A 2-GPU job: one GPU is free, the other held by a low job.
    low = running(job("low", "p"), "n0", [0])
    w = job("w", "p", gpus=2, priority=5)
    result = run(snapshot(nodes(1, 2), [dept(), project("p", deserved=2)], [low, w]))
    assert (placed(result), evicted(result)) == ({"w": [("n0", (0, 1))]}, {"low": PREEMPT})


def test_same_priority_work_within_the_guarantee_is_not_taken_for_a_cheaper_plan() -> None:
    # p (quota 2) runs big (3 GPUs, borrowed) and then small (1 GPU, guaranteed) at the
    # same priority on a full 4-GPU node. A 1-GPU newcomer within the quota evicts big,
    # though small alone would free enough GPUs for it at a smaller loss.
    big = running(job("big", "p", gpus=3, t=0.0), "n0", [0, 1, 2], started=NOW - 3600)
    small = running(job("small", "p", t=1.0), "n0", [3], started=NOW - 60)
    snap = snapshot(nodes(1, 4), [dept(), project("p", deserved=2)], [big, small, job("w", "p")])
    result = run(snap, now=NOW)
    assert evicted(result) == {"big": "borrowed"}
    assert list(placed(result)) == ["w"]


def test_a_newcomer_placed_on_extra_pods_is_not_placed_again_in_its_next_pool() -> None:
    # As above in pool a; pool b holds a low job of p that the newcomer could also evict.
    lb = running(job("lb", "p"), "b0", [0])
    w = job("w", "p", priority=5, t=10.0, pools=("a", "b"))
    cluster = (*nodes(1, 4), *nodes(1, 1, pool="b", prefix="b"))
    snap = snapshot(cluster, [dept(), in_pools_a_b("p", 4, 1)], [_elastic_on_n0(0), lb, w])
    result = run(snap, now=NOW)
    assert (placed(result), evicted(result)) == ({"w": [("n0", (3,))]}, {})


def test_a_newcomer_at_its_projects_limit_evicts_what_its_quota_needs() -> None:
    # p (limit 2) runs two low 1-GPU jobs on a 3-GPU node. Evicting one makes room for a
    # 2-GPU job next to the free GPU, but p would then hold 3 GPUs, over its limit: the
    # search goes on to the second, and the newcomer starts within the limit (it used to
    # evict nothing and wait for ever, the search stopping once the room was there).
    lows = [running(job(f"low{i}", "p"), "n0", [i]) for i in range(2)]
    w = job("w", "p", gpus=2, priority=5)
    queues = [dept(), project("p", deserved=2, limit=2)]
    result = run(snapshot(nodes(1, 3), queues, [*lows, w]))
    assert evicted(result) == {"low0": PREEMPT, "low1": PREEMPT}
    assert list(placed(result)) == ["w"]
    assert len(placed(result)["w"][0][1]) == 2


def test_a_newcomer_over_its_limit_even_without_its_victims_evicts_nothing() -> None:
    # As above with a limit of 1: the 2-GPU job is over it whatever p stops.
    lows = [running(job(f"low{i}", "p"), "n0", [i]) for i in range(2)]
    w = job("w", "p", gpus=2, priority=5)
    queues = [dept(), project("p", deserved=1, limit=1)]
    result = run(snapshot(nodes(1, 3), queues, [*lows, w]))
    assert (placed(result), evicted(result)) == ({}, {})


def test_a_newcomer_that_preempted_in_one_pool_does_not_preempt_in_the_next() -> None:
    # A low job of p on each pool's one GPU: the newcomer evicts only pool a's.
    work = [running(job("la", "p"), "a0", [0]), running(job("lb", "p"), "b0", [0])]
    w = job("w", "p", priority=5, pools=("a", "b"))
    cluster = (*nodes(1, 1, prefix="a"), *nodes(1, 1, pool="b", prefix="b"))
    result = run(snapshot(cluster, [dept(), in_pools_a_b("p", 1, 1)], [*work, w]))
    assert (placed(result), evicted(result)) == ({"w": [("a0", (0,))]}, {"la": PREEMPT})


def test_a_project_that_took_back_borrowed_gpus_stays_within_its_fair_share() -> None:
    # p1 (quota 4) runs g (3 GPUs, guaranteed) and big (4, borrowed); p3 (quota 2) runs
    # four 2-GPU jobs, above its fair share. p1's small job (within the quota) takes back
    # o1 (reason reclaim, with the numbers of the pool it was taken in); the GPU o1 frees
    # beyond small's need does not go to p1's next job, which would be borrowing.
    g = running(job("g", "p1", gpus=3, t=0.0), "n0", [0, 1, 2], started=NOW - 3600)
    big = running(job("big", "p1", gpus=4, t=1.0), "n0", [3, 4, 5, 6], started=NOW - 3600)
    theirs = [
        running(job(f"o{i}", "p3", gpus=2, t=i), "n1", [2 * i, 2 * i + 1], started=NOW - 3600)
        for i in range(4)
    ]
    fill = running(job("f", "p2", preemptible=False), "n0", [7], started=NOW - 3600)
    queues = [
        dept(),
        project("p1", deserved=4),
        project("p2", deserved=10),
        project("p3", deserved=2),
    ]
    waiting = [job("small", "p1", t=NOW - 60), job("more", "p1", t=NOW - 30)]
    result = run(snapshot(nodes(2), queues, [g, big, *theirs, fill, *waiting]), now=NOW)
    assert (placed(result), evicted(result)) == ({"small": [("n1", (2,))]}, {"o1": "reclaim"})
    assert [e.detail for e in result.evictions] == [
        "1 GPU in pool a; p1 holds 7 of its deserved 4, 4 of them borrowed by its own work "
        "later in its queue"
    ]
    assert result.pending_reasons["more"].startswith("project p1 reclaimed GPUs this cycle")
