"""Extra pods go back before whole workloads, inside a project too: preemption and
consolidation shrink elastic work first, and fractional extras are taken back like
whole ones (actions/elastic.py shrink_in_queue, shrink_to_defragment, _batch)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from scheduling.engine import schedule
from scheduling.engine.apply import apply_result
from scheduling.engine.types import (
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    Queue,
    Quota,
    SchedulerConfig,
    Snapshot,
    TopologyConstraint,
    Workload,
)
from tests.engine.builders import cycles, dept, evicted, job, nodes, project, run, running, snapshot
from tests.engine.test_elastic import NOW, _elastic, _extras, _size, assert_settles, seeds
from tests.engine.test_properties import _check_no_overcommit

G = "gpu"
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _grown(snap: Snapshot, now: float = NOW) -> Snapshot:
    return apply_result(snap, run(snap, now=now - 600), now - 600)


def test_preemption_takes_the_projects_newest_extra_pods_before_a_whole_lower_priority_job() -> (
    None
):
    # "low" (priority 0) may not take back the extras of e (priority 3); "h" (5) may.
    queues = [dept(), project("p", deserved=8, limit=8)]
    rigid = running(job("r", "p", gpus=2), "n0", [0, 1], started=100)
    e = _elastic("e", "p", 2, 6, priority=3)
    snap = _grown(snapshot(nodes(1, 8), queues, [rigid, e]))
    assert _size(snap, "e") == 6
    more = (job("low", "p", gpus=1, t=1), job("h", "p", gpus=2, priority=5, t=2))
    snap = replace(snap, workloads=(*snap.workloads, *more))
    result = run(snap)
    assert evicted(result) == {}
    [resize] = result.resizes
    assert (resize.workload_id, resize.removed, resize.beneficiary) == ("e", (4, 5), "h")
    assert [a.workload_id for a in result.admissions] == ["h"]


def test_a_waiting_job_takes_back_extras_of_its_projects_non_preemptible_service() -> None:
    # Nothing in the project may be evicted whole, but the service's extras run on idle
    # GPUs: a job of the same priority takes them back rather than wait behind them.
    queues = [dept(), project("p", deserved=4, limit=4)]
    svc = _elastic("svc", "p", 1, 4, preemptible=False)
    snap = _grown(snapshot(nodes(1, 4), queues, [svc]))
    assert _size(snap, "svc") == 4
    snap = replace(snap, workloads=(*snap.workloads, job("t", "p", gpus=2, t=500)))
    result = run(snap)
    assert [(r.removed, r.beneficiary) for r in result.resizes] == [((2, 3), "t")]
    assert [a.workload_id for a in result.admissions] == ["t"]


def _fractional(wid: str, queue: str, low: int, high: int, share: float = 0.5) -> Workload:
    pods = (PodRequest(gpu_fraction=share),) * high
    return Workload(wid, queue, pods, min_pods=low, elastic=True)


def test_reclaim_takes_fractional_extra_pods_until_a_whole_gpu_is_free() -> None:
    queues = [dept(), project("p", deserved=0), project("q", deserved=1)]
    snap = _grown(snapshot(nodes(1, 2), queues, [_fractional("e", "p", 1, 4)]))
    assert _size(snap, "e") == 4
    snap = replace(snap, workloads=(*snap.workloads, job("w", "q", gpus=1)))
    result = run(snap)
    assert evicted(result) == {}
    [resize] = result.resizes
    assert (resize.removed, resize.beneficiary) == ((2, 3), "w")
    assert [a.workload_id for a in result.admissions] == ["w"]


def test_reclaim_takes_one_fractional_extra_for_a_fractional_job() -> None:
    queues = [dept(), project("p", deserved=0), project("q", deserved=1)]
    snap = _grown(snapshot(nodes(1, 2), queues, [_fractional("e", "p", 1, 4)]))
    half = Workload("w", "q", (PodRequest(gpu_fraction=0.5),))
    snap = replace(snap, workloads=(*snap.workloads, half))
    result = run(snap)
    assert evicted(result) == {}
    assert [(r.removed, r.beneficiary) for r in result.resizes] == [((3,), "w")]


def test_consolidation_takes_an_extra_pod_to_free_a_node_instead_of_waiting() -> None:
    # n0 holds only the service's extra pod; n1 its minimum and a rigid service. The
    # 4-GPU job fits in the 4 free GPUs in total, on no node: shrinking frees n0.
    queues = [dept(), project("p", deserved=8)]
    svc = replace(
        _elastic("svc", "p", 1, 2, preemptible=False),
        placement=(PodPlacement(0, "n1", gpus=(0,)), PodPlacement(1, "n0", gpus=(0,))),
        started_at=100.0,
    )
    rigid = running(job("s", "p", gpus=2, preemptible=False), "n1", [1, 2], started=100)
    snap = snapshot(nodes(2, 4), queues, [svc, rigid, job("w", "p", gpus=4, t=500)])
    config = SchedulerConfig(preempt=False)
    result = run(snap, config)
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [
        ("svc", (1,), "w")
    ]
    assert [(a.workload_id, a.pods[0].node_id) for a in result.admissions] == [("w", "n0")]
    assert evicted(result) == {}


# -- GPU ranges: one-GPU slices required on one node (scheduling/gpu_range.py) -----------

NODE = "gpupool.io/node"


def _ranged(wid: str, queue: str, low: int, high: int, **kw: object) -> Workload:
    one_node = TopologyConstraint(NODE)
    pods = (PodRequest(gpus=1),) * high
    return Workload(wid, queue, pods, min_pods=low, elastic=True, topology=one_node, **kw)  # type: ignore[arg-type]


def _own_domains(node_list: tuple[Node, ...]) -> tuple[Node, ...]:
    return tuple(replace(n, topology={**n.topology, NODE: n.id}) for n in node_list)


def test_a_gpu_range_starts_on_the_node_where_it_can_grow_to_its_maximum() -> None:
    # Best fit for its minimum alone is n0 (1 free GPU), where it could never grow.
    queues = [dept(), project("p", deserved=8)]
    rigid = running(job("r", "p", gpus=3), "n0", [0, 1, 2], started=100)
    snap = snapshot(_own_domains(nodes(2, 4)), queues, [rigid, _ranged("e", "p", 1, 4)])
    [admission] = run(snap).admissions
    assert {p.node_id for p in admission.pods} == {"n1"} and len(admission.pods) == 4


# -- properties -----------------------------------------------------------------------


def _preempted_queues(before: Snapshot, result: object) -> dict[str, int]:
    """Queue -> the highest priority among workloads that preempted a whole one of it."""
    by_id = {w.id: w for w in before.workloads}
    found: dict[str, int] = {}
    for e in result.evictions:  # type: ignore[attr-defined]
        if e.reason == "preempt" and e.beneficiary in by_id:
            qid = by_id[e.workload_id].queue_id
            found[qid] = max(found.get(qid, -1), by_id[e.beneficiary].priority)
    return found


def elastic_mix(seed: int) -> Snapshot:
    """Random 1-GPU and half-GPU elastic and rigid work and GPU ranges of few queues with
    mixed priorities, some placed by the engine, more arriving (so preemption happens)."""
    rng = random.Random(seed)
    node_list = tuple(
        Node(
            f"n{i}",
            "a",
            tuple(Gpu(j, "A100", 40960) for j in range(rng.choice((2, 4)))),
            topology={NODE: f"n{i}"},
        )
        for i in range(rng.randint(1, 3))
    )
    queues = [Queue("d", None, {})]
    for p in range(rng.randint(1, 3)):
        quota = Quota(rng.randint(1, 6), None, rng.choice((1.0, 2.0)))
        queues.append(Queue(f"q{p}", "d", {("a", G): quota}))  # type: ignore[dict-item]
    leaves = [q.id for q in queues[1:]]

    def workload(i: int) -> Workload:
        size = rng.randint(1, 5)
        low = rng.randint(1, size) if rng.random() < 0.6 else None
        pod = PodRequest(gpus=1) if rng.random() < 0.7 else PodRequest(gpu_fraction=0.5)
        if low is not None and pod.gpus and rng.random() < 0.3:  # a GPU range
            return replace(_ranged(f"w{i:03d}", rng.choice(leaves), low, size), priority=5)
        return Workload(
            f"w{i:03d}",
            rng.choice(leaves),
            (pod,) * size,
            min_pods=low,
            elastic=low is not None,
            preemptible=rng.random() < 0.8,
            submit_time=rng.uniform(0, NOW),
            priority=rng.choice((0, 5, 9)),
        )

    first = Snapshot(("a",), node_list, tuple(queues), tuple(workload(i) for i in range(8)))
    placed = apply_result(first, schedule(first, SchedulerConfig(), NOW - 600), NOW - 600)
    live = [w for w in placed.workloads if w.placement is not None]
    more = [workload(100 + i) for i in range(rng.randint(0, 10))]
    return replace(placed, workloads=tuple(live + more))


def _whole_gpu_extras(snap: Snapshot, queue: str, priority: int) -> dict[str, set[int]]:
    """Extras of whole-GPU elastic work of a queue at or below a priority."""
    eligible = {
        w.id
        for w in snap.workloads
        if w.queue_id == queue and w.priority <= priority and not w.pods[0].is_shared
    }
    return {wid: pods for wid, pods in _extras(snap).items() if wid in eligible}


@FAST
@given(seeds)
def test_preemption_takes_every_eligible_extra_pod_before_a_whole_workload(seed: int) -> None:
    # With 1-GPU extras every one is usable room for a whole-GPU job: so a queue that
    # loses a whole workload to preemption keeps none of the extras it had that the
    # preemptor could take (same project, priority at most the preemptor's).
    for before, result in cycles(elastic_mix(seed), 6):
        after = apply_result(before, result, NOW)
        kept = _extras(after)
        for qid, priority in _preempted_queues(before, result).items():
            for wid, pods in _whole_gpu_extras(before, qid, priority).items():
                assert not pods & kept.get(wid, set()), (wid, pods, result)


def test_some_mixes_shrink_for_preemption_and_evict_so_the_property_is_exercised() -> None:
    shrinks = preempts = fractional = 0
    for seed in range(80):
        for before, result in cycles(elastic_mix(seed), 4):
            by_id = {w.id: w for w in before.workloads}
            for r in result.resizes:
                if r.removed and r.beneficiary in by_id:
                    owner, ben = by_id[r.workload_id], by_id[r.beneficiary]
                    shrinks += owner.queue_id == ben.queue_id
                    fractional += owner.pods[0].is_shared
            preempts += sum(1 for e in result.evictions if e.reason == "preempt")
    assert shrinks > 0 and preempts > 0 and fractional > 0


@FAST
@given(seeds)
def test_elastic_mixes_never_overcommit_or_run_below_their_minimum(seed: int) -> None:
    for before, result in cycles(elastic_mix(seed), 10):
        after = apply_result(before, result, NOW)
        _check_no_overcommit(after)
        for wl in after.workloads:
            if wl.placement is not None:
                assert wl.gang_min <= len(wl.placement) <= len(wl.pods), wl


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds)
def test_elastic_mixes_settle_and_never_flip_flop_over_fifty_cycles(seed: int) -> None:
    assert_settles(elastic_mix(seed))
