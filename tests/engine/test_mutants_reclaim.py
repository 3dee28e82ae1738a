"""Reclaim rules that mutation testing found unguarded (docs/engine.md, "Mutation
testing")."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given

from scheduling.engine import schedule
from scheduling.engine.types import (
    CycleResult,
    EvictionReason,
    Node,
    PodPlacement,
    PodRequest,
    Queue,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tests.engine.builders import (
    GPU_MEMORY,
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
from tests.engine.test_properties import FAST, random_snapshot, seeds


def test_a_reclaim_that_lifts_its_department_past_its_share_takes_only_from_that_department() -> (
    None
):
    # Shares of 5 GPUs: d1 2.5 (p1 1, p2 1.5), d2 2.5 (p3). p1 is within its own share but
    # admitting its job lifts d1 to 3: it may only take from its own department (p2),
    # even though p3's job in d2, above its share too, is the cheapest victim. The same
    # for a pod asking a whole device's memory: 1 GPU of the pool's devices (the sixth
    # run: counted without the pool, it is 0 GPUs, which lifts nothing).
    running_work = [
        running(job("a1", "p2"), "n0", [0], started=800.0),
        running(job("a2", "p2"), "n0", [1], started=900.0),
        running(job("c1", "p3"), "n0", [2], started=0.0),
        running(job("c2", "p3"), "n0", [3], started=0.0),
        running(job("c3", "p3"), "n0", [4], started=990.0),
    ]
    queues = [
        dept("d1", deserved=2),
        dept("d2", deserved=2),
        project("p1", "d1", deserved=2),
        project("p2", "d1"),
        project("p3", "d2"),
    ]
    # (the memory pod shares the device it is placed on: no whole device named)
    for mine, devices in ((job("mine", "p1"), (1,)), (by_memory("mine", "p1", GPU_MEMORY), ())):
        result = run(snapshot(nodes(1, gpus=5), queues, [*running_work, mine]), now=1000.0)
        assert evicted(result) == {"a2": str(EvictionReason.RECLAIM)}
        assert placed(result) == {"mine": [("n0", devices)]}
        details = {e.detail for e in result.evictions}
        assert details == {"1 GPU in pool a; p1 holds 0 of its deserved 2"}


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


def _fixed(name: str, node: str, gpu: int, queue: str) -> Workload:
    """A non-preemptible 1-GPU job running since 600 s before NOW_5."""
    return replace(_borrowed(name, node, gpu, queue), preemptible=False)


def _scattered(movable: str = "b", fixed: str = "c") -> list[Workload]:
    """Pool a's two 2-GPU nodes, each holding a 1-GPU job of `movable` beside one of
    `fixed`, non-preemptible: no plan for a 2-GPU job."""
    return [
        *(_borrowed(f"{movable}a{i}", f"a{i}", 0, movable) for i in range(2)),
        *(_fixed(f"{fixed}{i}", f"a{i}", 1, fixed) for i in range(2)),
    ]


def _o1_in_a_o2_in_b(mine: list[Workload]) -> Snapshot:
    """_scattered() in pool a, where o1 deserves 2 (as c does); b's two borrowed jobs on
    pool b's node, where o2 deserves 2; and `mine` waiting."""
    in_b = [_borrowed(f"bb{i}", "b0", i) for i in range(2)]
    cluster = (*nodes(2, 2, prefix="a"), *nodes(1, 2, pool="b", prefix="b"))
    queues = [dept(), in_pools_a_b("o1", 2, 0), in_pools_a_b("o2", 0, 2), in_pools_a_b("b", 0, 0)]
    queues.append(in_pools_a_b("c", 2, 0))
    return snapshot(cluster, queues, [*_scattered(), *in_b, *mine])


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
    scattered = _scattered()
    guaranteed = [
        replace(
            _fixed(f"c{i}", "a0", 1, "c"), placement=(PodPlacement(0, f"a{i // 2}", gpus=(i % 2,)),)
        )
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
    w1 = job("w1", "o1", gpus=2, t=NOW_5 - 60, pools=("a",))
    w2 = job("w2", "o2", gpus=2, t=NOW_5, pools=("b",))
    result = run(_o1_in_a_o2_in_b([w1, w2]), ALONE, now=NOW_5)
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


# The sixth run (docs/engine.md): each test below failed with its mutants applied by
# hand. Several watch the cycle's search budget (max_victim_searches): where a survivor
# only spent a search that decides nothing, a budget of exactly what the unmutated
# engine needs shows the spent search as a reclaim not made.


def by_memory(wid: str, queue: str, mib: int) -> Workload:
    """A pending pod sized by GPU memory: mib over the pool's device size is its GPUs."""
    return replace(job(wid, queue, t=NOW_5), pods=(PodRequest(gpu_memory_mib=mib),))


def test_a_pod_sized_by_gpu_memory_counts_the_pools_devices_when_it_reclaims() -> None:
    # Half of a 40 GB device is half a GPU: own, which deserves none, may not reclaim it
    # from b's borrowed job (counted as 0 GPUs, it would).
    queues = [dept(), project("own"), project("b")]
    work = [_borrowed("b0", "n0", 0), by_memory("w", "own", GPU_MEMORY // 2)]
    result = run(snapshot(nodes(1, 1), queues, work), ALONE, now=NOW_5)
    assert (evicted(result), placed(result)) == ({}, {})


def _beside_a_free_v100(a100s: int) -> tuple[Node, ...]:
    """Node n0 with `a100s` A100s, n1 with one V100 that no job here asks for."""
    return (*nodes(1, a100s), *nodes(1, 1, model="V100", start=1))


def _above_share_within_quota() -> tuple[tuple[Node, ...], list[Queue], list[Workload]]:
    """Deserved quotas of 2 and 2 in a pool of 2 GPUs, both asked for in full: fair
    shares of 1 each. b holds 2, within its deserved quota (nothing borrowed) yet above
    its fair share; own waits with two 1-GPU jobs."""
    queues = [dept(), project("own", deserved=2), project("b", deserved=2)]
    work = [
        *(running(job(f"b{i}", "b", t=i), "n0", [i], NOW_5 - 600 + i) for i in range(2)),
        job("w1", "own", t=NOW_5 - 1),
        job("w2", "own", t=NOW_5),
    ]
    return nodes(1, 2), queues, work


def _borrowed_at_its_share() -> tuple[tuple[Node, ...], list[Queue], list[Workload]]:
    """own's job asks for an A100; b holds its fair share (1), all of it borrowed, and
    the pool's other GPU, a V100, is free: no search above the fair shares can help."""
    queues = [dept(), project("own", deserved=1), project("b")]
    work = [_borrowed("b0", "n0", 0), job("w", "own", t=NOW_5, gpu_models=("A100",))]
    return _beside_a_free_v100(1), queues, work


def test_a_reclaim_above_the_fair_shares_needs_nothing_over_a_deserved_quota() -> None:
    result = run(snapshot(*_above_share_within_quota()), ALONE, now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"b1": RECLAIM}, ["w1"])


def test_the_one_search_left_goes_to_the_fallback_when_no_queue_is_above_its_share() -> None:
    snap = snapshot(*_borrowed_at_its_share())
    result = run(snap, replace(ALONE, max_victim_searches=1), now=NOW_5)
    assert (evicted(result), placed(result)) == ({"b0": RECLAIM}, {"w": [("n0", (0,))]})


def _after_one_move(
    cluster: tuple[Node, ...], queues: list[Queue], work: list[Workload]
) -> CycleResult:
    """What reclaim alone decides in pool a once z, a department of its own, has started a
    1-GPU job in pool b: one move in the ledger's record (Ledger.moved), which the figures
    reclaim keeps per pool (over_quota, _over_share) must not take for one worked out."""
    z = Queue("z", None, {("b", Resource.GPU): quota(1)})
    cluster = (*cluster, *nodes(1, 1, pool="b", prefix="b"))
    snap = snapshot(cluster, [*queues, z], [*work, job("zw", "z", pools=("b",))])
    result = run(snap, ALONE, NOW_5)
    assert placed(result)["zw"] == [("b0", (0,))]
    return result


def test_what_other_queues_could_give_up_is_worked_out_after_one_move_too() -> None:
    result = _after_one_move(*_above_share_within_quota())
    assert (evicted(result), sorted(placed(result))) == ({"b1": RECLAIM}, ["w1", "zw"])
    result = _after_one_move(*_borrowed_at_its_share())
    assert (evicted(result), sorted(placed(result))) == ({"b0": RECLAIM}, ["w", "zw"])


def test_what_other_queues_could_give_up_is_worked_out_again_after_a_reclaim() -> None:
    # Fair shares of the 4 GPUs: own 2, b 1, c 1 (c's job is non-preemptible; own's jobs
    # ask for A100s). own's first job takes b's job above its share (one search); then b
    # holds its share, all borrowed, and own's second job goes to the fallback at once
    # (the second search), which takes b's other job.
    queues = [dept(), project("own", deserved=2), project("b"), project("c")]
    work = [
        *(_borrowed(f"b{i}", "n0", i) for i in range(2)),
        _fixed("c0", "n0", 2, "c"),
        *(job(f"w{i}", "own", t=NOW_5 + i, gpu_models=("A100",)) for i in range(2)),
    ]
    snap = snapshot(_beside_a_free_v100(3), queues, work)
    result = run(snap, replace(ALONE, max_victim_searches=2), now=NOW_5)
    assert (evicted(result), sorted(placed(result))) == (
        {"b0": RECLAIM, "b1": RECLAIM},
        ["w0", "w1"],
    )


def test_only_leaves_above_their_shares_count_toward_a_search_above_the_fair_shares() -> None:
    # Fair shares of the 4 GPUs: d1 2 (own), d2 1.5 (b), d3 0.5 (x's H100 job, waiting).
    # b's two borrowed A100 jobs give up 1 GPU above its share (and d2 1 above its own,
    # which a department's count would add): short of own's 2-GPU A100 job, so the one
    # search of the cycle goes to borrowed work and takes both jobs back.
    cluster = (*nodes(1, 2), *nodes(1, 2, model="V100", start=1))
    queues = [dept("d1", deserved=2), dept("d2", weight=3.0), dept("d3")]
    queues += [project("own", "d1", deserved=2), project("b", "d2"), project("x", "d3")]
    work = [
        *(_borrowed(f"b{i}", "n0", i) for i in range(2)),
        job("w", "own", gpus=2, t=NOW_5, gpu_models=("A100",)),
        job("xw", "x", t=NOW_5, gpu_models=("H100",)),
    ]
    result = run(snapshot(cluster, queues, work), replace(ALONE, max_victim_searches=1), now=NOW_5)
    assert (evicted(result), placed(result)) == (
        {"b0": RECLAIM, "b1": RECLAIM},
        {"w": [("n0", (0, 1))]},
    )


def _nothing_in_a_then_b(queues: list[Queue], mine: list[Workload], searches: int) -> CycleResult:
    """Pool a: b's A100 job beside a free V100; pool b: c's borrowed A100. own's A100
    jobs may run in either: what reclaim alone decides with `searches`."""
    cluster = (*nodes(1, 1, prefix="a"), *nodes(1, 1, model="V100", prefix="a", start=1))
    cluster = (*cluster, *nodes(1, 1, pool="b", prefix="b"))
    work = [running(job("ba", "b"), "a0", [0], NOW_5 - 600), _borrowed("cb", "b0", 0, "c"), *mine]
    return run(snapshot(cluster, queues, work), replace(ALONE, max_victim_searches=searches), NOW_5)


def _a100_job(wid: str) -> Workload:
    return job(wid, "own", t=NOW_5, pools=("a", "b"), gpu_models=("A100",))


def test_a_reclaim_with_nothing_to_take_in_one_pool_goes_on_to_the_next() -> None:
    # In pool a own's A100 job finds no A100 free and nothing over a deserved quota (b
    # holds its own 1): it fails there without a search, and takes c's borrowed A100
    # back in pool b. A second job like it fails in a by the failure remembered there,
    # and own, at its deserved quota in b, takes nothing more.
    queues = [dept(), in_pools_a_b("own", 1, 1), in_pools_a_b("b", 1, 0), in_pools_a_b("c", 0, 0)]
    result = _nothing_in_a_then_b(queues, [_a100_job("w"), _a100_job("w2")], 256)
    assert (evicted(result), placed(result)) == ({"cb": RECLAIM}, {"w": [("b0", (0,))]})


def test_a_department_over_its_quota_is_no_leaf_to_take_borrowed_work_from() -> None:
    # As above, b in a department d2 that deserves nothing: d2 is over its quota in pool
    # a, b is not, so reclaim fails there without a search, and the cycle's one search
    # takes c's borrowed A100 back in pool b.
    queues = [
        Queue("d1", None, {}),
        Queue("d2", None, {}),
        replace(in_pools_a_b("own", 1, 1), parent_id="d1"),
        replace(in_pools_a_b("c", 0, 0), parent_id="d1"),
        replace(in_pools_a_b("b", 1, 0), parent_id="d2"),
    ]
    result = _nothing_in_a_then_b(queues, [_a100_job("w")], 1)
    assert (evicted(result), placed(result)) == ({"cb": RECLAIM}, {"w": [("b0", (0,))]})


def test_a_cycle_without_searches_left_reclaims_no_extra_pods_either() -> None:
    # As test_extra_pods_are_reclaimed_where_no_whole_workload_may_be, with no search for
    # the cycle: reclaim stops, its shrinking of extra pods too.
    e = replace(job("e", "b", pods=4, min_pods=1, elastic=True), preemptible=False)
    e = replace(e, placement=tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(4)))
    e = replace(e, started_at=NOW_5 - 600)
    queues = [dept(), project("own", deserved=1), project("b")]
    snap = snapshot(nodes(1, 4), queues, [e, job("w", "own", t=NOW_5)])
    for searches, resizes in ((1, [("e", -1, "w")]), (0, [])):
        result = run(snap, replace(ALONE, max_victim_searches=searches), now=NOW_5)
        assert [(x.workload_id, x.delta, x.beneficiary) for x in result.resizes] == resizes


def test_a_failed_reclaim_spends_no_search_on_a_request_like_it() -> None:
    # As test_a_failed_reclaim_is_remembered_for_its_own_pool_only, with two such jobs of
    # o1 and three searches: o1's first job spends two (above the fair shares, then
    # borrowed work) and finds no plan, its second is answered by that failure without a
    # search, and the third search serves o2's job in pool b.
    mine = [job(f"w1{x}", "o1", gpus=2, t=NOW_5 - 60 + i, pools=("a",)) for i, x in enumerate("ab")]
    mine.append(job("w2", "o2", gpus=2, t=NOW_5, pools=("b",)))
    result = run(_o1_in_a_o2_in_b(mine), replace(ALONE, max_victim_searches=3), now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"bb0": RECLAIM, "bb1": RECLAIM}, ["w2"])


def test_a_request_smaller_per_pod_than_a_failed_one_is_searched_again() -> None:
    # o1's 2-GPU job finds no plan in pool a; its gang of two 1-GPU pods, as large in all
    # but smaller per pod, takes both of b's jobs there.
    big = job("big", "o1", gpus=2, t=NOW_5 - 60, pools=("a",))
    gang = job("gang", "o1", pods=2, t=NOW_5, pools=("a",))
    result = run(_o1_in_a_o2_in_b([big, gang]), ALONE, now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"ba0": RECLAIM, "ba1": RECLAIM}, ["gang"])


def test_which_queues_may_give_gpus_up_is_worked_out_per_pool() -> None:
    # own's 2-GPU job may run in a or b. In a, c's borrowed jobs sit one per node beside
    # x's non-preemptible ones: no plan above the fair shares, nor in borrowed work (two
    # of the cycle's three searches). In b, b's two borrowed jobs share a node: the donors
    # of a (c) are not those of b (b), and the third search takes b's jobs back.
    in_b = [_borrowed(f"bb{i}", "b0", i) for i in range(2)]
    cluster = (*nodes(2, 2, prefix="a"), *nodes(1, 2, pool="b", prefix="b"))
    queues = [dept(), in_pools_a_b("own", 2, 2), in_pools_a_b("b", 0, 0), in_pools_a_b("c", 0, 0)]
    queues.append(in_pools_a_b("x", 2, 0))
    w = job("w", "own", gpus=2, t=NOW_5, pools=("a", "b"))
    snap = snapshot(cluster, queues, [*_scattered("c", "x"), *in_b, w])
    result = run(snap, replace(ALONE, max_victim_searches=3), now=NOW_5)
    assert (evicted(result), placed(result)) == (
        {"bb0": RECLAIM, "bb1": RECLAIM},
        {"w": [("b0", (0, 1))]},
    )


@FAST
@given(seeds)
@example(7)  # a project's own borrowed work was taken by its newcomer as a reclaim
def test_reclaim_never_evicts_work_of_the_beneficiarys_own_project(seed: int) -> None:
    # Reclaim, and preemption's taking of other projects' borrowed work, are between
    # projects: a project takes its own borrowed work back by preemption, for its own
    # reasons (a higher priority, or its guarantee over the borrowed work).
    snap = random_snapshot(seed)
    queue_of = {w.id: w.queue_id for w in snap.workloads}
    result = schedule(snap, SchedulerConfig(), NOW_5)
    for e in result.evictions:
        if e.reason == EvictionReason.RECLAIM:
            assert queue_of[e.workload_id] != queue_of[e.beneficiary], e


def test_work_within_its_guarantee_spends_no_search_where_nothing_is_borrowed() -> None:
    # own (deserved 2) holds g (1 GPU) within its quota and x (2) borrowed; its new job w
    # fits within the guarantee beside g. b is above its fair share (shares 1.71, 2.57
    # and 1.71 of 6, with c's 2-GPU job waiting) but within its deserved 4: it borrows
    # nothing, so preemption does not search b's work, and the cycle's one search takes
    # own's borrowed x back for w.
    own_work = [
        running(job("g", "own", t=1), "n0", [0], NOW_5 - 900),
        running(job("x", "own", gpus=2, t=2), "n0", [1, 2], NOW_5 - 800),
    ]
    b_work = [running(job(f"b{i}", "b", t=3 + i), "n0", [3 + i], NOW_5 - 700) for i in range(3)]
    waiting = [job("w", "own", t=NOW_5), job("c0", "c", gpus=2, t=NOW_5)]
    queues = [dept(), project("own", deserved=2), project("b", deserved=4)]
    queues.append(project("c", deserved=2))
    snap = snapshot(nodes(1, 6), queues, [*own_work, *b_work, *waiting])
    result = run(snap, SchedulerConfig(consolidate=False, max_victim_searches=1), now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({"x": str(EvictionReason.BORROWED)}, ["w"])


def test_the_fallback_takes_an_extra_pod_of_work_its_project_deserves() -> None:
    # b (deserved 2) runs its elastic job e first (2 pods, 1 beyond its minimum: within
    # the quota), then r (1 GPU: borrowed); it holds its fair share of 3, and only c's
    # non-preemptible work is above a share. Reclaim's fallback takes extra pods before
    # borrowed whole workloads, and every extra pod is borrowed room: e gives one up.
    e = job("e", "b", pods=2, min_pods=1, elastic=True, t=1)
    e = replace(e, placement=tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(2)))
    e = replace(e, started_at=NOW_5 - 900)
    r = running(job("r", "b", t=2), "n0", [2], NOW_5 - 800)
    c_work = [_fixed(f"c{i}", "n0", i + 3, "c") for i in (0, 1)]
    queues = [dept(), project("own", deserved=1), project("b", deserved=2, weight=3.0)]
    queues.append(project("c"))
    snap = snapshot(nodes(1, 5), queues, [e, r, *c_work, job("w", "own", t=NOW_5)])
    result = run(snap, ALONE, now=NOW_5)
    assert (evicted(result), list(placed(result))) == ({}, ["w"])
    assert [(x.workload_id, x.delta, x.beneficiary) for x in result.resizes] == [("e", -1, "w")]
