"""The engine-backed policies in the replay: static keeps to quotas, gpupool borrows."""

from __future__ import annotations

import pytest

from scheduling.engine.sim.cli import engine_config, policy_factory, simulate
from scheduling.engine.sim.loop import SimConfig, Simulation
from scheduling.engine.sim.specs import QuotaSpec
from scheduling.engine.types import CycleResult, PlacementStrategy, SchedulerConfig
from tests.engine.test_sim_replay import EXACT, cluster, job, quotas

CHECKPOINT_30S = SimConfig(tick=0.0, period=0.0, checkpoint_interval=30.0)


def lifetimes(sim: Simulation) -> dict[str, tuple]:
    return {i: (r.first_start, r.end, r.preemptions) for i, r in sim.runs.items()}


class Watching:
    """Wraps a policy and records every team's GPUs at the start of each cycle."""

    name = "watching"

    def __init__(self, sim: Simulation, inner: str, seen: list[dict[str, float]]) -> None:
        self.inner = policy_factory(inner, SchedulerConfig())(sim)
        self.seen = seen

    def decide(self, sim: Simulation, now: float) -> CycleResult:
        self.seen.append(dict(sim.recorder.allocated))
        return self.inner.decide(sim, now)


def _replay_watched(policy: str, jobs, spec: QuotaSpec, nodes=None):
    seen: list[dict[str, float]] = []
    sim = Simulation(
        nodes or cluster(1, 4), jobs, spec, lambda s: Watching(s, policy, seen), EXACT
    ).run()
    seen.append(dict(sim.recorder.allocated))
    return sim, seen


def test_static_never_lets_a_team_past_its_quota_even_on_an_idle_cluster() -> None:
    jobs = [job(f"a{i}", 0, 100, 1, "a") for i in range(4)] + [job("b1", 10, 50, 1, "b")]
    sim, seen = _replay_watched("static", jobs, quotas(a=2, b=2))
    assert max(state.get("a", 0) for state in seen) == 2
    assert lifetimes(sim) == {
        "a0": (0, 100, 0),
        "a1": (0, 100, 0),
        "a2": (100, 200, 0),
        "a3": (100, 200, 0),
        "b1": (10, 60, 0),
    }


def test_static_never_starts_a_job_larger_than_the_teams_quota() -> None:
    jobs = [job("big", 0, 100, 4, "a"), job("b1", 0, 100, 1, "b")]
    _, summary = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "static", EXACT)
    assert (summary["never_started"], summary["teams"]["a"]["never_started"]) == (1, 1)


def test_gpupool_lends_idle_gpus_and_reclaims_them_when_the_owner_returns() -> None:
    jobs = [job(f"a{i}", 0, 1000, 1, "a") for i in range(4)]
    jobs += [job("b1", 50, 100, 1, "b"), job("b2", 50, 100, 1, "b")]
    sim, _ = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", CHECKPOINT_30S)
    runs = sim.runs
    # a borrows b's two GPUs at 0; at 50 b takes them back from two of a's jobs, which
    # lose the 20 s since their checkpoint at 30 s and resume when b is done at 150.
    assert {i: runs[i].first_start for i in runs} == dict.fromkeys(runs, 0) | {"b1": 50, "b2": 50}
    evicted = sorted(i for i in runs if runs[i].preemptions)
    assert len(evicted) == 2
    assert all(runs[i].evictions == ["reclaim"] for i in evicted)
    assert all((runs[i].lost_gpu_s, runs[i].end) == (20.0, 150 + 970) for i in evicted)
    assert (runs["b1"].end, runs["b2"].end) == (150, 150)
    assert sim.eviction_counts == {"reclaim": 2}


def test_gpupool_admits_a_gang_with_all_its_pods_on_whole_nodes() -> None:
    jobs = [job("small", 0, 100, 1, "a"), job("gang", 10, 50, 8, "b", pods=2)]
    sim, _ = simulate(cluster(3, 8), jobs, quotas(a=8, b=16), "gpupool", EXACT)
    gang = sim.runs["gang"]
    assert (gang.first_start, gang.end) == (10, 60)
    assert gang.placement is None  # finished
    assert len(gang.nodes) == 2 and "p-n000" not in gang.nodes  # not the half-used node


def test_gpupool_beats_static_when_one_team_is_idle() -> None:
    jobs = [job(f"a{i}", 0, 100, 1, "a") for i in range(4)]
    _, static = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "static", EXACT)
    _, shared = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", EXACT)
    assert (static["jct_s"]["mean"], shared["jct_s"]["mean"]) == (150.0, 100.0)


def test_time_based_fairness_gets_hourly_usage_records_from_the_replay() -> None:
    config = SchedulerConfig(fairness_half_life_s=3600.0)
    jobs = [job("a1", 0, 7200, 2, "a"), job("b1", 0, 1800, 1, "b")]
    factory = policy_factory("gpupool", config)
    sim = Simulation(cluster(1, 4), jobs, quotas(a=2, b=2), factory, EXACT).run()
    records = sim.policy.usage.records(sim.now)
    assert [(r.queue_id, r.pool, r.start, r.end, r.gpu_seconds) for r in records] == [
        # 2 GPUs for 2 hours: 3600 GPU-s seen at the cycle at 1800 (b's end), then 10800
        # over [1800, 7200) spread evenly: 3600 more in the first hour, 7200 in the second.
        ("a", "p", 0.0, 3600.0, 7200.0),
        ("a", "p", 3600.0, 7200.0, 7200.0),
        ("b", "p", 0.0, 3600.0, 1800.0),
    ]


def test_engine_config_json_sets_known_fields_and_refuses_unknown_ones() -> None:
    config = engine_config({"min_runtime_s": {"": 600}, "default_placement": "spread"})
    assert config.min_runtime_s == {"": 600}
    assert config.default_placement is PlacementStrategy.SPREAD
    with pytest.raises(ValueError, match="unknown engine config keys: colour"):
        engine_config({"colour": "blue"})


def test_gpupool_beats_fifo_on_the_worst_teams_extra_queueing_when_one_team_hogs() -> None:
    # a fills the cluster at 0; b comes back for its quota at 50. Alone on 2 GPUs, b would
    # not wait at all, and a's last two jobs would wait 1000 s (mean 500).
    jobs = [job(f"a{i}", 0, 1000, 1, "a") for i in range(4)]
    jobs += [job("b1", 50, 100, 1, "b"), job("b2", 50, 100, 1, "b")]
    _, fifo = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "fifo", CHECKPOINT_30S)
    _, shared = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", CHECKPOINT_30S)
    # fifo: b waits for a's jobs to end at 1000.
    assert (fifo["worst_team"], fifo["worst_team_extra_queueing_s"]) == ("b", 950.0)
    # gpupool: b reclaims at once; a's two evicted jobs wait 100 s (mean 50 over 4 jobs).
    assert (shared["worst_team"], shared["worst_team_extra_queueing_s"]) == ("b", 0.0)
    assert shared["teams"]["a"]["extra_queueing_s"] == 50.0 - 500.0


def test_gpupool_reclaims_for_guaranteed_work_without_waiting_for_a_checkpoint() -> None:
    # b arrives at 40, 40 s after a's jobs started (checkpoints every 60 s): a's
    # checkpoint is 20 s away, but b is within its guaranteed quota, which means now
    # (issue 24): reclaim takes the GPUs at once, and each victim loses its 40 s.
    jobs = [job(f"a{i}", 0, 1000, 1, "a") for i in range(4)]
    jobs += [job("b1", 40, 100, 1, "b"), job("b2", 40, 100, 1, "b")]
    config = SimConfig(tick=0.0, period=20.0, checkpoint_interval=60.0)
    sim, _ = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", config)
    runs = sim.runs
    assert (runs["b1"].first_start, runs["b2"].first_start) == (40, 40)
    evicted = sorted(i for i in runs if runs[i].preemptions)
    assert len(evicted) == 2
    assert all(runs[i].lost_gpu_s == 40.0 for i in evicted)
