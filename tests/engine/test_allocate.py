"""Allocate: who goes first, and what a quota lets through."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import Queue, Quota, Resource, SchedulerConfig
from tests.engine.builders import dept, job, nodes, placed, project, run, running, snapshot

G = Resource.GPU


def test_starved_projects_take_turns_until_each_has_its_fair_share() -> None:
    pending = [job(f"p1-{i}", "p1", t=i) for i in range(4)] + [
        job(f"p2-{i}", "p2", t=10 + i) for i in range(2)
    ]
    snap = snapshot(
        nodes(1, gpus=4), [dept(), project("p1", deserved=2), project("p2", deserved=2)], pending
    )
    result = run(snap)
    assert sorted(placed(result)) == ["p1-0", "p1-1", "p2-0", "p2-1"]
    assert result.fair_shares[("p1", "a", G)] == 2
    assert result.pending_reasons == {
        "p1-2": "needs 1 GPU in pool a; 0 are free",
        "p1-3": "needs 1 GPU in pool a; 0 are free",
    }


def test_a_project_under_its_deserved_quota_goes_before_one_above_it() -> None:
    busy = running(job("busy", "p1"), "n0", [0])
    snap = snapshot(
        nodes(1, gpus=2),
        [dept(), project("p1", deserved=1), project("p2", deserved=1)],
        [busy, job("p1-late", "p1", t=0), job("p2-new", "p2", t=50)],
    )
    assert list(placed(run(snap))) == ["p2-new"]


def test_inside_a_project_higher_priority_goes_before_older_work() -> None:
    snap = snapshot(
        nodes(1, gpus=1),
        [dept(), project("p1", deserved=1)],
        [job("old-low", "p1", t=0, priority=0), job("new-high", "p1", t=99, priority=100)],
    )
    result = run(snap)
    assert list(placed(result)) == ["new-high"]
    assert "old-low" in result.pending_reasons


def test_same_priority_goes_by_submit_time() -> None:
    snap = snapshot(
        nodes(1, gpus=1),
        [dept(), project("p1", deserved=1)],
        [job("second", "p1", t=5), job("first", "p1", t=1)],
    )
    assert list(placed(run(snap))) == ["first"]


def test_a_project_at_its_limit_waits_with_the_reason() -> None:
    snap = snapshot(
        nodes(1, gpus=8, pool="a100"),
        [dept(), Queue("ml-vision", "dept", {("a100", G): Quota(2, limit=2)})],
        [
            running(job("r1", "ml-vision"), "n0", [0]),
            running(job("r2", "ml-vision"), "n0", [1]),
            job("more", "ml-vision"),
        ],
    )
    result = run(snap)
    assert placed(result) == {}
    assert (
        result.pending_reasons["more"] == "project ml-vision is at its limit of 2 GPUs in pool a100"
    )


def test_a_project_that_may_not_borrow_stops_at_its_deserved_quota() -> None:
    snap = snapshot(
        nodes(1, gpus=8),
        [dept(), project("p1", deserved=2, over_quota_allowed=False)],
        [job(f"j{i}", "p1", t=i) for i in range(4)],
    )
    result = run(snap)
    assert sorted(placed(result)) == ["j0", "j1"]
    assert (
        result.pending_reasons["j2"] == "project p1 may not go over its quota of 2 GPUs in pool a"
    )


def test_a_department_limit_binds_all_its_projects() -> None:
    snap = snapshot(
        nodes(1, gpus=8),
        [dept(limit=3), project("p1", deserved=2), project("p2", deserved=2)],
        [job("a", "p1", gpus=2), job("b", "p2", gpus=2, t=1)],
    )
    result = run(snap)
    assert list(placed(result)) == ["a"]
    assert result.pending_reasons["b"] == "department dept is at its limit of 3 GPUs in pool a"


def test_pools_are_tried_in_the_workload_order_of_preference() -> None:
    cluster = nodes(1, gpus=2, pool="a") + nodes(1, gpus=2, pool="b", prefix="m")
    queues = [dept(), project("p1", deserved=4)]
    snap = snapshot(cluster, queues, [job(f"j{i}", "p1", t=i, pools=("b", "a")) for i in range(3)])
    assert placed(run(snap)) == {
        "j0": [("m0", (0,))],
        "j1": [("m0", (1,))],
        "j2": [("n0", (0,))],
    }


def test_a_gpu_model_constraint_skips_other_models() -> None:
    cluster = nodes(1, gpus=2, model="A100") + nodes(1, gpus=2, model="H100", prefix="h")
    snap = snapshot(
        cluster,
        [dept(), project("p1", deserved=4)],
        [job("needs-h100", "p1", gpu_models=("H100",))],
    )
    assert placed(run(snap)) == {"needs-h100": [("h0", (0,))]}


def test_a_missing_gpu_model_is_named_in_the_reason() -> None:
    snap = snapshot(
        nodes(1), [dept(), project("p1", deserved=4)], [job("j", "p1", gpu_models=("B200",))]
    )
    assert run(snap).pending_reasons["j"] == "pool a has no GPU of B200"


def test_an_unschedulable_node_gets_nothing() -> None:
    cluster = nodes(2, gpus=1)
    cluster = (replace(cluster[0], schedulable=False), cluster[1])
    snap = snapshot(
        cluster, [dept(), project("p1", deserved=2)], [job("a", "p1"), job("b", "p1", t=1)]
    )
    result = run(snap)
    assert placed(result) == {"a": [("n1", (0,))]}


def test_a_big_pod_waits_for_a_node_with_a_block_that_large() -> None:
    cluster = nodes(2, gpus=4)
    snap = snapshot(
        cluster,
        [dept(), project("p1", deserved=8)],
        [
            running(job("x", "p1", gpus=2), "n0", [0, 1]),
            running(job("y", "p1", gpus=2), "n1", [0, 1]),
            job("big", "p1", gpus=3, preemptible=False),
        ],
    )
    result = run(snap, SchedulerConfig(consolidate=False))
    assert (
        result.pending_reasons["big"]
        == "needs 3 GPUs on one node; largest free block in pool a is 2"
    )


def test_a_workload_whose_minimum_exceeds_its_pods_is_explained_not_placed() -> None:
    snap = snapshot(
        nodes(1),
        [dept(), project("p1", deserved=8)],
        [job("odd", "p1", pods=2, min_pods=3), job("empty", "p1", pods=0)],
    )
    result = run(snap)
    assert result.admissions == ()
    assert result.pending_reasons == {
        "empty": "asks for 0 pods but needs 0 to start",
        "odd": "asks for 2 pods but needs 3 to start",
    }
