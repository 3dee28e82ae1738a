"""Elastic workloads: rules that mutation testing found unguarded (docs/engine.md,
"Mutation testing", the fourth run)."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.apply import apply_result
from scheduling.engine.fairshare import EPS
from scheduling.engine.types import (
    CycleResult,
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    Resource,
    SchedulerConfig,
    TopologyConstraint,
    TopologyMode,
    Workload,
)
from tests.engine.builders import (
    GPU_MEMORY,
    cycles,
    dept,
    evicted,
    job,
    nodes,
    placed,
    project,
    run,
    running,
    snapshot,
)
from tests.engine.test_elastic import elastic_snapshot
from tests.engine.test_elastic_reclaim_order import elastic_mix


def _elastic_on_n0(wid: str, low: int, high: int, devices: list[int]) -> Workload:
    """e's elastic job of `low` to `high` one-GPU pods, running one on each device of n0."""
    wl = job(wid, "e", pods=high, min_pods=low, elastic=True, pools=("a", "b"))
    pods = tuple(PodPlacement(i, "n0", gpus=(gpu,)) for i, gpu in enumerate(devices))
    return replace(wl, placement=pods, started_at=0.0)


def test_the_fair_share_counts_what_elastic_work_could_still_grow_by() -> None:
    # Pools a (16 GPUs) and b (8), more than e asks for: e's fair share is its demand.
    # In pool a, where its running jobs are: d at its maximum (2), g holding 2 of 4:
    # 2 + 2 + the 2 pods g lacks. In pool b: the pending job p, a gang of its minimum 2,
    # and the one pod it could grow by; none for g, which grows only where it runs.
    work = [
        _elastic_on_n0("d", 1, 2, [0, 1]),
        _elastic_on_n0("g", 1, 4, [2, 3]),
        job("p", "e", pods=3, min_pods=2, elastic=True, pools=("b",)),
    ]
    cluster = (*nodes(1, 16), *nodes(1, 8, pool="b", prefix="m"))
    result = run(snapshot(cluster, [dept(), project("e")], work))
    shares = {
        k[1]: v for k, v in result.fair_shares.items() if k[0] == "e" and k[2] is Resource.GPU
    }
    assert shares == {"a": 6.0, "b": 3.0}


def test_idle_gpus_grow_a_projects_elastic_jobs_by_priority() -> None:
    # One idle GPU: y (priority 5, newer) grows before x (priority 0).
    x = replace(_elastic_on_n0("x", 1, 2, [0]), priority=0, submit_time=0.0)
    y = replace(_elastic_on_n0("y", 1, 2, [1]), priority=5, submit_time=1.0)
    result = run(snapshot(nodes(1, 3), [dept(), project("e")], [x, y]))
    assert [(r.workload_id, [p.gpus for p in r.added]) for r in result.resizes] == [("y", [(2,)])]


def _running(wl: Workload, *pods: tuple[str, tuple[int, ...]]) -> Workload:
    """wl running its first pods on (node, devices) each (since 0 unless it says)."""
    placement = tuple(PodPlacement(i, node, gpus=gpus) for i, (node, gpus) in enumerate(pods))
    return replace(wl, placement=placement, started_at=wl.started_at or 0.0)


def _grown(result: CycleResult) -> list[tuple[str, list[tuple[int, str, tuple[int, ...]]]]]:
    return [(r.workload_id, [(p.pod, p.node_id, p.gpus) for p in r.added]) for r in result.resizes]


def test_an_eviction_does_not_keep_other_elastic_jobs_from_growing() -> None:
    # h (priority 5) preempts the elastic job a for GPUs 0-1; GPU 3 stays idle and b,
    # the project's other elastic job, grows onto it (within the limit of 4) in the same
    # cycle, whatever the order of their ids.
    queues = [dept(), project("p", deserved=4, limit=4)]
    a = _running(job("a", "p", gpus=2, pods=2, min_pods=1, elastic=True), ("n0", (0, 1)))
    b = _running(job("b", "p", pods=2, min_pods=1, elastic=True, preemptible=False), ("n0", (2,)))
    h = job("h", "p", gpus=2, priority=5, t=500)
    result = run(snapshot(nodes(1, 4), queues, [a, b, h]))
    assert evicted(result) == {"a": "preempt"}
    assert placed(result) == {"h": [("n0", (0, 1))]}
    assert _grown(result) == [("b", [(1, "n0", (3,))])]


def test_growth_counts_each_jobs_own_pod_size_against_the_limit() -> None:
    # p holds 3 of its limit of 4: a's next pod (2 GPUs, a goes first by priority) would
    # pass the limit, b's (1 GPU) fits it.
    queues = [dept(), project("p", deserved=0, limit=4)]
    a = _running(
        job("a", "p", gpus=2, pods=2, min_pods=1, elastic=True, priority=5), ("n0", (0, 1))
    )
    b = _running(job("b", "p", pods=2, min_pods=1, elastic=True), ("n0", (2,)))
    result = run(snapshot(nodes(1, 8), queues, [a, b]))
    assert _grown(result) == [("b", [(1, "n0", (3,))])]


def test_an_elastic_job_grows_only_on_the_gpu_models_it_asks_for() -> None:
    # n0 has two A100s and two H100s; the job asks for A100s: it grows by one pod only.
    models = ("A100", "A100", "H100", "H100")
    node = Node("n0", "a", tuple(Gpu(j, m, GPU_MEMORY) for j, m in enumerate(models)))
    wl = job("e", "p", pods=4, min_pods=1, elastic=True, gpu_models=("A100",))
    result = run(
        snapshot((node,), [dept(), project("p", deserved=8)], [_running(wl, ("n0", (0,)))])
    )
    assert _grown(result) == [("e", [(1, "n0", (1,))])]


def test_an_elastic_job_that_prefers_a_rack_grows_outside_it_when_the_rack_is_full() -> None:
    # Rack r0 is n0 (2 GPUs, both held); a preference, unlike a requirement, lets the job
    # grow on n1 in rack r1.
    preferred = TopologyConstraint("rack", TopologyMode.PREFERRED)
    wl = job("e", "p", pods=4, min_pods=1, elastic=True, topology=preferred)
    work = [running(job("f", "p"), "n0", [1]), _running(wl, ("n0", (0,)))]
    result = run(snapshot(nodes(2, 2, racks=2), [dept(), project("p", deserved=16)], work))
    assert _grown(result) == [("e", [(1, "n1", (0,)), (2, "n1", (1,))])]


def test_preemption_takes_one_half_gpu_extra_for_a_half_gpu_newcomer() -> None:
    # p is at its limit of 2 with e's four half-GPU pods on two GPUs; the half-GPU
    # newcomer (higher priority) needs only the newest of them back, not a whole GPU.
    half = PodRequest(gpu_fraction=0.5)
    e = Workload("e", "p", (half,) * 4, min_pods=1, elastic=True, started_at=0.0)
    on = tuple(PodPlacement(i, "n0", shared_gpu=i // 2, share=0.5) for i in range(4))
    w = Workload("w", "p", (half,), priority=5, submit_time=500.0)
    queues = [dept(), project("p", deserved=2, limit=2)]
    result = run(snapshot(nodes(1, 2), queues, [replace(e, placement=on), w]))
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [("e", (3,), "w")]
    assert [(a.workload_id, a.pods[0].shared_gpu) for a in result.admissions] == [("w", 1)]


def test_no_resize_adds_and_removes_pods_in_one_cycle() -> None:
    """A workload shrunk for another in a cycle does not grow in it, even onto GPUs that
    stay idle (a resize names one direction; its pods are not deleted and made again).
    Mix 110 shrinks a job and leaves GPUs idle in one cycle."""
    for seed in range(200):
        for _, result in cycles(elastic_mix(seed), 4):
            assert not [r for r in result.resizes if r.added and r.removed], seed


def test_a_project_that_reclaimed_ends_the_cycle_within_its_fair_share() -> None:
    """Growth too stops a project that reclaimed GPUs at its fair share (the reason
    reclaims do not flip-flop, actions/reclaim.py). Mix 118 reclaims for an elastic job
    and leaves GPUs idle."""
    for seed in range(200):
        for before, result in cycles(elastic_mix(seed), 4):
            queue_of = {w.id: w.queue_id for w in before.workloads}
            reclaimers = {
                queue_of[e.beneficiary] for e in result.evictions if e.reason == "reclaim"
            }
            held: dict[str, float] = {}
            for wl in apply_result(before, result, 0.0).workloads:
                for pod in wl.placement or ():
                    share = pod.share if pod.shared_gpu is not None else 0.0
                    held[wl.queue_id] = held.get(wl.queue_id, 0.0) + len(pod.gpus) + share
            for qid in reclaimers:
                assert held[qid] <= result.fair_shares[(qid, "a", Resource.GPU)] + EPS, seed


def test_preemption_takes_extras_back_until_the_newcomer_fits_within_its_limit() -> None:
    # p is at its limit of 3 with e's three pods and one GPU idle: the 2-GPU newcomer
    # would fit after one extra goes, but only two keep p within its limit.
    queues = [dept(), project("p", deserved=0, limit=3)]
    e = job("e", "p", pods=3, min_pods=1, elastic=True)
    e = _running(e, ("n0", (0,)), ("n0", (1,)), ("n0", (2,)))
    w = job("w", "p", gpus=2, priority=5, t=500)
    result = run(snapshot(nodes(1, 4), queues, [e, w]))
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [
        ("e", (1, 2), "w")
    ]
    assert placed(result) == {"w": [("n0", (1, 2))]}


def test_consolidation_takes_an_extra_of_another_project_above_its_fair_share() -> None:
    # q (over-quota weight 0: a fair share of 0) holds its service's extra pod alone on
    # n0; p, above its deserved 1 (no reclaim) but within its fair share, needs a whole
    # node for w: consolidation takes q's extra back rather than leave w waiting.
    queues = [dept(), project("p", deserved=1), project("q", deserved=0, weight=0.0)]
    svc = job("svc", "q", pods=2, min_pods=1, elastic=True, preemptible=False)
    svc = replace(_running(svc, ("n1", (0,)), ("n0", (0,))), started_at=100.0)
    rigid = running(job("s", "p", gpus=2, preemptible=False), "n1", [1, 2], started=100)
    snap = snapshot(nodes(2, 4), queues, [svc, rigid, job("w", "p", gpus=4, t=500)])
    result = run(snap, SchedulerConfig(preempt=False))
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [
        ("svc", (1,), "w")
    ]
    assert placed(result) == {"w": [("n0", (0, 1, 2, 3))]}
    assert evicted(result) == {}


def test_preemption_takes_half_gpu_extras_back_for_a_gang_of_half_gpu_pods() -> None:
    # As above, for two half-GPU pods: two extras on one device make room for both (the
    # newcomer needs one freed device, not two), and e keeps running.
    half = PodRequest(gpu_fraction=0.5)
    e = Workload("e", "p", (half,) * 4, min_pods=1, elastic=True, started_at=0.0)
    on = tuple(PodPlacement(i, "n0", shared_gpu=i // 2, share=0.5) for i in range(4))
    w = Workload("w", "p", (half, half), priority=5, submit_time=500.0)
    queues = [dept(), project("p", deserved=2, limit=2)]
    result = run(snapshot(nodes(1, 2), queues, [replace(e, placement=on), w]))
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [
        ("e", (2, 3), "w")
    ]
    assert evicted(result) == {}


def test_reclaim_takes_back_dozens_of_extras_for_a_large_gang_before_evicting_whole() -> None:
    # e holds all 40 GPUs (39 beyond its minimum); q's 34-pod gang, within q's deserved
    # 34, is served by 34 extras (one placement try each), e keeps running at 6.
    queues = [dept(), project("p", deserved=0), project("q", deserved=34)]
    e = job("e", "p", pods=40, min_pods=1, elastic=True)
    e = _running(e, *[(f"n{i // 8}", (i % 8,)) for i in range(40)])
    result = run(snapshot(nodes(5, 8), queues, [e, job("w", "q", pods=34)]))
    assert evicted(result) == {}
    assert [(r.workload_id, len(r.removed), r.beneficiary) for r in result.resizes] == [
        ("e", 34, "w")
    ]
    assert [len(a.pods) for a in result.admissions] == [34]


def _service_of_q(gpus: int) -> Workload:
    """q's non-preemptible elastic service of two `gpus`-GPU pods: its minimum on n1, its
    extra alone on n0."""
    svc = job("svc", "q", gpus=gpus, pods=2, min_pods=1, elastic=True, preemptible=False)
    devices = tuple(range(gpus))
    return replace(_running(svc, ("n1", devices), ("n0", devices)), started_at=100.0)


def test_consolidation_frees_a_node_for_non_preemptible_work_with_anothers_extra() -> None:
    # As above with p's job non-preemptible (within p's deserved 6) and reclaim off:
    # consolidation alone takes q's extra back.
    queues = [dept(), project("p", deserved=6), project("q", deserved=0, weight=0.0)]
    rigid = running(job("s", "p", gpus=2, preemptible=False), "n1", [1, 2], started=100)
    w = job("w", "p", gpus=4, t=500, preemptible=False)
    snap = snapshot(nodes(2, 4), queues, [_service_of_q(1), rigid, w])
    result = run(snap, SchedulerConfig(preempt=False, reclaim=False))
    assert [(r.workload_id, r.removed, r.beneficiary) for r in result.resizes] == [
        ("svc", (1,), "w")
    ]
    assert placed(result) == {"w": [("n0", (0, 1, 2, 3))]}


def test_consolidation_never_takes_extras_that_would_leave_their_project_below_its_share() -> None:
    # q holds 4 GPUs against a fair share of 3: its 2-GPU extra may not go, so w, which
    # fits only on a whole node, waits.
    queues = [dept(), project("p", deserved=1), project("q", deserved=3, weight=0.0)]
    rigid = running(job("s", "p", gpus=2, preemptible=False), "n1", [2, 3], started=100)
    snap = snapshot(nodes(2, 6), queues, [_service_of_q(2), rigid, job("w", "p", gpus=6, t=500)])
    result = run(snap, SchedulerConfig(preempt=False))
    assert result.fair_shares[("q", "a", Resource.GPU)] == 3.0
    assert (result.resizes, result.admissions) == ((), ())
    assert "largest free block in pool a is 4" in result.pending_reasons["w"]


def test_every_shrink_names_the_workload_its_pods_went_to() -> None:
    """A resize that takes pods back names its beneficiary (the event tells the owner
    why), also when an attempt later in the cycle that shrank the same job is undone
    (snapshots 9 and 62)."""
    for seed in range(70):
        for before, result in cycles(elastic_snapshot(seed), 4):
            ids = {w.id for w in before.workloads}
            for resize in result.resizes:
                assert not resize.removed or resize.beneficiary in ids, (seed, resize)


def _reclaimed_from(first: Workload, second: Workload) -> list[str]:
    """Whose extra pod reclaim takes for q's 1-GPU job when p's two elastic jobs (one
    extra pod each) fill n0."""
    queues = [dept(), project("p", deserved=0), project("q", deserved=1)]
    a = _running(first, ("n0", (0,)), ("n0", (1,)))
    b = _running(second, ("n0", (2,)), ("n0", (3,)))
    result = run(snapshot(nodes(1, 4), queues, [a, b, job("w", "q", t=900)]))
    assert evicted(result) == {}
    return [r.workload_id for r in result.resizes if r.removed]


def test_reclaim_takes_the_extra_of_the_most_recently_resized_or_started_job_first() -> None:
    def elastic(wid: str, started: float, resized: float | None = None) -> Workload:
        wl = job(wid, "p", pods=2, min_pods=1, elastic=True)
        return replace(wl, started_at=started, resized_at=resized)

    # a grew at 500, after b started at 200: a's extra is the newest.
    assert _reclaimed_from(elastic("a", 100.0, 500.0), elastic("b", 200.0)) == ["a"]
    # Neither resized: b started last.
    assert _reclaimed_from(elastic("a", 100.0), elastic("b", 200.0)) == ["b"]


def test_an_elastic_job_whose_node_left_the_cluster_is_evicted_and_the_cycle_goes_on() -> None:
    # g runs on node "gone", which the snapshot no longer lists: it holds none of its
    # minimum and is evicted as a stale gang; x is admitted on n0 as usual.
    gone = _running(job("g", "e", pods=4, min_pods=1, elastic=True), ("gone", (0,)), ("gone", (1,)))
    queues = [dept(), project("e", deserved=1, limit=1)]
    result = run(snapshot(nodes(1, 2), queues, [gone, job("x", "e", priority=5)]))
    assert evicted(result) == {"g": "stale_gang"}
    assert placed(result) == {"x": [("n0", (0,))]}


def test_an_elastic_job_of_a_project_missing_from_the_snapshot_does_not_stop_the_cycle() -> None:
    # The project of g was deleted between the reads of workloads and of projects: the
    # fair share leaves it out, and everyone else is scheduled as usual.
    orphan = _running(job("g", "deleted", pods=4, min_pods=1, elastic=True), ("n0", (0,)))
    snap = snapshot(nodes(1, 8), [dept(), project("e", deserved=2)], [orphan, job("x", "e")])
    result = run(snap)
    assert placed(result)["x"] == [("n0", (1,))]
    assert not [k for k in result.fair_shares if k[0] == "deleted"]
