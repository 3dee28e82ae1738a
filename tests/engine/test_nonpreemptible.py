"""Non-preemptible work runs only within its project's deserved quota (issue 17).

Nothing evicts non-preemptible work, so if it borrowed idle GPUs over quota their owner
would wait until it ended. Run:ai and KAI admit it only within the deserved quota; an
admin may allow a project over it (Queue.nonpreemptible_over_quota).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import given

from scheduling.engine.apply import apply_result
from scheduling.engine.types import (
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tests.engine.builders import cycles, dept, job, nodes, placed, project, run, running, snapshot
from tests.engine.test_properties import FAST, NOW, random_snapshot, seeds


def _two_projects(over_quota: bool = False) -> Snapshot:
    """8 GPUs, quota 4 each; project a submits 8 non-preemptible 1-GPU jobs."""
    a = replace(project("a", deserved=4), nonpreemptible_over_quota=over_quota)
    jobs = [job(f"a{i}", "a", t=i, preemptible=False) for i in range(8)]
    return snapshot(nodes(1), [dept(), a, project("b", deserved=4)], jobs)


def test_a_project_with_quota_4_cannot_run_8_non_preemptible_jobs_while_another_owns_the_rest():
    steps = cycles(_two_projects(), 2)
    first = steps[0][1]
    assert sorted(placed(first)) == [f"a{i}" for i in range(4)]
    reason = first.pending_reasons["a4"]
    assert "non-preemptible" in reason and "deserved quota of 4 GPUs in pool a" in reason
    assert "4 held by its non-preemptible work" in reason
    # The owner of the other 4 GPUs arrives: its jobs start at once, nothing is evicted.
    snap = apply_result(steps[-1][0], steps[-1][1], 1060)
    snap = replace(snap, workloads=snap.workloads + tuple(job(f"b{i}", "b") for i in range(4)))
    result = run(snap, now=1120)
    assert sorted(placed(result)) == [f"b{i}" for i in range(4)]
    assert not result.evictions


def test_preemptible_work_of_the_same_project_still_borrows_idle_gpus():
    snap = _two_projects()
    extra = tuple(job(f"p{i}", "a", t=10 + i) for i in range(4))
    result = run(replace(snap, workloads=snap.workloads + extra))
    assert sorted(placed(result)) == [f"a{i}" for i in range(4)] + [f"p{i}" for i in range(4)]


def test_an_admin_may_let_a_project_run_non_preemptible_work_over_quota():
    assert len(placed(run(_two_projects(over_quota=True)))) == 8


def test_fractions_count_and_the_rule_holds_per_pool():
    queue = Queue("a", None, {("a", Resource.GPU): Quota(1.0), ("b", Resource.GPU): Quota(0.0)})
    fracs = [
        Workload(f"f{i}", "a", (PodRequest(gpu_fraction=0.5),), submit_time=i, preemptible=False)
        for i in range(3)
    ]
    pinned = job("pb", "a", pools=("b",), preemptible=False)
    snap = snapshot(nodes(1) + nodes(1, pool="b", prefix="m"), [queue], [*fracs, pinned])
    result = run(snap)
    assert sorted(placed(result)) == ["f0", "f1"]
    assert "quota of 1 GPUs in pool a: 1 held" in result.pending_reasons["f2"]
    assert "quota of 0 GPUs in pool b" in result.pending_reasons["pb"]


def test_cpu_counts_where_the_project_has_a_deserved_amount_of_it():
    cpu_quota = {("a", Resource.GPU): Quota(8.0), ("a", Resource.CPU): Quota(10.0)}
    gpu_only = {("a", Resource.GPU): Quota(8.0)}
    pods = (PodRequest(gpus=1, cpu=4.0),)
    for quotas, started in ((cpu_quota, 2), (gpu_only, 3)):
        work = [Workload(f"c{i}", "a", pods, submit_time=i, preemptible=False) for i in range(3)]
        result = run(snapshot(nodes(1), [Queue("a", None, quotas)], work))
        assert len(placed(result)) == started
    assert (
        "CPU cores"
        in run(snapshot(nodes(1), [Queue("a", None, cpu_quota)], work)).pending_reasons["c2"]
    )


def _fixed_alloc(snap: Snapshot) -> dict[tuple[str, str, Resource], float]:
    pool_of = {n.id: n.pool for n in snap.nodes}
    held: dict[tuple[str, str, Resource], float] = defaultdict(float)
    for wl in snap.workloads:
        if wl.preemptible:
            continue
        for p in wl.placement or ():
            pod = wl.pods[p.pod]
            held[(wl.queue_id, pool_of[p.node_id], Resource.GPU)] += len(p.gpus) + p.share
            held[(wl.queue_id, pool_of[p.node_id], Resource.CPU)] += pod.cpu
    return held


@FAST
@given(seeds)
def test_no_non_preemptible_allocation_ever_exceeds_its_projects_deserved_share(seed: int):
    # Random clusters and queues, some projects marked to allow it: over a few cycles of
    # arrivals and evictions, only marked projects ever hold more with non-preemptible
    # work than their deserved quota, in any pool. Half the random snapshots carry a
    # CPU quota too.
    snap = random_snapshot(seed)
    marked = {q.id for i, q in enumerate(snap.queues) if (seed >> i) & 1}
    queues = []
    for i, q in enumerate(snap.queues):
        quotas = dict(q.quotas)
        if (seed >> (8 + i)) & 1:
            quotas[("a", Resource.CPU)] = Quota(16.0)
        queues.append(replace(q, quotas=quotas, nonpreemptible_over_quota=q.id in marked))
    by_id = {q.id: q for q in queues}
    snap = replace(snap, queues=tuple(queues))
    # The running set was placed under the rule with nobody marked and no CPU quota: what
    # it holds over a new CPU quota may stay (nothing evicts it) but must not grow.
    before = _fixed_alloc(snap)
    now = NOW
    for _ in range(4):
        result = run(snap, SchedulerConfig(), now)
        snap = apply_result(snap, result, now)
        for (qid, pool, resource), amount in _fixed_alloc(snap).items():
            quota = by_id[qid].quotas.get((pool, resource))
            deserved = quota.deserved if quota else 0.0
            if resource is Resource.CPU and deserved == 0:
                continue
            allowed = max(deserved, before.get((qid, pool, resource), 0.0))
            assert qid in marked or amount <= allowed + 1e-6, (qid, pool, resource, amount)
        now += 60


def test_the_random_snapshots_start_non_preemptible_work_both_ways():
    # The property above is not vacuous: non-preemptible work starts in some snapshots,
    # and some is held back by the rule.
    started = held_back = 0
    for seed in range(40):
        snap = random_snapshot(seed)
        result = run(snap, SchedulerConfig(), NOW)
        fixed = {wl.id for wl in snap.workloads if not wl.preemptible and wl.placement is None}
        started += len(fixed & set(placed(result)))
        held_back += sum("non-preemptible work of" in r for r in result.pending_reasons.values())
    assert started > 5 and held_back > 5, (started, held_back)


def test_preemption_does_not_search_for_a_workload_the_rule_holds_back(monkeypatch):
    # Project a (quota 4) runs 4 non-preemptible GPUs and 4 preemptible low-priority ones;
    # a high-priority non-preemptible job waits: evicting the preemptible ones would free
    # none of its non-preemptible quota, so no eviction search runs for it.
    from scheduling.engine.actions import preempt as preempt_module

    fixed = [running(job(f"f{i}", "a", preemptible=False), "n0", [i]) for i in range(4)]
    low = [running(job(f"l{i}", "a"), "n0", [4 + i]) for i in range(4)]
    urgent = job("urgent", "a", priority=10, preemptible=False, t=5)
    searched: list[str] = []
    real = preempt_module.make_room
    monkeypatch.setattr(
        preempt_module,
        "make_room",
        lambda ctx, wl, *a, **kw: searched.append(wl.id) or real(ctx, wl, *a, **kw),
    )
    snap = snapshot(nodes(1), [dept(), project("a", deserved=4)], [*fixed, *low, urgent])
    result = run(snap)
    assert not result.evictions and searched == []
    assert "non-preemptible work of project a" in result.pending_reasons["urgent"]
    # A preemptible high-priority job of the same project still preempts.
    result = run(replace(snap, workloads=(*fixed, *low, replace(urgent, preemptible=True))))
    assert searched == ["urgent"] and len(result.evictions) == 1
