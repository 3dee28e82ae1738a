"""Reclaim, preempt, consolidate and stale gangs: who is evicted, why, and for whom."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from scheduling.engine.types import (
    CycleResult,
    Eviction,
    EvictionReason,
    PodPlacement,
    PodRequest,
    Queue,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tests.engine.builders import (
    cycles,
    dept,
    evicted,
    frac,
    job,
    nodes,
    placed,
    project,
    quota,
    run,
    running,
    sharing,
    snapshot,
)

NOW = 1000.0


def _borrowing_p2(count: int = 4, gpus: int = 1, **kw: Any) -> list[Workload]:
    """p2 running `count` jobs on n0, started 100 s apart (the last one most recently)."""
    return [
        running(
            job(f"b{i}", "p2", gpus=gpus, **kw),
            "n0",
            range(i * gpus, (i + 1) * gpus),
            started=100.0 * i,
        )
        for i in range(count)
    ]


def _two_projects(p1: float = 2, p2: float = 2) -> list[Queue]:
    return [dept(), project("p1", deserved=p1), project("p2", deserved=p2)]


def test_a_project_under_its_deserved_quota_takes_gpus_back_from_a_borrower() -> None:
    snap = snapshot(nodes(1, gpus=4), _two_projects(), [*_borrowing_p2(), job("mine", "p1")])
    result = run(snap, now=NOW)
    assert placed(result) == {"mine": [("n0", (3,))]}
    (eviction,) = result.evictions
    assert (eviction.workload_id, eviction.reason, eviction.beneficiary) == (
        "b3",
        EvictionReason.RECLAIM,
        "mine",
    )


def test_a_fraction_reclaims_room_on_a_shared_gpu_without_evicting_every_sharer() -> None:
    # p2 borrows all 4 GPUs: three whole, and the last in two half shares. p1 deserves 2
    # and asks a quarter (its 3-GPU job raises its fair share to 3 but cannot reclaim
    # past the deserved quota). Evicting one half makes room; p2 stays above its share
    # either way, and the search used to ask for a whole free device, so it evicted both.
    halves = [
        replace(
            frac(f"h{i}", "p2", 0.5),
            placement=(PodPlacement(0, "n0", shared_gpu=3, share=0.5),),
            started_at=100.0 * i,
        )
        for i in range(2)
    ]
    work = [*_borrowing_p2(3), *halves, frac("q", "p1", 0.25), job("big", "p1", gpus=3, t=1)]
    snap = snapshot(nodes(1, gpus=4), _two_projects(p1=2, p2=0), work)
    result = run(snap, now=NOW)
    assert evicted(result) == {"h1": "reclaim"}
    assert [(p.node_id, p.shared_gpu, p.share) for p in result.admissions[0].pods] == [
        ("n0", 3, 0.25)
    ]


def test_reclaim_prefers_the_victim_that_loses_the_least_work() -> None:
    # b1 checkpointed a moment ago: evicting it loses almost nothing.
    victims = _borrowing_p2()
    victims[1] = replace(victims[1], last_checkpoint_time=NOW - 1)
    snap = snapshot(nodes(1, gpus=4), _two_projects(), [*victims, job("mine", "p1")])
    assert evicted(run(snap, now=NOW)) == {"b1": "reclaim"}


def test_with_equal_loss_reclaim_takes_the_lowest_priority_first() -> None:
    victims = [replace(v, started_at=0.0, priority=10) for v in _borrowing_p2()]
    victims[2] = replace(victims[2], priority=1)
    snap = snapshot(nodes(1, gpus=4), _two_projects(), [*victims, job("mine", "p1")])
    assert evicted(run(snap, now=NOW)) == {"b2": "reclaim"}


def test_an_owner_takes_back_borrowed_work_larger_than_its_projects_quota() -> None:
    # p2 deserves 1 and holds two 2-GPU jobs: neither fits its quota, so both are
    # borrowed. p1 deserves 3 and wants 3: the first job goes above p2's fair share, and
    # the second too, although p2 is left with none (it used to keep one, and p1's third
    # job, within its guarantee, waited for ever behind work over p2's quota).
    result = _p1_owed_three(count=2, gpus=2)
    assert evicted(result) == {"b0": "reclaim", "b1": "reclaim"}
    assert sorted(placed(result)) == ["m0", "m1", "m2"]


def test_reclaim_leaves_the_victims_project_its_guaranteed_work() -> None:
    # As above with p2's jobs of 1 GPU: the one within p2's quota stays.
    result = _p1_owed_three(count=4, gpus=1)
    assert len(result.evictions) == 3 and sorted(placed(result)) == ["m0", "m1", "m2"]


def _p1_owed_three(count: int, gpus: int) -> CycleResult:
    """p1 (deserved 3) wants three 1-GPU jobs; p2 (deserved 1) holds the 4-GPU node."""
    work = [*_borrowing_p2(count=count, gpus=gpus), *(job(f"m{i}", "p1", t=i) for i in range(3))]
    return run(snapshot(nodes(1, gpus=4), _two_projects(p1=3, p2=1), work), now=NOW)


def test_the_fallback_leaves_a_project_below_its_quota_only_when_nothing_taken_fits_back() -> None:
    # v deserves 1 and runs a 1-GPU job started a minute ago and a 4-GPU job. o1 (deserved
    # 3) wants 1 GPU, then 2: the first reclaim takes v's small job (cheapest, above v's
    # fair share). Taking the 4-GPU job as well, in that cycle, would leave v at 0 with
    # the 1-GPU job owed back under its quota (it fits the room of 1): a reclaim the next
    # cycle. So it goes the next cycle, and v's small job comes back beside o1's two.
    small = running(job("s", "v", t=1), "n0", [0], started=NOW - 60)
    big = running(job("big", "v", gpus=4, t=2), "n0", [1, 2, 3, 4], started=NOW - 3600)
    o2 = [
        running(job(f"o2-{i}", "o2", t=3 + i), "n0", [5 + i], started=NOW - 3600) for i in range(3)
    ]
    queues = [
        dept(),
        project("o1", deserved=3),
        project("o2", deserved=4),
        project("v", deserved=1),
    ]
    work = [small, big, *o2, job("w1", "o1", t=NOW - 20), job("w2", "o1", gpus=2, t=NOW - 10)]
    steps = cycles(snapshot(nodes(1, gpus=8), queues, work), 3, start=NOW)
    assert [(evicted(r), sorted(placed(r))) for _, r in steps] == [
        ({"s": "reclaim"}, ["w1"]),
        ({"big": "reclaim"}, ["s", "w2"]),
        ({}, []),
    ]


def test_a_department_gives_up_what_its_project_holds_borrowed_whole() -> None:
    # One 8-GPU node. d1 (deserved 3) has o at 0 of its 3, wanting 3 GPUs; d2 (deserved
    # 5) has u (deserved 4, four 1-GPU jobs) and v (deserved 1, one 4-GPU job: borrowed
    # whole). Taking v's job leaves d2 at 4 of its 5, below its deserved quota only by
    # v's own shortfall: d2 has no guaranteed work to lose. o used to wait for ever
    # ("needs 3 GPUs in pool a; 0 are free"); now it takes v's job once, and it settles.
    snap = department_gap(u_jobs=4)
    steps = cycles(snap, 3, start=NOW)
    assert [(evicted(r), sorted(placed(r))) for _, r in steps] == [
        ({"v0": "reclaim"}, ["o0"]),
        ({}, []),
        ({}, []),
    ]


def test_a_department_keeps_its_deserved_quota_beyond_its_projects_shortfall() -> None:
    # As above with u at 2 of its 4: d2 holds 6 (u's 2, v's 4), 1 above its deserved 5,
    # and 2 GPUs are free. Taking v's job would leave d2 at 2, 3 below its quota while v
    # is only 1 below its own: the department keeps its quota beyond its project's
    # shortfall (its guarantee is the department's, not only its projects'), so o waits.
    snap = department_gap(u_jobs=2)
    result = run(snap, now=NOW)
    assert evicted(result) == {} and not placed(result)


def test_a_department_keeps_its_quota_where_its_project_keeps_its_own() -> None:
    # d2 (deserved 5) holds 6: u (deserved 3) two 1-GPU jobs, v (deserved 2) two 2-GPU
    # jobs, one of them borrowed (not whole: v keeps its 2 without it). w (d3) holds its
    # 1; 1 GPU is free. Taking v's borrowed job for o (deserved 2) would leave d2 at 4 of
    # its 5 while v is short of nothing: o waits (the department's quota is its own, as a
    # reclaim between departments in Run:ai stops at the victim department's quota).
    us = [running(job(f"u{i}", "u", t=i), "n0", [i], started=NOW - 3600) for i in range(2)]
    v = [
        running(
            job(f"v{i}", "v", gpus=2, t=5 + i), "n0", [2 + 2 * i, 3 + 2 * i], started=NOW - 3600
        )
        for i in range(2)
    ]
    w = running(job("w0", "w", t=7), "n0", [6], started=NOW - 3600)
    queues = [
        dept("d1", deserved=2),
        dept("d2", deserved=5),
        dept("d3", deserved=1),
        project("o", dept="d1", deserved=2),
        project("u", dept="d2", deserved=3),
        project("v", dept="d2", deserved=2),
        project("w", dept="d3", deserved=1),
    ]
    snap = snapshot(nodes(1, gpus=8), queues, [*us, *v, w, job("o0", "o", gpus=2, t=NOW)])
    result = run(snap, now=NOW)
    assert evicted(result) == {} and not placed(result)


def department_gap(u_jobs: int, now: float = NOW) -> Snapshot:
    """One 8-GPU node: d1 (deserved 3) with o at 0 of its 3, wanting 3 GPUs (o0); d2
    (deserved 5) with u (deserved 4) running `u_jobs` 1-GPU jobs and v (deserved 1)
    running one 4-GPU job, borrowed whole; all started an hour before `now`."""
    us = [running(job(f"u{i}", "u", t=i), "n0", [i], started=now - 3600) for i in range(u_jobs)]
    big = running(job("v0", "v", gpus=4, t=5), "n0", [4, 5, 6, 7], started=now - 3600)
    queues = [
        dept("d1", deserved=3),
        dept("d2", deserved=5),
        project("o", dept="d1", deserved=3),
        project("u", dept="d2", deserved=4),
        project("v", dept="d2", deserved=1),
    ]
    return snapshot(nodes(1, gpus=8), queues, [*us, big, job("o0", "o", gpus=3, t=now)])


def test_reclaim_takes_a_projects_lower_priority_work_before_its_urgent_job() -> None:
    # "low" borrows both GPUs: an old priority-0 job and an urgent job started 10 s ago,
    # which loses less. Taken, the urgent job would come back and preempt the old one
    # (priority decides inside a project): two evictions where one does. The owner's
    # reclaim takes the old job, and nothing is evicted after.
    old = running(job("old", "low", priority=0, t=1), "n0", [0], started=NOW - 600)
    urgent = running(job("urgent", "low", priority=100, t=2), "n0", [1], started=NOW - 10)
    queues = [dept(), project("own", deserved=2), project("low", deserved=0)]
    snap = snapshot(nodes(1, gpus=2), queues, [old, urgent, job("mine", "own", t=NOW)])
    steps = cycles(snap, 3, start=NOW)
    assert [evicted(result) for _, result in steps] == [{"old": "reclaim"}, {}, {}]
    assert "mine" in placed(steps[0][1])


def test_reclaim_never_evicts_non_preemptible_work() -> None:
    snap = snapshot(
        nodes(1, gpus=4), _two_projects(), [*_borrowing_p2(preemptible=False), job("mine", "p1")]
    )
    result = run(snap, now=NOW)
    assert result.evictions == ()
    assert result.pending_reasons["mine"] == "needs 1 GPU in pool a; 0 are free"


def test_a_project_already_at_its_deserved_quota_does_not_reclaim() -> None:
    mine = running(job("held", "p1", gpus=2), "n1", [0, 1])
    snap = snapshot(
        nodes(1, gpus=4) + nodes(1, gpus=2, start=1),
        _two_projects(),
        [*_borrowing_p2(), mine, job("more", "p1")],
    )
    assert run(snap, now=NOW).evictions == ()


def test_reclaim_does_not_flip_flop_over_fifty_cycles() -> None:
    # Both projects always want more than the cluster; p1 starts with everything. After
    # reclaim settles, nobody is evicted again and no pair ever reclaims back and forth.
    work = [running(job(f"p1-r{i}", "p1"), "n0", [i], started=0.0) for i in range(8)]
    work += [job(f"p1-w{i}", "p1", t=i) for i in range(8)]
    work += [job(f"p2-w{i}", "p2", t=i) for i in range(12)]
    snap = snapshot(nodes(1, gpus=8), _two_projects(p1=4, p2=4), work)
    steps = cycles(snap, 50, SchedulerConfig(), start=NOW)
    by_cycle = [len(result.evictions) for _, result in steps]
    directions: Counter[tuple[str, str]] = Counter()
    for before, result in steps:
        queue_of = {wl.id: wl.queue_id for wl in before.workloads}
        for e in result.evictions:
            directions[(queue_of[e.workload_id], queue_of[e.beneficiary or ""])] += 1
    assert by_cycle[0] == 4
    assert sum(by_cycle[1:]) == 0
    assert set(directions) == {("p1", "p2")}
    final = steps[-1][0]
    held = Counter(wl.queue_id for wl in final.workloads if wl.placement)
    assert held == {"p1": 4, "p2": 4}


def test_a_higher_priority_job_preempts_lower_priority_work_of_its_own_project() -> None:
    low = [running(job(f"low{i}", "p1", priority=1), "n0", [i], started=10.0 * i) for i in range(2)]
    snap = snapshot(
        nodes(1, gpus=2),
        [dept(), project("p1", deserved=2)],
        [*low, job("urgent", "p1", priority=100)],
    )
    result = run(snap, now=NOW)
    assert placed(result) == {"urgent": [("n0", (1,))]}
    assert [(e.workload_id, e.reason, e.beneficiary) for e in result.evictions] == [
        ("low1", EvictionReason.PREEMPT, "urgent")
    ]


def test_preemption_stays_inside_the_project() -> None:
    other = [running(job(f"o{i}", "p2", priority=1), "n0", [i]) for i in range(2)]
    snap = snapshot(
        nodes(1, gpus=2), _two_projects(p1=0, p2=2), [*other, job("urgent", "p1", priority=100)]
    )
    assert run(snap, now=NOW).evictions == ()


def test_equal_priority_never_preempts() -> None:
    low = [running(job(f"l{i}", "p1", priority=5), "n0", [i]) for i in range(2)]
    snap = snapshot(
        nodes(1, gpus=2), [dept(), project("p1", deserved=2)], [*low, job("same", "p1", priority=5)]
    )
    assert run(snap, now=NOW).evictions == ()


def test_a_minimum_runtime_protects_a_freshly_started_job() -> None:
    fresh = running(
        job("fresh", "p1", priority=1, priority_class="train"), "n0", [0], started=NOW - 30
    )
    snap = snapshot(
        nodes(1, gpus=1),
        [dept(), project("p1", deserved=1)],
        [fresh, job("urgent", "p1", priority=100)],
    )
    protected = SchedulerConfig(min_runtime_s={"train": 60.0})
    assert run(snap, protected, now=NOW).evictions == ()
    assert evicted(run(snap, SchedulerConfig(min_runtime_s={"train": 20.0}), now=NOW)) == {
        "fresh": "preempt"
    }


def test_consolidation_moves_a_job_to_free_a_whole_node() -> None:
    # 2 free GPUs on each node, and a 4-GPU job waiting: move one 2-GPU job over.
    work = [
        running(job("x", "p1", gpus=2), "n0", [0, 1], started=500.0),
        running(job("y", "p1", gpus=2), "n1", [0, 1], started=900.0),
        job("big", "p1", gpus=4),
    ]
    snap = snapshot(nodes(2, gpus=4), [dept(), project("p1", deserved=8)], work)
    result = run(snap, now=NOW)
    assert result.evictions == (Eviction("y", EvictionReason.CONSOLIDATE, "big", ""),)
    assert placed(result) == {"big": [("n1", (0, 1, 2, 3))], "y": [("n0", (2, 3))]}


def test_consolidation_does_nothing_unless_every_moved_job_finds_a_new_place() -> None:
    # Either job could leave its node for the big one, but neither fits next to the other:
    # each takes 6 of a node's 8 CPU cores.
    heavy = (PodRequest(gpus=2, cpu=6.0),)
    work = [
        running(Workload("x", "p1", heavy), "n0", [0, 1]),
        running(Workload("y", "p1", heavy), "n1", [0, 1]),
        job("big", "p1", gpus=4),
    ]
    cluster = tuple(replace(n, cpu=8.0) for n in nodes(2, gpus=4))
    snap = snapshot(cluster, [dept(), project("p1", deserved=8)], work)
    result = run(snap, now=NOW)
    assert result.evictions == ()
    assert result.admissions == ()
    assert result.pending_reasons["big"] == (
        "needs 4 GPUs on one node; largest free block in pool a is 2"
    )


@pytest.mark.parametrize(("y", "z"), [(0.3, 0.6), (0.25, 0.75)])
def test_consolidation_moves_a_fraction_to_open_room_for_a_bigger_one_on_a_shared_gpu(
    y: float, z: float
) -> None:
    # GPU 0 holds 0.5 + y (0.3: 0.2 free), GPU 1 holds z (0.6: 0.4 free): 0.6 free in total,
    # but no GPU has the 0.5 asked. Moving y onto GPU 1 leaves 0.5 on GPU 0. With 0.25 and
    # 0.75, both GPUs have 0.25 free: exactly the 0.5 asked, in total.
    work = [
        sharing("x", "p1", 0.5, 0, 100.0),
        sharing("y", "p1", y, 0, 900.0),
        sharing("z", "p1", z, 1, 100.0),
        frac("half", "p1", 0.5),
    ]
    snap = snapshot(nodes(1, gpus=2), [dept(), project("p1", deserved=2)], work)
    result = run(snap, now=NOW)
    assert evicted(result) == {"y": "consolidate"}
    shared = {a.workload_id: [(p.shared_gpu, p.share) for p in a.pods] for a in result.admissions}
    assert shared == {"half": [(0, 0.5)], "y": [(1, y)]}


def _moves_to_another_pool(b_limit: float | None) -> Any:
    # Pool a: v (2 GPUs, may also run in pool b) on n0; n1 and n2 have 1 free GPU each
    # beside non-preemptible work. A 4-GPU job fits on n0 only if v leaves, and v then
    # fits nowhere in pool a: only pool b's empty node m0 can take it.
    fixed = {"preemptible": False}
    work = [
        running(job("v", "p1", gpus=2, pools=("a", "b")), "n0", [0, 1]),
        running(job("b1", "p1", gpus=3, **fixed), "n1", [0, 1, 2]),
        running(job("b2", "p1", gpus=3, **fixed), "n2", [0, 1, 2]),
        job("big", "p1", gpus=4, pools=("a",)),
    ]
    quotas = {("a", Resource.GPU): quota(12), ("b", Resource.GPU): quota(0, limit=b_limit)}
    cluster = nodes(3, gpus=4) + nodes(1, gpus=4, pool="b", prefix="m")
    return run(snapshot(cluster, [dept(), Queue("p1", "dept", quotas)], work), now=NOW)


def test_consolidation_never_moves_a_job_into_a_pool_where_its_quota_forbids_it() -> None:
    result = _moves_to_another_pool(b_limit=0)
    assert result.evictions == ()
    assert result.allocations.get(("p1", "b", Resource.GPU), 0) == 0
    assert result.pending_reasons["big"] == (
        "needs 4 GPUs on one node; largest free block in pool a is 2"
    )


def test_consolidation_may_move_a_job_to_another_of_its_pools_when_its_quota_allows() -> None:
    result = _moves_to_another_pool(b_limit=None)
    assert evicted(result) == {"v": "consolidate"}
    assert placed(result) == {"big": [("n0", (0, 1, 2, 3))], "v": [("m0", (0, 1))]}


def _gang(degraded_since: float | None) -> Workload:
    pods = (PodRequest(gpus=1),) * 4
    placement = tuple(PodPlacement(i, "n0", gpus=(i,)) for i in range(3))
    return Workload(
        "gang", "p1", pods, placement=placement, started_at=0.0, degraded_since=degraded_since
    )


def test_a_gang_short_of_its_minimum_past_the_grace_period_is_evicted() -> None:
    snap = snapshot(
        nodes(1, gpus=4), [dept(), project("p1", deserved=4)], [_gang(degraded_since=NOW - 301)]
    )
    result = run(snap, SchedulerConfig(stale_gang_grace_s=300), now=NOW)
    (eviction,) = result.evictions
    assert (eviction.workload_id, eviction.reason) == ("gang", EvictionReason.STALE_GANG)
    assert eviction.detail == "3 of 4 pods running for 300 s or more"


def test_a_gang_short_of_its_minimum_within_the_grace_period_is_left_alone() -> None:
    snap = snapshot(
        nodes(1, gpus=4), [dept(), project("p1", deserved=4)], [_gang(degraded_since=NOW - 100)]
    )
    assert run(snap, SchedulerConfig(stale_gang_grace_s=300), now=NOW).evictions == ()


def test_reclaim_reaches_the_deserved_quota_when_fair_shares_are_not_whole_gpus() -> None:
    # 5 GPUs, deserved 2 / 1 / 1: the spare GPU splits into thirds, so p2 and p3 have fair
    # shares of 1.33 while holding 2 each. p1 still gets its 2 deserved GPUs.
    queues = [
        project("p1", None, deserved=2),
        project("p2", None, deserved=1),
        project("p3", None, deserved=1),
    ]
    held = [running(job(f"p2-{i}", "p2"), "n0", [i]) for i in range(2)]
    held += [running(job(f"p3-{i}", "p3"), "n0", [2 + i]) for i in range(2)]
    held += [running(job("p1-0", "p1"), "n0", [4])]
    more = [job(f"{q}-w{i}", q, t=i) for q in ("p1", "p2", "p3") for i in range(3)]
    result = run(snapshot(nodes(1, gpus=5), queues, [*held, *more]), now=NOW)
    assert result.fair_shares[("p2", "a", Resource.GPU)] == pytest.approx(4 / 3)
    assert len(result.evictions) == 1
    assert list(placed(result)) == ["p1-w0"]


def test_with_equal_loss_and_priority_reclaim_takes_the_most_recently_started() -> None:
    victims = [replace(v, last_checkpoint_time=NOW) for v in _borrowing_p2()]
    # All checkpointed just now (nothing to lose, same priority): the newest goes.
    snap = snapshot(nodes(1, gpus=4), _two_projects(), [*victims, job("mine", "p1")])
    assert evicted(run(snap, now=NOW)) == {"b3": "reclaim"}


def test_reclaim_across_departments_keeps_the_other_department_at_its_fair_share() -> None:
    # d1 deserves 3 of 4 GPUs, d2 deserves 1. Inside d2, p2 deserves nothing and borrows
    # all 4; p1 in d1 takes back 3, the most d2 can give without dropping below its share.
    queues = [
        dept("d1", deserved=3),
        dept("d2", deserved=1),
        project("p1", "d1", deserved=3),
        project("p2", "d2", deserved=0),
    ]
    work = [*_borrowing_p2(), *(job(f"m{i}", "p1", t=i) for i in range(4))]
    result = run(snapshot(nodes(1, gpus=4), queues, work), now=NOW)
    assert result.fair_shares[("d2", "a", Resource.GPU)] == 1
    assert sorted(evicted(result)) == ["b1", "b2", "b3"]
    assert sorted(placed(result)) == ["m0", "m1", "m2"]


def test_consolidation_moves_a_gang_whole_to_free_a_block() -> None:
    # Each node holds a pinned 2-GPU job and one pod of a 2-pod gang: a GPU free on each,
    # no node with 2. The gang moves whole (both pods restart together) onto one node, and the
    # 2-GPU job waiting takes the other node's pair.
    gang = replace(
        job("g", "p1", gpus=1, pods=2),
        placement=(PodPlacement(0, "n0", gpus=(2,)), PodPlacement(1, "n1", gpus=(2,))),
        started_at=900.0,
    )
    work = [
        running(job("x", "p1", gpus=2, preemptible=False), "n0", [0, 1]),
        running(job("y", "p1", gpus=2, preemptible=False), "n1", [0, 1]),
        gang,
        job("pair", "p1", gpus=2),
    ]
    snap = snapshot(nodes(2, gpus=4), [dept(), project("p1", deserved=8)], work)
    result = run(snap, now=NOW)
    assert evicted(result) == {"g": "consolidate"}
    where = placed(result)
    ((pair_node, pair_gpus),) = where["pair"]
    gang_nodes = {node for node, _ in where["g"]}
    assert pair_gpus == (2, 3) and len(gang_nodes) == 1 and pair_node not in gang_nodes
    assert sorted(gpus for _, gpus in where["g"]) == [(2,), (3,)]
