"""Reclaim rules that mutation testing found unguarded (docs/engine.md, "Mutation
testing")."""

from __future__ import annotations

from scheduling.engine.types import EvictionReason
from tests.engine.builders import dept, evicted, job, nodes, placed, project, run, running, snapshot


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
