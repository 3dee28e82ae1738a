"""Consolidation: rules that mutation testing found unguarded (docs/engine.md, "Mutation
testing")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.engine.actions.consolidate import MAX_ATTEMPTS
from scheduling.engine.types import PodPlacement, SchedulerConfig, Workload
from tests.engine.builders import (
    dept,
    evicted,
    frac,
    job,
    nodes,
    placed,
    project,
    run,
    running,
    snapshot,
)

NOW = 100_000.0


def _hopeless_then_movable(
    hopeless: int, config: SchedulerConfig | None = None, decoy: Workload | None = None
) -> set[str]:
    """Pool a: 2 nodes of 4 GPUs, each holding 2 non-preemptible jobs, and `hopeless`
    waiting 4-GPU jobs (4 GPUs free in total, on no node, and nothing may move). Pool b:
    2 nodes of 2 GPUs, each holding one preemptible job, and the last waiting job asks
    for 2 GPUs on one node: moving one job makes room. Pool c: one GPU, held by a
    non-preemptible job. A decoy waits between them. Returns what was placed."""
    fixed = [
        running(job(f"f{n}{i}", "p1", preemptible=False), f"n{n}", [i], started=0.0)
        for n in range(2)
        for i in range(2)
    ]
    movable = [running(job(f"v{n}", "p1"), f"m{n}", [0], started=0.0) for n in range(2)]
    waiting = [job(f"w{i:02}", "p1", gpus=4, t=i, pools=("a",)) for i in range(hopeless)]
    last = job("last", "p1", gpus=2, t=hopeless, pools=("b",))
    fixed.append(running(job("fc", "p1", preemptible=False), "c0", [0], started=0.0))
    cluster = (
        *nodes(2, gpus=4),
        *nodes(2, gpus=2, pool="b", prefix="m"),
        *nodes(1, gpus=1, pool="c", prefix="c"),
    )
    work: list[Workload] = [*fixed, *movable, *waiting, last, *([decoy] if decoy else [])]
    result = run(snapshot(cluster, [dept(), project("p1")], work), config, now=NOW)
    return set(placed(result))


def test_consolidation_tries_as_many_plans_as_it_may() -> None:
    # 31 plans fail first: the 32nd, the last one allowed, still moves a job.
    assert _hopeless_then_movable(MAX_ATTEMPTS - 1) == {"last", "v0"}


def test_consolidation_stops_after_its_plans_per_cycle() -> None:
    # 32 plans fail first: a 33rd is not tried, though it would have worked.
    assert _hopeless_then_movable(MAX_ATTEMPTS) == set()


@pytest.mark.parametrize(("moves", "moved"), [(1, {"last", "v0"}), (0, set())])
def test_a_limit_of_one_move_still_consolidates_and_of_none_turns_it_off(
    moves: int, moved: set[str]
) -> None:
    config = SchedulerConfig(max_consolidation_moves=moves)
    assert _hopeless_then_movable(0, config) == moved


@pytest.mark.parametrize(
    "decoy",
    [
        # asks for a GPU model pool a does not have
        job("decoy", "p1", t=MAX_ATTEMPTS - 1.5, pools=("a",), gpu_models=("H100",)),
        # more GPUs than pool a has free, after 4-GPU jobs that fit there in total
        job("decoy", "p1", gpus=5, t=MAX_ATTEMPTS - 1.5, pools=("a",)),
        # a fraction of a GPU in pool c, which has neither a free GPU nor a shared one
        frac("decoy", "p1", 0.5, t=MAX_ATTEMPTS - 1.5, pools=("c",)),
    ],
)
def test_work_the_free_gpus_cannot_hold_in_total_spends_no_plan(decoy: Workload) -> None:
    # The decoy waits on capacity but no move could place it: it is not tried, so the
    # last job still gets the 32nd plan.
    assert _hopeless_then_movable(MAX_ATTEMPTS - 1, decoy=decoy) == {"last", "v0"}


def test_a_pool_without_room_in_total_is_passed_over_for_the_next_one() -> None:
    # Pool a is full; pool b, the job's second pool, has room once a job moves.
    fixed = [running(job(f"f{i}", "p1", preemptible=False), "n0", [i]) for i in range(2)]
    movable = [running(job(f"v{n}", "p1"), f"m{n}", [0]) for n in range(2)]
    last = job("last", "p1", gpus=2, pools=("a", "b"))
    cluster = (*nodes(1, gpus=2), *nodes(2, gpus=2, pool="b", prefix="m"))
    result = run(snapshot(cluster, [dept(), project("p1")], [*fixed, *movable, last]))
    assert set(placed(result)) == {"last", "v0"}


def test_one_consolidation_does_not_end_the_phase() -> None:
    # Pool b: 4 nodes of 2 GPUs with one job each; two jobs of 2 GPUs each get a node.
    movable = [running(job(f"v{n}", "p1"), f"m{n}", [0], started=0.0) for n in range(4)]
    waiting = [job(f"w{i}", "p1", gpus=2, t=i) for i in range(2)]
    cluster = nodes(4, gpus=2, pool="b", prefix="m")
    result = run(snapshot(cluster, [dept(), project("p1", pool="b")], [*movable, *waiting]))
    assert {"w0", "w1"} <= set(placed(result))
    assert len(evicted(result)) == 2


def _two_fragmented_pools(b_movable: bool) -> tuple[dict[str, str], set[str]]:
    """Pools b (nodes v0, v1) and a (u0, u1): 2 GPUs a node, a 1-GPU job named after its
    node on each (in pool b preemptible only if `b_movable`). A 2-GPU job allows pool
    b, then pool a. Returns the evictions and what was placed."""
    work = [
        running(job(f"{p}{n}", "p1", preemptible=p == "u" or b_movable), f"{p}{n}", [0])
        for p in ("v", "u")
        for n in range(2)
    ]
    cluster = (*nodes(2, gpus=2, pool="b", prefix="v"), *nodes(2, gpus=2, prefix="u"))
    last = job("last", "p1", gpus=2, pools=("b", "a"))
    result = run(snapshot(cluster, [dept(), project("p1")], [*work, last]))
    return evicted(result), set(placed(result))


def test_a_kept_plan_ends_the_workloads_turn() -> None:
    # Room made in pool b: pool a is not tried as well (the job would be placed twice).
    assert _two_fragmented_pools(b_movable=True) == ({"v0": "consolidate"}, {"last", "v0"})


def test_a_pool_where_no_plan_exists_is_passed_over_for_the_next_one() -> None:
    # Nothing in pool b may move: the plan is made in pool a.
    assert _two_fragmented_pools(b_movable=False) == ({"u0": "consolidate"}, {"last", "u0"})


def _extras_on_two_nodes(config: SchedulerConfig) -> tuple[list[int], list[str]]:
    """Three nodes of 4 GPUs: a non-preemptible elastic service runs its minimum pod on n1 (beside
    a rigid 2-GPU job) and an extra pod on n0 and on n2. Two 4-GPU jobs wait: each
    fits once one extra pod is taken. Returns the pods taken and the admitted workloads."""
    pods = tuple(PodPlacement(i, node, gpus=(0,)) for i, node in enumerate(["n1", "n0", "n2"]))
    svc = replace(
        job("svc", "p", pods=3, min_pods=1, elastic=True, preemptible=False),
        placement=pods,
        started_at=100.0,
    )
    rigid = running(job("s", "p", gpus=2, preemptible=False), "n1", [1, 2], started=100)
    waiting = [job(f"w{i}", "p", gpus=4, t=500 + i) for i in range(2)]
    snap = snapshot(nodes(3, 4), [dept(), project("p", deserved=12)], [svc, rigid, *waiting])
    result = run(snap, config)
    taken = sorted(pod for r in result.resizes for pod in r.removed)
    return taken, [a.workload_id for a in result.admissions]


def test_extra_pods_taken_for_one_job_do_not_end_the_phase() -> None:
    assert _extras_on_two_nodes(SchedulerConfig(preempt=False)) == ([1, 2], ["w0", "w1"])


def test_a_limit_of_no_moves_takes_no_extra_pods_either() -> None:
    config = SchedulerConfig(preempt=False, max_consolidation_moves=0)
    assert _extras_on_two_nodes(config) == ([], [])


def test_a_pool_where_the_queue_may_not_borrow_is_passed_over_for_the_next_one() -> None:
    # p1 holds 5 of pool a's 8 GPUs, past twice its fair share there, while p2
    # waits below its own: p1 may not borrow more in pool a, so its job, which allows
    # pool a and then pool b, is consolidated in pool b.
    mine = [running(job(f"a{i}", "p1"), "n0", [i]) for i in range(5)]
    movable = [running(job(f"v{n}", "p1"), f"m{n}", [0]) for n in range(2)]
    theirs = [job(f"t{i}", "p2", gpus=4, t=i) for i in range(2)]
    last = job("last", "p1", gpus=2, t=5, pools=("a", "b"))
    cluster = (*nodes(1), *nodes(2, gpus=2, pool="b", prefix="m"))
    queues = [dept(), project("p1"), project("p2", deserved=6)]
    result = run(snapshot(cluster, queues, [*mine, *movable, *theirs, last]))
    assert placed(result)["last"] == [("m0", (0, 1))]
    assert evicted(result)["v0"] == "consolidate"


def test_a_plan_undone_for_a_moved_job_without_a_place_passes_to_the_next_pool() -> None:
    # Pool b: moving v0 (2 GPUs, pool b only) off m0 would make room, but its 2 GPUs
    # fit on no other node of pool b: that plan is undone and pool a's is made.
    work = [
        running(job("v0", "p1", gpus=2, pools=("b",)), "m0", [0, 1]),
        *(running(job(f"y{n}", "p1", preemptible=False), f"m{n}", [0]) for n in (1, 2)),
        *(running(job(f"u{n}", "p1"), f"u{n}", [0]) for n in range(2)),
        job("last", "p1", gpus=2, pools=("b", "a")),
    ]
    cluster = (*nodes(3, gpus=2, pool="b", prefix="m"), *nodes(2, gpus=2, prefix="u"))
    result = run(snapshot(cluster, [dept(), project("p1")], work))
    assert evicted(result) == {"u0": "consolidate"}
    assert placed(result) == {"last": [("u0", (0, 1))], "u0": [("u1", (1,))]}
