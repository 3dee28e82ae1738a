"""Trace columns topology_level / topology_required and CPU-only jobs (gpus = 0), read and
replayed under the fifo baseline and the engine (issue 17)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduling.engine.sim.cli import policy_factory, simulate
from scheduling.engine.sim.fifo import FifoPolicy
from scheduling.engine.sim.loop import Simulation
from scheduling.engine.sim.specs import cluster_from_dict
from scheduling.engine.sim.trace import TraceError, TraceJob, read_trace
from scheduling.engine.types import SchedulerConfig
from tests.engine.test_sim_replay import EXACT, job, quotas

POLICIES = {"fifo": FifoPolicy, "gpupool": policy_factory("gpupool", SchedulerConfig())}


def _read(tmp_path: Path, text: str) -> list[TraceJob]:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return read_trace(path)[0]


def test_topology_columns_are_read_required_by_default(tmp_path: Path) -> None:
    jobs = _read(
        tmp_path,
        "id,submit_time,duration_s,team,gpus,topology_level,topology_required\n"
        "a,0,5,t,16,rack,\nb,0,5,t,16,rack,no\nc,0,5,t,16,,\n",
    )
    assert [(j.id, j.topology_level, j.topology_required) for j in jobs] == [
        ("a", "rack", True),
        ("b", "rack", False),
        ("c", "", True),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,5,t,16,zone,", "row 2: topology_level must be one of rack, not 'zone'"),
        ("0,5,t,16,,yes", "row 2: topology_required needs a topology_level"),
        ("0,5,t,16,rack,sometimes", "row 2: not a yes/no value"),
    ],
)
def test_bad_topology_cells_name_the_row(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        _read(
            tmp_path, f"submit_time,duration_s,team,gpus,topology_level,topology_required\n{row}\n"
        )


def test_a_cpu_only_job_has_gpus_0_and_must_ask_for_cpu_or_memory(tmp_path: Path) -> None:
    head = "submit_time,duration_s,team,gpus,cpu,memory_gib\n"
    (cpu_job,) = _read(tmp_path, head + "0,5,t,0,4,\n")
    (memory_job,) = _read(tmp_path, head + "0,5,t,0,,8\n")
    assert cpu_job.is_cpu_only and cpu_job.gpus == 0 and cpu_job.cpu == 4
    assert memory_job.is_cpu_only and memory_job.memory_gib == 8
    with pytest.raises(TraceError, match="row 2: a CPU-only job .* must ask for cpu or memory_gib"):
        _read(tmp_path, head + "0,5,t,0,,\n")


def _racks() -> list:
    # Two racks of two 4-GPU nodes; the racks differ in GPU model so that a job pinned to
    # a model lands in its rack.
    entries = [
        {"count": 2, "gpus": 4, "gpu_model": m, "rack": f"r-{m}", "cpu": 16} for m in ("X", "Y")
    ]
    return cluster_from_dict({"pools": [{"name": "p", "nodes": entries}]})


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_gang_that_requires_one_rack_waits_for_one_while_a_preferring_one_spreads(policy):
    # Each rack keeps one node busy: 8 GPUs are free, but 4 in each rack.
    busy = [
        replace(job("rx", 0, 1000, 4), gpu_models=("X",)),
        replace(job("ry", 0, 1000, 4), gpu_models=("Y",)),
    ]
    gang = replace(job("g", 10, 100, 4, pods=2), topology_level="rack")
    nodes = _racks()
    rack_of = {n.name: n.rack for n in nodes}

    def run(*jobs):
        sim = Simulation(nodes, [*busy, *jobs], quotas(a=16), POLICIES[policy], EXACT).run()
        return sim.runs

    required = run(gang)
    assert required["g"].first_start == 1000  # waits until a rack has room for both pods
    assert len({rack_of[n] for n in required["g"].nodes}) == 1
    preferred = run(replace(gang, topology_required=False))
    assert preferred["g"].first_start == 10  # spreads over the racks at once
    assert len({rack_of[n] for n in preferred["g"].nodes}) == 2
    plain = run(replace(gang, topology_level=""))
    assert plain["g"].first_start == 10


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_cpu_only_jobs_run_next_to_gpu_work_within_the_nodes_cpu(policy):
    # One node: its GPUs are all taken, but CPU-only pods still fit beside them, up to the
    # node's 16 cores.
    nodes = cluster_from_dict({"pools": [{"name": "p", "nodes": [{"gpus": 4, "cpu": 16}]}]})
    gpu_job = replace(job("g", 0, 1000, 4), cpu=4.0)
    cpu_jobs = [replace(job(f"c{i}", 10, 100, 0), cpu=6.0) for i in range(3)]
    sim = Simulation(nodes, [gpu_job, *cpu_jobs], quotas(a=4), POLICIES[policy], EXACT).run()
    runs = sim.runs
    assert [runs[c].first_start for c in ("c0", "c1", "c2")] == [10, 10, 110]
    assert [runs[c].end for c in ("c0", "c1", "c2")] == [110, 110, 210]
    # CPU-only pods hold no GPU: GPU-time counts only the GPU job (4 GPUs x 1000 s).
    assert sim.recorder.allocated_total == pytest.approx(4000.0)


def test_a_team_of_cpu_only_jobs_gets_a_private_baseline_node_without_gpus():
    nodes = cluster_from_dict({"pools": [{"name": "p", "nodes": [{"count": 2, "gpus": 4}]}]})
    jobs = [job("g", 0, 100, 4, team="gpu"), replace(job("c", 0, 100, 0, team="cpu"), cpu=2.0)]
    _, summary = simulate(nodes, jobs, quotas(gpu=8), "gpupool", EXACT)
    private = summary["teams"]["cpu"]["private_cluster"]
    assert private["gpus"] == 0 and private["queueing_delay_s_mean"] == 0
