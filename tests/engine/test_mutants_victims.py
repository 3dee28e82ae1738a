"""Victim rules that mutation testing found unguarded (docs/engine.md, "Mutation testing"):
what a pending reason says while an eviction waits for victims' checkpoints, and where
the search makes room: which devices count as freed or as room for a fraction, cordoned
nodes, mixed pools, a gang's further pod. (A move's eviction record, with no detail, is
pinned in test_evictions.py.)"""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import (
    EvictionReason,
    Gpu,
    Node,
    PodPlacement,
    SchedulerConfig,
    Workload,
)
from tests.engine.builders import (
    GPU_MEMORY,
    dept,
    evicted,
    frac,
    in_pools_a_b,
    job,
    nodes,
    placed,
    project,
    run,
    running,
    sharing,
    snapshot,
)

INTERVAL = 600.0
WAITING = "; waiting about {} s for {}'s checkpoint before preempting it"


def _reason_while_waiting(now: float, lows: list[tuple[str, int, float, float | None]]) -> str:
    """p (quota 0) runs borrowed jobs on one 8-GPU node, given as (name, gpus, started
    at, last checkpoint at); p's urgent 8-GPU job needs all of them evicted. The victims'
    checkpoints are due (interval 600 s), so it waits: its pending reason."""
    work, first = [], 0
    for name, gpus, started, saved in lows:
        low = running(job(name, "p", gpus=gpus), "n0", range(first, first + gpus), started)
        work.append(replace(low, checkpoint_interval_s=INTERVAL, last_checkpoint_time=saved))
        first += gpus
    urgent = job("urgent", "p", gpus=8, priority=10, t=now - 60)
    result = run(snapshot(nodes(1), [dept(), project("p")], [*work, urgent]), now=now)
    assert result.evictions == ()
    return result.pending_reasons["urgent"]


def test_a_victim_that_never_saved_counts_its_checkpoint_from_its_start() -> None:
    now = 100_000.0
    reason = _reason_while_waiting(now, [("low", 8, now - 400, None)])
    assert reason.endswith(WAITING.format(200, "low"))


def test_a_victim_started_at_time_zero_counts_its_checkpoint_from_zero() -> None:
    reason = _reason_while_waiting(400.0, [("low", 8, 0.0, None)])
    assert reason.endswith(WAITING.format(200, "low"))


def test_a_checkpoint_due_in_under_half_a_second_is_said_to_be_0_s_away() -> None:
    now = 100_000.0
    reason = _reason_while_waiting(now, [("low", 8, now - 3600, now - 599.7)])
    assert reason.endswith(WAITING.format(0, "low"))


def test_the_reason_names_the_soonest_checkpoint_even_when_a_later_one_is_walked_after() -> None:
    # low-a is the cheaper victim (2 GPUs x 500 s unsaved, walked first), due in 100 s;
    # low-b (6 GPUs x 300 s) is due in 300 s.
    now = 100_000.0
    lows = [("low-a", 2, now - 3600, now - 500), ("low-b", 6, now - 3600, now - 300)]
    assert _reason_while_waiting(now, lows).endswith(WAITING.format(100, "low-a"))


def test_the_reason_names_the_cheapest_victim_when_two_checkpoints_are_due_together() -> None:
    now = 100_000.0
    lows = [("low-a", 2, now - 3600, now - 400), ("low-b", 6, now - 3600, now - 400)]
    assert _reason_while_waiting(now, lows).endswith(WAITING.format(200, "low-a"))


def test_room_on_a_device_of_a_model_the_fraction_may_not_use_does_not_stop_a_reclaim() -> None:
    # n0 has an A100, shared by p2's 0.75, and an H100 with room, which q may not use: q
    # (p1 deserves 1) reclaims the A100 from p2 (no share: weight 0).
    node = Node("n0", "a", (Gpu(0, "A100", GPU_MEMORY), Gpu(1, "H100", GPU_MEMORY)))
    work = [
        replace(
            frac("h", "p2", 0.75),
            placement=(PodPlacement(0, "n0", shared_gpu=0, share=0.75),),
            started_at=990.0,
        ),
        replace(
            frac("k", "p2", 0.25),
            placement=(PodPlacement(0, "n0", shared_gpu=1, share=0.25),),
            started_at=0.0,
        ),
        frac("q", "p1", 0.5, gpu_models=("A100",)),
    ]
    queues = [dept(), project("p1", deserved=1), project("p2", weight=0)]
    result = run(snapshot([node], queues, work), now=1000.0)
    assert evicted(result) == {"h": str(EvictionReason.RECLAIM)}
    assert [(a.workload_id, a.pods[0].shared_gpu) for a in result.admissions] == [("q", 0)]


def test_reclaim_evicts_the_victim_freeing_a_whole_block_not_a_cheaper_one_that_cannot() -> None:
    # p1 (deserves 2) needs 2 GPUs on one node. On n0, p2's cheapest job "a" holds one of
    # two GPUs next to the costly "c": evicting "a" leaves no room for the pod. On n1, "b"
    # holds both: it alone is evicted.
    work = [
        running(job("a", "p2"), "n0", [0], started=990.0),
        running(job("c", "p2"), "n0", [1], started=0.0),
        running(job("b", "p2", gpus=2), "n1", [0, 1], started=900.0),
        job("mine", "p1", gpus=2),
    ]
    queues = [dept(), project("p1", deserved=2), project("p2", weight=0)]
    result = run(snapshot(nodes(2, gpus=2), queues, work), now=1000.0)
    assert evicted(result) == {"b": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n1", (0, 1))]}


def _sharing(wid: str, queue: str, node: str, share: float, started: float) -> Workload:
    return replace(
        frac(wid, queue, share),
        placement=(PodPlacement(0, node, shared_gpu=0, share=share),),
        started_at=started,
    )


def test_a_fraction_reclaims_the_device_where_one_eviction_makes_room() -> None:
    # q (0.5) needs room on one device. On n0, p2's cheapest "h1" (0.25) shares the
    # device with "h3" (0.75): without h1 there is still no room. On n1, "h2" (0.75)
    # alone: evicting it makes room. Only h2 goes.
    work = [
        _sharing("h1", "p2", "n0", 0.25, started=990.0),
        _sharing("h3", "p2", "n0", 0.75, started=0.0),
        _sharing("h2", "p2", "n1", 0.75, started=900.0),
        frac("q", "p1", 0.5),
    ]
    queues = [dept(), project("p1", deserved=1), project("p2", weight=0)]
    result = run(snapshot(nodes(2, gpus=1), queues, work), now=1000.0)
    assert evicted(result) == {"h2": str(EvictionReason.RECLAIM)}
    assert [(a.workload_id, a.pods[0].node_id) for a in result.admissions] == [("q", "n1")]


def test_a_whole_gpu_job_reclaims_a_device_that_fractions_share() -> None:
    # p1's 1-GPU job: the only device is shared by p2's two halves; both are evicted.
    work = [
        _sharing("h1", "p2", "n0", 0.5, started=900.0),
        _sharing("h2", "p2", "n0", 0.5, started=990.0),
        job("mine", "p1"),
    ]
    queues = [dept(), project("p1", deserved=1), project("p2", weight=0)]
    result = run(snapshot(nodes(1, gpus=1), queues, work), now=1000.0)
    assert evicted(result) == {"h1": str(EvictionReason.RECLAIM), "h2": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n0", (0,))]}


def test_a_device_shared_with_work_that_stays_is_not_counted_as_freed() -> None:
    # n0's device is shared by p2's cheap half "h1" and p1's own half, which stays: evicting
    # h1 frees no whole device. p2's "w" owns n1's device: it alone is evicted.
    work = [
        _sharing("h1", "p2", "n0", 0.5, started=990.0),
        _sharing("own", "p1", "n0", 0.5, started=0.0),
        running(job("w", "p2"), "n1", [0], started=900.0),
        job("mine", "p1"),
    ]
    queues = [dept(), project("p1", deserved=2), project("p2", weight=0)]
    result = run(snapshot(nodes(2, gpus=1), queues, work), now=1000.0)
    assert evicted(result) == {"w": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n1", (0,))]}


def test_reclaim_evicts_nothing_on_a_cordoned_node() -> None:
    # p2's cheapest job runs on n0, which is cordoned: evicting it would make no room
    # there. Its job on n1 is evicted instead.
    n0, n1 = nodes(2, gpus=1)
    work = [
        running(job("cheap", "p2"), "n0", [0], started=990.0),
        running(job("dear", "p2"), "n1", [0], started=0.0),
        job("mine", "p1"),
    ]
    queues = [dept(), project("p1", deserved=1), project("p2", weight=0)]
    result = run(snapshot([replace(n0, schedulable=False), n1], queues, work), now=1000.0)
    assert evicted(result) == {"dear": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n1", (0,))]}


def test_reclaim_makes_room_on_a_node_without_every_model_of_a_mixed_pool() -> None:
    # The pool has an A100 node and an H100 node, each device held by p2; p1's job takes
    # either model: the cheapest victim, on the A100 node, is evicted.
    pool = (*nodes(1, gpus=1), *nodes(1, gpus=1, model="H100", start=1))
    work = [
        running(job("cheap", "p2"), "n0", [0], started=990.0),
        running(job("dear", "p2"), "n1", [0], started=0.0),
        job("mine", "p1"),
    ]
    queues = [dept(), project("p1", deserved=1), project("p2", weight=0)]
    result = run(snapshot(pool, queues, work), now=1000.0)
    assert evicted(result) == {"cheap": str(EvictionReason.RECLAIM)}
    assert placed(result) == {"mine": [("n0", (0,))]}


def test_a_gang_reclaims_room_for_a_further_pod_where_one_eviction_gives_it() -> None:
    # p1's gang of two 2-GPU pods. n0 has room for one pod, and p2's cheapest "a" (1 GPU)
    # beside a dear "x": evicting "a" alone leaves no room for the second pod. n1 is full;
    # evicting p2's "b" (2 GPUs) there gives it. Only "b" goes.
    work = [
        running(job("a", "p2"), "n0", [0], started=990.0),
        running(job("x", "p2"), "n0", [1], started=0.0),
        running(job("b", "p2", gpus=2), "n1", [0, 1], started=900.0),
        running(job("y", "p2", gpus=2), "n1", [2, 3], started=0.0),
        job("g", "p1", gpus=2, pods=2),
    ]
    queues = [dept(), project("p1", deserved=4), project("p2", weight=0)]
    result = run(snapshot(nodes(2, gpus=4), queues, work), now=1000.0)
    assert evicted(result) == {"b": str(EvictionReason.RECLAIM)}
    assert sorted(placed(result)["g"]) == [("n0", (2, 3)), ("n1", (0, 1))]


# make_room, the fifth run (docs/engine.md): what the search takes, and its bounds.

NOW_5 = 10_000.0


def test_a_fraction_reclaims_room_on_a_device_it_cannot_have_whole() -> None:
    # The one device holds c's guaranteed half (never a victim) and b's two borrowed
    # quarters: the owner's half fits once both quarters go, though no device can be
    # freed whole (a search for a whole device finds no plan, and the owner waits).
    c_half = replace(sharing("c-half", "c", 0.5, 0, NOW_5 - 3600), preemptible=False)
    quarters = [sharing(f"b{i}", "b", 0.25, 0, NOW_5 - 600) for i in range(2)]
    queues = [dept(), project("own", deserved=1), project("b"), project("c", deserved=0.5)]
    snap = snapshot(nodes(1, 1), queues, [c_half, *quarters, frac("w", "own", 0.5)])
    result = run(snap, now=NOW_5)
    assert evicted(result) == {"b0": "reclaim", "b1": "reclaim"}
    assert [a.workload_id for a in result.admissions] == ["w"]


def test_the_cycles_victim_searches_are_a_bound() -> None:
    # own's 2-GPU job may run in pool a or b. In a, b's borrowed jobs sit one per node
    # beside c's guaranteed ones: the search finds no plan. In b, b's two jobs share a
    # node: reclaimed there, on the third search. With two searches in the cycle, a's
    # failed ones spend them and b is not searched.
    work = [running(job(f"ba{i}", "b", t=i), f"a{i}", [0], NOW_5 - 600) for i in range(2)]
    work += [
        replace(running(job(f"c{i}", "c", t=i), f"a{i}", [1], NOW_5 - 600), preemptible=False)
        for i in range(2)
    ]
    work += [running(job(f"bb{i}", "b", t=i), "b0", [i], NOW_5 - 600) for i in range(2)]
    cluster = (*nodes(2, 2, prefix="a"), *nodes(1, 2, pool="b", prefix="b"))
    queues = [dept(), in_pools_a_b("own", 2, 2), in_pools_a_b("b", 0, 0), in_pools_a_b("c", 2, 0)]
    w = job("w", "own", gpus=2, t=NOW_5, pools=("a", "b"))
    snap = snapshot(cluster, queues, [*work, w])
    assert evicted(run(snap, now=NOW_5)) == {"bb0": "reclaim", "bb1": "reclaim"}
    assert run(snap, SchedulerConfig(max_victim_searches=3), now=NOW_5).evictions != ()
    assert run(snap, SchedulerConfig(max_victim_searches=2), now=NOW_5).evictions == ()


def test_a_search_may_take_exactly_its_most_victims() -> None:
    # A 64-GPU owner on a node of 64 one-GPU borrowed jobs: all 64 (MAX_VICTIMS) go.
    lows = [running(job(f"b{i:02}", "b", t=i), "n0", [i], NOW_5 - 600) for i in range(64)]
    queues = [dept(), project("own", deserved=64), project("b")]
    snap = snapshot(nodes(1, 64), queues, [*lows, job("w", "own", gpus=64)])
    result = run(snap, now=NOW_5)
    assert len(result.evictions) == 64
    assert [a.workload_id for a in result.admissions] == ["w"]


def test_work_admitted_but_not_started_is_the_cheapest_victim() -> None:
    # b's job admitted last cycle whose pod has not started has lost nothing yet.
    old = running(job("old", "b", t=0.0), "n0", [0], NOW_5 - 600)
    new = replace(running(job("new", "b", t=1.0), "n0", [1]), started_at=None)
    queues = [dept(), project("own", deserved=1), project("b")]
    result = run(snapshot(nodes(1, 2), queues, [old, new, job("w", "own")]), now=NOW_5)
    assert evicted(result) == {"new": "reclaim"}


def test_between_victims_that_lose_nothing_the_smaller_goes() -> None:
    # Both of p's low jobs checkpointed just now; its urgent job needs one GPU: the 1-GPU
    # job goes, not the 2-GPU one (which started later, the older tie-break).
    def saved(wl: Workload) -> Workload:
        return replace(wl, checkpoint_interval_s=1800.0, last_checkpoint_time=NOW_5)

    big = saved(running(job("big", "p", gpus=2, t=1.0), "n0", [0, 1], NOW_5 - 100))
    small = saved(running(job("small", "p", t=0.0), "n0", [2], NOW_5 - 200))
    urgent = job("urgent", "p", priority=10, t=NOW_5)
    result = run(snapshot(nodes(1, 3), [dept(), project("p")], [big, small, urgent]), now=NOW_5)
    assert evicted(result) == {"small": "preempt"}


def test_a_victim_whose_checkpoint_is_due_is_passed_over_for_the_next() -> None:
    # p's urgent 1-GPU job preempts over its quota: the cheaper low job's checkpoint is
    # due (it waits for that one), and the dearer one, which saves nothing, goes instead.
    due = replace(
        running(job("due", "p", t=0.0), "n0", [0], NOW_5 - 3600),
        checkpoint_interval_s=600.0,
        last_checkpoint_time=NOW_5 - 400,
    )
    dear = running(job("dear", "p", t=1.0), "n0", [1], NOW_5 - 3600)
    urgent = job("urgent", "p", priority=10, t=NOW_5 - 60)
    result = run(snapshot(nodes(1, 2), [dept(), project("p")], [due, dear, urgent]), now=NOW_5)
    assert evicted(result) == {"dear": "preempt"}


def _walked(singles: int) -> dict[str, str]:
    """b borrows every GPU: `singles` one-GPU nodes (one job each, cheapest first), then a
    two-GPU node whose two jobs are the dearest. The owner's 2-GPU job fits only there, so
    the search must walk every single first: what it evicts."""
    work = [
        running(job(f"s{i:03}", "b", t=i), f"s{i:03}", [0], NOW_5 - 10 * (i + 1))
        for i in range(singles)
    ]
    work += [running(job(f"pair{i}", "b", t=i), "p0", [i], NOW_5 - 10_000 - i) for i in range(2)]
    cluster = (*nodes(singles, 1, prefix="s"), *nodes(1, 2, prefix="p"))
    cluster = tuple(replace(n, id=f"s{int(n.id[1:]):03}") if n.id[0] == "s" else n for n in cluster)
    queues = [dept(), project("own", deserved=2), project("b")]
    snap = snapshot(cluster, queues, [*work, job("w", "own", gpus=2, t=NOW_5)])
    return evicted(run(snap, now=NOW_5))


def test_a_victim_search_walks_at_most_512_victims() -> None:
    # The pair's second job is the 512th usable victim walked: found. The 513th: not,
    # and the owner waits for a later cycle (the walk's bound keeps a cycle's time).
    assert _walked(510) == {"pair0": "reclaim", "pair1": "reclaim"}
    assert _walked(511) == {}
