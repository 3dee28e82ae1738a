"""The guarantee's split of a project's running work: rules that mutation testing found
unguarded (docs/engine.md, "Mutation testing")."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import EvictionReason, PodPlacement, Queue, Resource
from tests.engine.builders import (
    dept,
    evicted,
    job,
    nodes,
    placed,
    project,
    quota,
    run,
    running,
    snapshot,
)

NOW = 100_000.0
BORROWED = str(EvictionReason.BORROWED)


def _p1_in_two_pools(*p1_work: object) -> dict[str, str]:
    """Pool a: 16 GPUs on n0, n1 (p2, quota 12, fills n1); pool b: 2 GPUs on m0. p1 has
    a quota of 4 in pool a and 2 in pool b, runs an 8-GPU job on n0 (borrowed) and the
    work given, and submits a 4-GPU job for pool a. Returns the evictions."""
    big = running(job("big", "p1", gpus=8, t=10.0), "n0", range(8), started=NOW - 3600)
    theirs = [running(job(f"o{i}", "p2"), "n1", [i], started=NOW - 3600) for i in range(8)]
    p1 = Queue(
        "p1",
        "dept",
        {("a", Resource.GPU): quota(deserved=4), ("b", Resource.GPU): quota(deserved=2)},
    )
    p2 = Queue("p2", "dept", {("a", Resource.GPU): quota(deserved=12)})
    small = job("small", "p1", gpus=4, t=NOW - 60, pools=("a",))
    cluster = (*nodes(2), *nodes(1, gpus=2, pool="b", prefix="m"))
    snap = snapshot(cluster, [dept(), p1, p2], [big, *theirs, *p1_work, small])  # type: ignore[list-item]
    result = run(snap, now=NOW)
    if result.evictions:
        assert list(placed(result)) == ["small"]
    return evicted(result)


def test_work_of_the_project_in_another_pool_does_not_end_the_split() -> None:
    # p1's older job in pool b holds nothing in pool a: it is passed over, and the 8-GPU
    # job after it is still found borrowed in pool a.
    elsewhere = running(job("elsewhere", "p1", t=0.0, pools=("b",)), "m0", [0], started=0.0)
    assert _p1_in_two_pools(elsewhere) == {"big": BORROWED}


def test_without_work_elsewhere_the_borrowed_job_is_taken_back() -> None:
    assert _p1_in_two_pools() == {"big": BORROWED}


def test_an_admission_that_evicts_nothing_renews_the_split() -> None:
    # p1 (quota 4) runs g (3 GPUs, guaranteed) and e (elastic, 2 pods, borrowed: 3 + 2 >
    # 4). s1 takes e's extra pod, which evicts nothing; e then fits beside g (3 + 1) and
    # is guaranteed, so s2, of the same priority, may not evict it.
    g = running(job("g", "p1", gpus=3, t=0.0), "n0", range(3), started=0.0)
    e = replace(
        job("e", "p1", pods=2, t=1.0, elastic=True, min_pods=1),
        placement=(PodPlacement(0, "n0", gpus=(3,)), PodPlacement(1, "n0", gpus=(4,))),
        started_at=0.0,
    )
    theirs = running(job("o", "p2", gpus=3), "n0", range(5, 8), started=0.0)
    queues = [dept(), project("p1", deserved=4), project("p2", deserved=4)]
    work = [g, e, theirs, job("s1", "p1", t=NOW - 60), job("s2", "p1", t=NOW - 50)]
    result = run(snapshot(nodes(1), queues, work), now=NOW)
    assert list(placed(result)) == ["s1"]
    assert result.evictions == ()


def test_a_workload_evicted_earlier_in_a_plan_does_not_end_the_split() -> None:
    # p1 (quota 4) borrows with a 6-GPU job; p2 (quota 8, above its fair share of 8.5)
    # runs g (8 GPUs, guaranteed) and b1, b2 (borrowed). p1's 2-GPU job takes b1 (the
    # cheapest), then b2: asked after b1's eviction, the split still finds b2 borrowed,
    # so p1 does not fall back on its own 6-GPU job.
    big = running(job("big", "p1", gpus=6, t=1.0), "n0", range(6), started=NOW - 3600)
    b1 = running(job("b1", "p2", t=1.0), "n0", [6], started=NOW - 60)
    b2 = running(job("b2", "p2", t=2.0), "n0", [7], started=NOW - 3600)
    g = running(job("g", "p2", gpus=8, t=0.0), "n1", range(8), started=NOW - 3600)
    queues = [project("p1", None, deserved=4, weight=7), project("p2", None, deserved=8)]
    work = [big, b1, b2, g, job("s", "p1", gpus=2, t=NOW - 60)]
    result = run(snapshot(nodes(2), queues, work), now=NOW)
    assert evicted(result) == {"b1": "reclaim", "b2": "reclaim"}
    assert placed(result) == {"s": [("n0", (6, 7))]}
