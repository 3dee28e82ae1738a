"""The guarantee's split of a project's running work: rules that mutation testing found
unguarded (docs/engine.md, "Mutation testing")."""

from __future__ import annotations

from scheduling.engine.types import EvictionReason, Queue, Resource
from tests.engine.builders import dept, evicted, job, nodes, placed, quota, run, running, snapshot

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
