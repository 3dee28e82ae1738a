"""The replay loop with the fifo baseline: order, backfill, gangs, fractions, preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.engine.sim.fifo import FifoPolicy
from scheduling.engine.sim.loop import SimConfig, Simulation
from scheduling.engine.sim.specs import NodeSpec, QuotaSpec, TeamQuota, cluster_from_dict
from scheduling.engine.sim.trace import TraceJob
from scheduling.engine.types import CycleResult, Eviction, EvictionReason

EXACT = SimConfig(tick=0.0, period=0.0)  # a cycle at every event time, nothing batched


def cluster(nodes: int, gpus: int) -> list[NodeSpec]:
    return cluster_from_dict({"pools": [{"name": "p", "nodes": [{"count": nodes, "gpus": gpus}]}]})


def job(id_: str, submit: float, duration: float | None, gpus: float, team: str = "a", pods=1):
    return TraceJob(id_, team, submit, duration, pods, gpus)


def quotas(**deserved: float) -> QuotaSpec:
    return QuotaSpec(
        quotas={team: {"p": TeamQuota(deserved=gpus)} for team, gpus in deserved.items()},
        departments=dict.fromkeys(deserved, "default"),
    )


def replay(nodes, jobs, config: SimConfig = EXACT, policy=FifoPolicy, team_quotas=None):
    return Simulation(nodes, jobs, team_quotas or quotas(a=1), policy, config).run()


def starts(sim: Simulation) -> dict[str, tuple[float | None, float | None]]:
    return {i: (run.first_start, run.end) for i, run in sim.runs.items()}


def test_fifo_starts_jobs_in_submission_order_when_they_wait_for_the_same_gpus() -> None:
    sim = replay(cluster(1, 2), [job("A", 0, 100, 2), job("B", 10, 100, 2), job("C", 20, 50, 2)])
    assert starts(sim) == {"A": (0, 100), "B": (100, 200), "C": (200, 250)}
    assert {i: r.queued for i, r in sim.runs.items()} == {"A": 0, "B": 90, "C": 180}


def test_fifo_backfills_a_small_job_past_one_that_does_not_fit() -> None:
    sim = replay(cluster(1, 2), [job("A", 0, 100, 1), job("B", 1, 10, 2), job("C", 2, 10, 1)])
    assert starts(sim) == {"A": (0, 100), "B": (100, 110), "C": (2, 12)}


def test_events_in_one_tick_are_batched_into_one_cycle_at_the_tick() -> None:
    config = SimConfig(tick=60.0, period=0.0)
    sim = replay(cluster(1, 2), [job("A", 5, 100, 1), job("B", 59, 100, 1)], config)
    assert starts(sim) == {"A": (60, 160), "B": (60, 160)}
    assert sim.cycles == 2  # one for both submits, one for both finishes


def test_a_gang_gets_all_its_pods_on_separate_nodes_or_waits_for_them() -> None:
    jobs = [job("small", 0, 100, 1), job("gang", 10, 50, 8, pods=2)]
    sim = replay(cluster(2, 8), jobs)
    assert starts(sim) == {"small": (0, 100), "gang": (100, 150)}
    gang = sim.runs["gang"]
    assert gang.nodes == ("p-n000", "p-n001")
    assert sim.cluster.allocated == 0


def test_fractional_jobs_share_one_gpu_before_opening_another() -> None:
    jobs = [job("x", 0, None, 0.5), job("y", 0, None, 0.5), job("z", 0, None, 0.25)]
    sim = replay(cluster(1, 2), jobs)
    gpus = sim.cluster.nodes[0].gpus
    assert gpus[0].shares == [("x", 0.5), ("y", 0.5)]
    assert gpus[1].shares == [("z", 0.25)]
    assert sim.cluster.allocated == pytest.approx(1.25)


def test_a_job_that_never_ends_keeps_its_gpus_and_the_replay_still_stops() -> None:
    sim = replay(cluster(1, 1), [job("forever", 0, None, 1), job("next", 5, 10, 1)])
    assert starts(sim) == {"forever": (0, None), "next": (None, None)}
    assert sim.runs["next"].pending_since == 5


class EvictOnce:
    """A scripted policy: fifo, plus one eviction of `victim` at `at`."""

    name = "evict-once"

    def __init__(self, sim: Simulation, victim: str = "A", at: float = 2500.0) -> None:
        self.fifo, self.victim, self.at = FifoPolicy(sim), victim, at

    def decide(self, sim: Simulation, now: float) -> CycleResult:
        if now == self.at and self.victim in sim.running:
            eviction = Eviction(self.victim, EvictionReason.RECLAIM)
            return CycleResult(evictions=(eviction,))
        return self.fifo.decide(sim, now)


def test_a_preempted_job_resumes_from_its_last_checkpoint_and_the_rest_is_counted_lost() -> None:
    config = SimConfig(tick=0.0, period=0.0, checkpoint_interval=1800.0)
    jobs = [job("A", 0, 4000, 2), job("clock", 2500, 1, 0.5)]  # a submit makes a cycle at 2500
    sim = replay(cluster(1, 2), jobs, config, policy=EvictOnce)
    a = sim.runs["A"]
    # 2500 s done, 1800 s saved: 700 s x 2 GPUs lost; the follow-up cycle one second later
    # re-admits it with 2200 s left.
    assert (a.preemptions, a.lost_gpu_s, a.first_start, a.end) == (1, 1400.0, 0, 4701.0)
    assert a.queued == 1.0
    assert a.evictions == ["reclaim"]
    assert sim.eviction_counts == {"reclaim": 1}


def test_checkpoints_count_progress_from_the_job_start_not_the_clock() -> None:
    config = SimConfig(tick=0.0, period=0.0, checkpoint_interval=1000.0)
    jobs = [job("A", 300, 4000, 1), job("clock", 1500, 1, 0.5)]
    sim = replay(cluster(1, 2), jobs, config, policy=lambda s: EvictOnce(s, at=1500.0))
    a = sim.runs["A"]
    assert (a.saved, a.lost_gpu_s, a.end) == (1000.0, 200.0, 1501.0 + 3000.0)


def test_a_job_preempted_before_its_first_checkpoint_loses_everything() -> None:
    config = SimConfig(tick=0.0, period=0.0, checkpoint_interval=1800.0)
    jobs = [job("A", 0, 4000, 1), job("clock", 600, 1, 0.5)]
    sim = replay(cluster(1, 2), jobs, config, policy=lambda s: EvictOnce(s, at=600.0))
    assert (sim.runs["A"].lost_gpu_s, sim.runs["A"].end) == (600.0, 4601.0)


def test_gpu_models_restrict_where_a_job_may_run() -> None:
    nodes = cluster_from_dict(
        {
            "pools": [
                {"name": "p", "nodes": [{"name": "old", "gpus": 2, "gpu_model": "V100"}]},
                {"name": "q", "nodes": [{"name": "new", "gpus": 2, "gpu_model": "H100"}]},
            ]
        }
    )
    jobs = [replace(job("A", 0, 10, 1), gpu_models=("H100",)), job("B", 0, 10, 2)]
    sim = replay(nodes, jobs)
    assert (sim.runs["A"].nodes, sim.runs["B"].nodes) == (("new",), ("old",))
