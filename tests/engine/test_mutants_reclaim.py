"""Reclaim rules that mutation testing found unguarded (docs/engine.md, "Mutation
testing")."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import (
    EvictionReason,
    PodPlacement,
    PodRequest,
    Queue,
    Resource,
    SchedulerConfig,
    Workload,
)
from tests.engine.builders import (
    dept,
    evicted,
    in_pools_a_b,
    job,
    nodes,
    placed,
    project,
    quota,
    run,
    running,
    snapshot,
)


def test_a_reclaim_that_lifts_its_department_past_its_share_takes_only_from_that_department() -> (
    None
):
    # Shares of 5 GPUs: d1 2.5 (p1 1, p2 1.5), d2 2.5 (p3). p1 is within its own share but
    # admitting its job lifts d1 to 3: it may only take from its own department (p2),
    # even though p3's job in d2, above its share too, is the cheapest victim.
    work = [
        running(job("a1", "p2"), "n0", [0], started=800.0),
        running(job("a2", "p2"), "n0", [1], started=900.0),
        running(job("c1", "p3"), "n0", [2], started=0.0),
        running(job("c2", "p3"), "n0", [3], started=0.0),
        running(job("c3", "p3"), "n0", [4], started=990.0),
        job("mine", "p1"),
    ]
    queues = [
        dept("d1", deserved=2),
        dept("d2", deserved=2),
        project("p1", "d1", deserved=2),
        project("p2", "d1"),
        project("p3", "d2"),
    ]
    result = run(snapshot(nodes(1, gpus=5), queues, work), now=1000.0)
    assert evicted(result) == {"a2": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n0", (1,))]}


def test_a_reclaim_says_how_many_gpus_it_takes_back_in_words() -> None:
    # One GPU, then two: "1 GPU", "2 GPUs", with what the project holds of its quota.
    for gpus, words in ((1, "1 GPU"), (2, "2 GPUs")):
        work = [
            *(running(job(f"b{i}", "p2"), "n0", [i], started=100.0 * i) for i in range(4)),
            job("mine", "p1", gpus=gpus),
        ]
        queues = [dept(), project("p1", deserved=2), project("p2", deserved=2)]
        result = run(snapshot(nodes(1, gpus=4), queues, work), now=1000.0)
        details = {e.detail for e in result.evictions}
        assert details == {f"{words} in pool a; p1 holds 0 of its deserved 2"}


# The fifth run (docs/engine.md): reclaim alone (preemption and consolidation off, which
# would otherwise take the same borrowed work back by their own paths).
ALONE = SchedulerConfig(preempt=False, consolidate=False)
NOW_5 = 10_000.0
RECLAIM = str(EvictionReason.RECLAIM)


def _borrowed(name: str, node: str, gpu: int, queue: str = "b") -> Workload:
    return running(job(name, queue, t=gpu), node, [gpu], NOW_5 - 600)


def _reclaimed_in_b(
    own_a: Queue, a_work: list[Workload], jobs: int = 1, c_in_a: float = 2
) -> dict[str, str]:
    """own's 2-GPU jobs may run in pool a (two 2-GPU nodes holding `a_work`) or b (one
    node of b's borrowed 1-GPU jobs, two per job): what reclaim alone evicts."""
    in_b = [_borrowed(f"bb{i}", f"b{i // 2}", i % 2) for i in range(2 * jobs)]
    cluster = (*nodes(2, 2, prefix="a"), *nodes(jobs, 2, pool="b", prefix="b"))
    own = Queue("own", "dept", {**own_a.quotas, ("b", Resource.GPU): quota(2 * jobs)})
    queues = [dept(), own, in_pools_a_b("b", 0, 0), in_pools_a_b("c", c_in_a, 0)]
    ask = (PodRequest(gpus=2, cpu=1.0),)
    mine = [
        replace(job(f"w{i}", "own", t=NOW_5 + i, pools=("a", "b")), pods=ask) for i in range(jobs)
    ]
    result = run(snapshot(cluster, queues, [*a_work, *in_b, *mine]), ALONE, now=NOW_5)
    assert sorted(placed(result)) == [f"w{i}" for i in range(jobs)]
    return evicted(result)


def test_a_reclaim_that_fails_in_one_pool_goes_on_to_the_next() -> None:
    # In a, b's jobs sit one per node beside c's guaranteed ones (no plan), or a holds
    # only c's guaranteed work (nothing borrowed), or own has nothing deserved there, or
    # its CPU limit there is below the job's ask (1 core): the jobs are served in b. A second job
    # like the first is not turned away from b by the failure remembered in a.
    def c_job(i: int) -> Workload:
        return replace(_borrowed(f"c{i}", f"a{i}", 1, "c"), preemptible=False)

    scattered = [_borrowed(f"ba{i}", f"a{i}", 0) for i in range(2)] + [c_job(i) for i in range(2)]
    guaranteed = [
        replace(c_job(i), placement=(PodPlacement(0, f"a{i // 2}", gpus=(i % 2,)),))
        for i in range(4)
    ]
    cpu_capped = Queue(
        "own",
        "dept",
        {("a", Resource.GPU): quota(2), ("a", Resource.CPU): quota(0, limit=0.5)},
    )
    b_pair = {"bb0": RECLAIM, "bb1": RECLAIM}
    assert _reclaimed_in_b(in_pools_a_b("own", 2, 0), scattered) == b_pair
    assert _reclaimed_in_b(in_pools_a_b("own", 2, 0), guaranteed, c_in_a=4) == b_pair
    assert _reclaimed_in_b(in_pools_a_b("own", 0, 0), scattered) == b_pair
    assert _reclaimed_in_b(cpu_capped, [_borrowed(f"ba{i}", "a0", i) for i in (0, 1)]) == b_pair
    twice = _reclaimed_in_b(in_pools_a_b("own", 2, 0), scattered, jobs=2)
    assert twice == {f"bb{i}": RECLAIM for i in range(4)}


def test_a_reclaim_that_placed_its_workload_tries_no_further_pool() -> None:
    work = [_borrowed("ba", "a0", 0), _borrowed("bb", "b0", 0)]
    cluster = (*nodes(1, 1, prefix="a"), *nodes(1, 1, pool="b", prefix="b"))
    queues = [dept(), in_pools_a_b("own", 1, 1), in_pools_a_b("b", 0, 0)]
    w = job("w", "own", t=NOW_5, pools=("a", "b"))
    result = run(snapshot(cluster, queues, [*work, w]), ALONE, now=NOW_5)
    assert (evicted(result), placed(result)) == ({"ba": RECLAIM}, {"w": [("a0", (0,))]})


def test_one_search_left_still_serves_a_reclaim() -> None:
    queues = [dept(), project("own", deserved=1), project("b")]
    snap = snapshot(nodes(1, 1), queues, [_borrowed("b0", "n0", 0), job("w", "own", t=NOW_5)])
    result = run(snap, replace(ALONE, max_victim_searches=1), now=NOW_5)
    assert evicted(result) == {"b0": RECLAIM}


def test_a_failed_reclaim_is_remembered_for_its_own_pool_only() -> None:
    # o1's job (older, first in line) finds no plan in pool a; o2's job of the same size,
    # allowed only in b, is not answered by that failure.
    in_a = [_borrowed(f"ba{i}", f"a{i}", 0) for i in range(2)]
    in_a += [replace(_borrowed(f"c{i}", f"a{i}", 1, "c"), preemptible=False) for i in range(2)]
    in_b = [_borrowed(f"bb{i}", "b0", i) for i in range(2)]
    cluster = (*nodes(2, 2, prefix="a"), *nodes(1, 2, pool="b", prefix="b"))
    queues = [dept(), in_pools_a_b("o1", 2, 0), in_pools_a_b("o2", 0, 2), in_pools_a_b("b", 0, 0)]
    queues.append(in_pools_a_b("c", 2, 0))
    w1 = job("w1", "o1", gpus=2, t=NOW_5 - 60, pools=("a",))
    w2 = job("w2", "o2", gpus=2, t=NOW_5, pools=("b",))
    result = run(snapshot(cluster, queues, [*in_a, *in_b, w1, w2]), ALONE, now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"bb0": RECLAIM, "bb1": RECLAIM}, ["w2"])


def test_extra_pods_are_reclaimed_where_no_whole_workload_may_be() -> None:
    # b's elastic job (non-preemptible, 1 to 4 pods) runs 4 pods on the node: its extra
    # pods are all reclaim may take, and the owner gets one.
    e = replace(job("e", "b", pods=4, min_pods=1, elastic=True), preemptible=False)
    e = replace(e, placement=tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(4)))
    e = replace(e, started_at=NOW_5 - 600)
    queues = [dept(), project("own", deserved=1), project("b")]
    result = run(snapshot(nodes(1, 4), queues, [e, job("w", "own", t=NOW_5)]), ALONE, now=NOW_5)
    assert list(placed(result)) == ["w"]
    assert [(r.workload_id, r.delta, r.beneficiary) for r in result.resizes] == [("e", -1, "w")]


def test_the_fallback_to_borrowed_work_takes_extra_pods_before_whole_workloads() -> None:
    # b (deserved 0, weight 3) holds its fair share of 2 with its elastic job's two pods
    # (one beyond its minimum); c is above its share with non-preemptible work. Reclaim
    # above the fair shares finds nothing, and its fallback (borrowed work, down to the
    # deserved quotas) takes b's extra pod, not b's whole job.
    e = job("e", "b", pods=2, min_pods=1, elastic=True)
    e = replace(e, placement=tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(2)))
    e = replace(e, started_at=NOW_5 - 600)
    c_work = [replace(_borrowed(f"c{i}", "n0", i + 2, "c"), preemptible=False) for i in (0, 1)]
    queues = [dept(), project("own", deserved=1), project("b", weight=3.0), project("c")]
    snap = snapshot(nodes(1, 4), queues, [e, *c_work, job("w", "own", t=NOW_5)])
    for config in (ALONE, SchedulerConfig()):
        result = run(snap, config, now=NOW_5)
        assert (evicted(result), list(placed(result))) == ({}, ["w"])
        assert [(r.workload_id, r.delta, r.beneficiary) for r in result.resizes] == [("e", -1, "w")]


def test_a_project_that_reclaimed_borrows_nothing_more_in_that_cycle() -> None:
    # own (deserved 1) takes back b's borrowed 2-GPU job for its 1-GPU job: the second
    # GPU freed does not go to own's next job, which would be borrowing past its share.
    big = running(job("big", "b", gpus=2), "n0", [0, 1], NOW_5 - 600)
    mine = [job("w1", "own", t=NOW_5 - 10), job("w2", "own", t=NOW_5)]
    queues = [dept(), project("own", deserved=1), project("b")]
    result = run(snapshot(nodes(1, 2), queues, [big, *mine]), ALONE, now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"big": RECLAIM}, ["w1"])
    assert result.pending_reasons["w2"].startswith("project own reclaimed GPUs this cycle")
