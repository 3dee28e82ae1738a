"""The snapshot the simulator hands the engine mirrors the replay's state."""

from __future__ import annotations

import random

from scheduling.engine.cycle import schedule
from scheduling.engine.sim.engine_policy import EnginePolicy, build_queues
from scheduling.engine.sim.fifo import FifoPolicy
from scheduling.engine.sim.loop import SimConfig, Simulation
from scheduling.engine.sim.specs import QuotaSpec, TeamQuota
from scheduling.engine.types import (
    GpuShare,
    PodRequest,
    Quota,
    Resource,
    SchedulerConfig,
)
from tests.engine.test_sim_replay import cluster, job


def test_static_queues_forbid_borrowing_and_departments_sum_their_teams() -> None:
    spec = QuotaSpec(
        quotas={
            "a": {"p": TeamQuota(deserved=4, limit=6, weight=2)},
            "b": {"p": TeamQuota(deserved=2, weight=1)},
        },
        departments={"a": "d", "b": "d"},
    )
    queues = {q.id: q for q in build_queues(spec, {"a", "b", "c"}, borrowing=False)}
    assert set(queues) == {"dept:d", "dept:default", "a", "b", "c"}
    assert queues["a"].parent_id == "dept:d"
    assert queues["a"].quotas == {
        ("p", Resource.GPU): Quota(
            deserved=4, limit=6, over_quota_weight=2, over_quota_allowed=False
        )
    }
    assert queues["dept:d"].quotas[("p", Resource.GPU)] == Quota(
        deserved=6, limit=None, over_quota_weight=3, over_quota_allowed=False
    )
    assert queues["c"].quotas == {}  # a team without quota: deserved 0


def test_the_snapshot_shows_running_placements_shares_and_checkpoints() -> None:
    jobs = [job("whole", 0, 5000, 2), job("half", 0, 5000, 0.5), job("wait", 10, 5, 8)]
    config = SimConfig(tick=0.0, period=0.0, checkpoint_interval=1000.0)
    spec = QuotaSpec({"a": {"p": TeamQuota(deserved=4)}}, {"a": "default"})
    sim = Simulation(cluster(1, 4), jobs, spec, FifoPolicy, config)
    sim._apply_events_until(0.0)
    sim._cycle()  # fifo starts half (first by id) then whole at 0
    sim._apply_events_until(10.0)
    sim.now = 2500.0
    policy = EnginePolicy(sim, "gpupool", SchedulerConfig(), borrowing=True)
    snapshot = policy.snapshot(sim, 2500.0)
    (node,) = snapshot.nodes
    assert (node.id, node.pool, node.topology) == ("p-n000", "p", {})
    assert [g.whole_by for g in node.gpus] == [None, "whole", "whole", None]
    assert node.gpus[0].shares == (GpuShare(workload_id="half", share=0.5),)
    workloads = {w.id: w for w in snapshot.workloads}
    assert list(workloads) == ["half", "whole", "wait"]  # running, then pending by age
    whole = workloads["whole"]
    assert whole.pods == (PodRequest(gpus=2),)
    assert (whole.started_at, whole.last_checkpoint_time) == (0.0, 2000.0)
    assert workloads["half"].pods == (PodRequest(gpu_fraction=0.5),)
    assert workloads["wait"].placement is None
    assert workloads["wait"].submit_time == 10.0
    assert snapshot.pools == ("p",)


def test_unchanged_nodes_and_workloads_are_reused_between_cycles() -> None:
    sim = Simulation(cluster(2, 2), [job("x", 0, 100, 1)], QuotaSpec({}, {}), FifoPolicy)
    policy = EnginePolicy(sim, "gpupool", SchedulerConfig(), borrowing=True)
    first = policy.snapshot(sim, 0.0)
    second = policy.snapshot(sim, 0.0)
    assert all(a is b for a, b in zip(first.nodes, second.nodes, strict=True))


def test_a_replay_with_the_kept_engine_state_equals_one_that_rebuilds_every_cycle() -> None:
    rng = random.Random(4)
    jobs = [
        job(
            f"j{i:03d}",
            rng.uniform(0, 20000),
            rng.choice((300, 1800, 7200, None)),
            rng.choice((0.25, 0.5, 1, 2, 4, 8)),
            team=rng.choice("abc"),
        )
        for i in range(150)
    ]
    spec = QuotaSpec(
        {team: {"p": TeamQuota(deserved=8)} for team in "abc"}, dict.fromkeys("abc", "default")
    )
    config = SimConfig(tick=60.0, period=600.0, checkpoint_interval=900.0)

    def replay(kept: bool) -> Simulation:
        def factory(sim: Simulation) -> EnginePolicy:
            scheduler = None if kept else schedule
            return EnginePolicy(sim, "gpupool", SchedulerConfig(), True, scheduler)

        return Simulation(cluster(4, 8), jobs, spec, factory, config).run()

    kept, rebuilt = replay(True), replay(False)
    outcome = {i: (r.first_start, r.end, r.preemptions, r.placement) for i, r in kept.runs.items()}
    assert outcome == {
        i: (r.first_start, r.end, r.preemptions, r.placement) for i, r in rebuilt.runs.items()
    }
    assert kept.policy.engine.updates > 10 * kept.policy.engine.builds  # type: ignore[attr-defined]
    assert sum(r.preemptions for r in kept.runs.values()) > 0  # evictions were exercised
