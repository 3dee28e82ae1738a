"""Allocation order and admission: rules that mutation testing found unguarded
(docs/engine.md, "Mutation testing", the fourth run)."""

from __future__ import annotations

import pytest

from scheduling.engine.types import Queue, Resource
from tests.engine.builders import dept, job, nodes, placed, project, quota, run, running, snapshot
from tests.engine.test_guarantee import _over_borrower


def test_equally_starved_projects_go_fewest_gpus_first() -> None:
    # pz holds 1 of its fair 2, pb 2 of its fair 4: the same ratio, under their quotas;
    # pz holds fewer GPUs and goes first, though its id sorts after pb's.
    work = [running(job("z0", "pz"), "n0", [0])]
    work += [running(job(f"b{i}", "pb"), "n0", [1 + i]) for i in range(2)]
    work += [job("zw", "pz", t=5.0), job("bw0", "pb", t=1.0), job("bw1", "pb", t=2.0)]
    queues = [dept(), project("pz", deserved=2), project("pb", deserved=4)]
    assert run(snapshot(nodes(1, 6), queues, work)).pending_order == ("zw", "bw0", "bw1")


@pytest.mark.parametrize("holds", [False, True])
def test_a_project_without_a_fair_share_goes_after_one_with_a_share(holds: bool) -> None:
    # pz (limit 0: no fair share) is first by id and by age, holding a GPU (started
    # before its limit was lowered) or nothing; pb, with a share, goes first and gets
    # the free GPU.
    work = [job("zw", "pz", t=0.0), job("bw", "pb", t=1.0)]
    if holds:
        work.append(running(job("z0", "pz"), "n0", [1]))
    queues = [dept(), project("pz", limit=0), project("pb")]
    result = run(snapshot(nodes(1, 2), queues, work))
    assert result.pending_order == ("bw", "zw")
    assert placed(result) == {"bw": [("n0", (0,))]}


def test_a_projects_standing_sums_its_gpus_over_every_pool() -> None:
    # pa holds 3 GPUs in pool a, pb 1; neither holds any in pool b, where one GPU is
    # free and both wait: pb, the less allocated over both pools, goes first.
    pools = {("a", Resource.GPU): quota(0), ("b", Resource.GPU): quota(0)}
    queues = [dept(), Queue("pa", "dept", pools), Queue("pb", "dept", pools)]
    work = [running(job(f"a{i}", "pa", pools=("a",)), "n0", [i]) for i in range(3)]
    work.append(running(job("b0", "pb", pools=("a",)), "n0", [3]))
    work += [job("aw", "pa", pools=("b",), t=0.0), job("bw", "pb", pools=("b",), t=1.0)]
    cluster = (*nodes(1, 4), *nodes(1, 1, pool="b", prefix="m"))
    result = run(snapshot(cluster, queues, work))
    assert result.pending_order == ("bw", "aw")
    assert placed(result) == {"bw": [("m0", (0,))]}


def _reclaim_for_one_of_two(two_departments: bool) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """6 GPUs on n0, full: d (no quota) holds 4 non-preemptible GPUs (2 of them pq2's
    with two departments) and one preemptible job, the only one reclaim may take; pr
    holds one. pq's and pr's jobs wait, one GPU each, within their quotas: the first in
    allocation order gets the reclaimed GPU. Returns what was placed."""
    work = [running(job(f"d{i}", "d", preemptible=False), "n0", [i]) for i in range(4)]
    work += [
        running(job("dv", "d"), "n0", [4]),
        running(job("r0", "pr", preemptible=False), "n0", [5]),
    ]
    if two_departments:
        # A holds 2 GPUs of its deserved 3 (pq none of its 1), B 1 of its 2 (pr's): B,
        # and so pr, go first, though pq is the more starved project and waits longer.
        work[:2] = [running(job(f"q{i}", "pq2", preemptible=False), "n0", [i]) for i in range(2)]
        queues = [
            dept("A", deserved=3),
            dept("B", deserved=2),
            dept("D"),
            project("pq", dept="A", deserved=1),
            project("pq2", dept="A", deserved=2),
            project("pr", dept="B", deserved=2),
            project("d", dept="D"),
        ]
        waiting = [job("qw", "pq", t=0.0), job("rw", "pr", t=1.0)]
    else:
        # pq holds none of its deserved 1, pr 1 of its 2: pq goes first, though pr waits
        # longer.
        queues = [dept(), project("pq", deserved=1), project("pr", deserved=2), project("d")]
        waiting = [job("qw", "pq", t=1.0), job("rw", "pr", t=0.0)]
    return placed(run(snapshot(nodes(1, 6), queues, [*work, *waiting])))


@pytest.mark.parametrize(("two_departments", "first"), [(False, "qw"), (True, "rw")])
def test_reclaim_serves_the_waiting_work_in_allocation_order(
    two_departments: bool, first: str
) -> None:
    assert _reclaim_for_one_of_two(two_departments) == {first: [("n0", (4,))]}


def test_a_workload_that_fits_no_pool_is_told_why_in_each_and_one_with_no_pool_so() -> None:
    pools = {("a", Resource.GPU): quota(1), ("b", Resource.GPU): quota(1)}
    two = job("two", "p", gpus=2, pools=("a", "b"))
    nowhere = job("nowhere", "p", pools=("zz",))
    cluster = (*nodes(1, 1), *nodes(1, 1, pool="b", prefix="m"))
    result = run(snapshot(cluster, [dept(), Queue("p", "dept", pools)], [two, nowhere]))
    assert result.pending_reasons == {
        "two": "needs 2 GPUs in pool a; 1 is free; needs 2 GPUs in pool b; 1 is free",
        "nowhere": "no node pool allowed for this workload",
    }


def test_the_borrowing_bar_names_the_projects_fair_share() -> None:
    reason = run(_over_borrower(waiting=True), now=100_000.0).pending_reasons["m4"]
    assert reason == (
        "project p1 holds more than 2 x its fair share of 2 GPUs in pool a"
        " while other queues wait below theirs"
    )


def test_a_project_may_fill_its_deserved_quota_past_twice_its_fair_share() -> None:
    # 8 GPUs; quotas of 4 (p) and 20 (q) scaled to the pool: p's fair share is 1.33.
    # q holds 4 and waits below its share for 16 GPUs that cannot fit; p holds 2 and
    # asks 2 more: past twice its share, but within its deserved 4, so it starts.
    work = [
        running(job("p0", "p", gpus=2), "n0", [0, 1]),
        running(job("q0", "q", gpus=4), "n0", [2, 3, 4, 5]),
        job("qw", "q", gpus=16, t=0.0),
        job("pw", "p", gpus=2, t=1.0),
    ]
    queues = [dept(), project("p", deserved=4), project("q", deserved=20)]
    result = run(snapshot(nodes(1, 8), queues, work))
    assert placed(result) == {"pw": [("n0", (6, 7))]}


def test_a_project_below_its_fair_share_is_not_barred_by_its_own_waiting() -> None:
    # p (weight 0.1: a fair share of 0.73 of the 8 GPUs q fills) asks 4: past twice its
    # share, but the only queue waiting below its share is p itself: it waits for room.
    work = [*(running(job(f"q{i}", "q"), "n0", [i]) for i in range(8)), job("pw", "p", gpus=4)]
    queues = [dept(), project("p", weight=0.1), project("q")]
    result = run(snapshot(nodes(1, 8), queues, work))
    assert result.pending_reasons == {"pw": "needs 4 GPUs in pool a; 0 are free"}


@pytest.mark.parametrize(
    ("gpus", "p_weight", "q_quota", "q_weight", "asks", "reason"),
    [
        # q holds 8, above its fair share of 7.27 (p's weight is 0.1: p's share is 0.73)
        (8, 0.1, 0.0, 1.0, 4, "needs 4 GPUs in pool a; 0 are free"),
        # q holds exactly its fair share, its deserved 8 with no over-quota weight (p's
        # share is the 2 left)
        (10, 1.0, 8.0, 0.0, 5, "needs 5 GPUs in pool a; 2 are free"),
    ],
)
def test_a_queue_waiting_at_or_above_its_fair_share_does_not_bar_borrowing(
    gpus: int, p_weight: float, q_quota: float, q_weight: float, asks: int, reason: str
) -> None:
    # q holds 8 GPUs and waits with one more job; p, holding nothing, asks for more than
    # twice its fair share, but nobody waits below theirs except p itself, so it is told
    # only that the GPUs are not free.
    work = [*(running(job(f"q{i}", "q"), "n0", [i]) for i in range(8)), job("qw", "q", t=0.0)]
    work.append(job("pw", "p", gpus=asks, t=1.0))
    queues = [
        dept(),
        project("p", weight=p_weight),
        project("q", deserved=q_quota, weight=q_weight),
    ]
    result = run(snapshot(nodes(1, gpus), queues, work))
    assert result.pending_reasons["pw"] == reason
