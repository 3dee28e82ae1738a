"""Elastic jobs in the replay: trace rows with min_pods/max_pods, work that scales with the
size, restarts from the checkpoint on a size change, and the trace made elastic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduling.engine.sim.cli import simulate
from scheduling.engine.sim.loop import SimConfig
from scheduling.engine.sim.trace import TraceError, made_elastic, read_trace
from tests.engine.test_sim_replay import EXACT, cluster, job, quotas

CHECKPOINT_30S = SimConfig(tick=0.0, period=0.0, checkpoint_interval=30.0)


def _trace(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("submit_time,duration_s,team,gpus,min_pods,max_pods,handles_resize\n" + rows)
    return path


def test_a_row_with_min_and_max_pods_is_an_elastic_job_of_per_pod_gpus(tmp_path) -> None:
    jobs, _ = read_trace(_trace(tmp_path, "0,100,a,2,1,4,yes\n10,100,a,8,,,\n"))
    elastic, rigid = jobs
    assert (elastic.pods, elastic.gpus_per_pod, elastic.min_pods, elastic.elastic) == (
        4,
        2.0,
        1,
        True,
    )
    assert elastic.handles_resize and not rigid.elastic and rigid.pods == 1


@pytest.mark.parametrize("row", ["0,100,a,1,5,4,\n", "0,100,a,1,0,4,\n", "0,100,a,1,x,4,\n"])
def test_a_bad_range_names_the_row(tmp_path, row) -> None:
    with pytest.raises(TraceError, match="row 2"):
        read_trace(_trace(tmp_path, row))


def test_an_elastic_job_runs_at_its_size_and_finishes_later_when_smaller() -> None:
    # 4 pods for 100 s of full-size work, on 2 GPUs: it runs at half speed, 200 s.
    elastic = replace(job("e", 0, 100, 1, pods=4), min_pods=2)
    sim, summary = simulate(cluster(1, 2), [elastic], quotas(a=2), "gpupool", EXACT)
    assert (sim.runs["e"].first_start, sim.runs["e"].end) == (0, 200)
    assert summary["elastic_jobs"] == 1


def test_a_job_grows_when_gpus_free_up_and_restarts_from_its_checkpoint() -> None:
    # e starts with 2 of its 4 pods while r holds 2 GPUs until 50; it then grows to 4 and
    # restarts from its checkpoint. Checkpoints come every 30 s of full-size work: at half
    # speed it has done 25 s by 50, none saved, so it starts over (50 GPU-s lost).
    jobs = [replace(job("e", 0, 100, 1, pods=4), min_pods=2), job("r", 0, 50, 2, team="b")]
    sim, summary = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", CHECKPOINT_30S)
    run = sim.runs["e"]
    assert (run.resizes, summary["resizes"]) == (1, 1)
    assert run.end == pytest.approx(50 + 100)
    assert run.lost_gpu_s == pytest.approx(50 * 2)


def test_a_job_that_handles_resizing_loses_nothing_when_it_grows() -> None:
    e = replace(job("e", 0, 100, 1, pods=4), min_pods=2, handles_resize=True)
    jobs = [e, job("r", 0, 50, 2, team="b")]
    sim, _ = simulate(cluster(1, 4), jobs, quotas(a=2, b=2), "gpupool", CHECKPOINT_30S)
    assert sim.runs["e"].end == pytest.approx(50 + 75)  # 25 s of full work done by 50
    assert sim.runs["e"].lost_gpu_s == 0


def test_jobs_of_eight_gpus_or_more_are_made_elastic_in_one_gpu_pods() -> None:
    jobs = [job("small", 0, 10, 4), job("eight", 0, 10, 8), job("gang", 0, 10, 8, pods=2)]
    small, eight, gang = made_elastic(jobs, 8)
    assert small == jobs[0]
    assert (eight.pods, eight.gpus_per_pod, eight.min_pods) == (8, 1.0, 4)
    assert (gang.pods, gang.min_pods, gang.gpus) == (16, 8, 16)
