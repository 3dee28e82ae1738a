"""The summary's figures on cases small enough to check by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scheduling.engine.sim.baseline import private_nodes
from scheduling.engine.sim.cli import main, simulate
from scheduling.engine.sim.loop import SimConfig
from scheduling.engine.sim.metrics import jain_index, percentile, water_fill
from scheduling.engine.sim.specs import NodeSpec
from scheduling.engine.sim.trace import TraceJob
from tests.engine.test_sim_replay import EXACT, cluster, job, quotas


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, 1.0, 1.0], 1.0), ([1.0, 0.0], 0.5), ([2.0, 1.0], 0.9), ([3.0, 0.0, 0.0], 1 / 3)],
    ids=["equal", "one-takes-all-of-two", "two-to-one", "one-takes-all-of-three"],
)
def test_jains_index_matches_the_formula(values: list[float], expected: float) -> None:
    assert jain_index(values) == pytest.approx(expected)


def test_the_p95_is_the_nearest_rank_value() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20: the 19th of 20 is the p95
    assert percentile(values, 0.95) == 19.0
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([], 0.95) is None


def test_water_filling_gives_deserved_first_then_splits_the_rest_by_weight() -> None:
    share = water_fill(
        capacity=10,
        demand={"a": 10, "b": 10, "c": 1},
        deserved={"a": 2, "b": 2, "c": 2},
        weight={"a": 3, "b": 1, "c": 1},
        limit={"a": None, "b": 3, "c": None},
    )
    # c needs only 1; b is capped at 3; a takes the 6 left over.
    assert share == pytest.approx({"a": 6.0, "b": 3.0, "c": 1.0})


def test_received_over_entitled_and_jain_index_on_a_two_team_cluster() -> None:
    # Two GPUs, quotas 1 + 1. Team a asks for 2 GPUs from 0 to 100, b asks for 1 from 50.
    # Under fifo a holds both GPUs; b waits until 100. Window [0, 50] (last submit at 50).
    jobs = [job("a1", 0, 100, 1, "a"), job("a2", 0, 100, 1, "a"), job("b1", 50, 10, 1, "b")]
    sim, summary = simulate(cluster(1, 2), jobs, quotas(a=1, b=1), "fifo", EXACT)
    teams = summary["teams"]
    # Over [0, 50] b asked for nothing, so a was entitled to both GPUs and got them.
    assert teams["a"]["received_gpu_hours"] == round(100 / 3600, 2)
    assert teams["a"]["received_over_entitled"] == 1.0
    assert teams["b"]["received_over_entitled"] is None  # no demand inside the window
    assert summary["fairness_jain"] == 1.0
    assert summary["gpu_allocation"] == 1.0
    assert teams["b"]["queueing_delay_s"] == {"mean": 50.0, "p95": 50.0}


def test_fairness_drops_when_a_team_waits_behind_another_teams_borrowed_gpus() -> None:
    jobs = [job("a1", 0, 100, 1, "a"), job("a2", 0, 100, 1, "a"), job("b1", 20, 10, 1, "b")]
    jobs.append(job("end", 60, 1, 1, "a"))  # stretches the window to 60 s
    _, summary = simulate(cluster(1, 2), jobs, quotas(a=1, b=1), "fifo", EXACT)
    teams = summary["teams"]
    # b was entitled to 1 GPU over [20, 60] and got nothing: ratio 0; a got 120 of 80.
    assert teams["b"]["received_over_entitled"] == 0.0
    assert teams["a"]["received_over_entitled"] == 1.5
    assert summary["fairness_jain"] == 0.5


def test_extra_queueing_compares_with_a_private_cluster_of_the_teams_quota() -> None:
    # Alone on its 1-GPU quota, team a runs its two jobs one after the other (waits 0 and
    # 100: mean 50); in the shared 2-GPU cluster both start at once.
    jobs = [job("a1", 0, 100, 1, "a"), job("a2", 0, 100, 1, "a"), job("b1", 0, 100, 1, "b")]
    _, summary = simulate(cluster(1, 3), jobs, quotas(a=1, b=2), "fifo", EXACT)
    a = summary["teams"]["a"]
    assert a["private_cluster"] == {
        "gpus": 1,
        "grown_to_fit_largest_job": False,
        "queueing_delay_s_mean": 50.0,
        "within_quota": {  # nothing is larger than the quota: the same replay
            "gpus": 1,
            "jobs_compared": 2,
            "jobs_larger_than_quota": 0,
            "queueing_delay_s_mean": 50.0,
            "shared_queueing_delay_s_mean": 0.0,
        },
    }
    assert a["extra_queueing_s"] == a["extra_queueing_within_quota_s"] == -50.0
    assert summary["teams"]["b"]["extra_queueing_s"] == 0.0
    assert (summary["worst_team"], summary["worst_team_extra_queueing_s"]) == ("b", 0.0)


def test_within_quota_leaves_out_the_jobs_a_cluster_of_the_quota_could_never_run() -> None:
    # Team a (quota 1) runs a 10 s 1-GPU job, then a 2-GPU job that only the grown private
    # cluster (2 GPUs) can hold, where it waits 9 s. In the shared 3-GPU cluster b's 2-GPU
    # job, submitted first, keeps it waiting 98 s: against the grown cluster a is worse
    # off; against a cluster of its quota, over the job that fits there, it is not.
    jobs = [
        job("b1", 0, 100, 2, "b"),
        job("a1", 1, 10, 1, "a"),
        TraceJob("a2", "a", 2.0, 100.0, 1, 2.0),
    ]
    _, summary = simulate(cluster(1, 3), jobs, quotas(a=1, b=2), "fifo", EXACT)
    a = summary["teams"]["a"]
    assert a["private_cluster"]["grown_to_fit_largest_job"]
    assert a["private_cluster"]["gpus"] == 2
    assert a["extra_queueing_s"] > 0
    within = a["private_cluster"]["within_quota"]
    assert within["gpus"] == 1
    assert (within["jobs_compared"], within["jobs_larger_than_quota"]) == (1, 1)
    assert within["queueing_delay_s_mean"] == within["shared_queueing_delay_s_mean"] == 0.0
    assert a["extra_queueing_within_quota_s"] == 0.0
    assert summary["worst_team"] == "a"
    assert summary["worst_team_extra_queueing_within_quota_s"] <= 0.0


def test_a_private_cluster_grows_to_hold_the_teams_largest_gang() -> None:
    shared = cluster(4, 8)
    gang = TraceJob("g", "a", 0.0, 10.0, 2, 8.0)
    nodes, grown = private_nodes("a", quotas(a=5), shared, [gang])
    assert grown
    assert [n.gpus for n in nodes] == [8, 8]
    nodes, grown = private_nodes("a", quotas(a=20), shared, [gang])
    assert not grown
    assert [n.gpus for n in nodes] == [8, 8, 4]
    assert all(isinstance(n, NodeSpec) and n.pool == "p" for n in nodes)


def test_the_command_line_writes_the_summary_workloads_and_quotas(tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"pools": [{"name": "p", "nodes": [{"gpus": 2}]}]}))
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time,duration_s,gpus,team\n0,100,2,a\n30,50,1,b\n")
    out = tmp_path / "out"
    argv = ["--cluster", str(cluster_file), "--trace", str(trace), "--policy", "fifo"]
    assert main([*argv, "--out", str(out), "--tick", "10"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["policy"], summary["jobs"], summary["finished"]) == ("fifo", 2, 2)
    assert summary["queueing_delay_s"] == {"mean": 35.0, "p95": 70.0}  # b waits 30 to 100
    rows = list(csv.DictReader((out / "workloads.csv").open()))
    assert [(r["id"], r["start"], r["end"], r["nodes"]) for r in rows] == [
        ("j00001", "0.0", "100.0", "p-n000"),
        ("j00002", "100.0", "150.0", "p-n000"),
    ]
    quotas_written = json.loads((out / "quotas.json").read_text())
    assert quotas_written["teams"]["a"]["pools"]["p"]["deserved"] == 2.0  # 200 of 250 GPU-s


def test_plot_draws_each_teams_extra_queueing_for_this_run_and_the_compared_ones(
    tmp_path: Path,
) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"pools": [{"name": "p", "nodes": [{"gpus": 2}]}]}))
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time,duration_s,gpus,team\n0,100,2,a\n30,50,1,b\n")
    argv = ["--cluster", str(cluster_file), "--trace", str(trace), "--tick", "10"]
    assert main([*argv, "--policy", "fifo", "--out", str(tmp_path / "fifo")]) == 0
    png = tmp_path / "teams.png"
    compare = ["--compare", str(tmp_path / "fifo"), "--plot", str(png)]
    assert main([*argv, "--policy", "gpupool", "--out", str(tmp_path / "gp"), *compare]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    assert main([*argv, "--no-baseline", "--plot", str(png), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.parametrize(
    ("trace_text", "engine", "message"),
    [
        ("submit_time,duration_s,gpus,team\nsoon,100,2,a\n", None, "row 2: Invalid isoformat"),
        ("submit_time,duration_s,gpus,team\n0,100,1.5,a\n", None, "row 2: gpus must be"),
        (None, None, "No such file or directory"),
        ("submit_time,duration_s,gpus,team\n0,100,1,a\n", '{"nope": 1}', "unknown engine"),
        ("submit_time,duration_s,gpus,team\n0,100,1,a\n", "{", "engine.json: Expecting"),
    ],
)
def test_bad_inputs_end_with_one_line_naming_the_problem_and_write_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    trace_text: str | None,
    engine: str | None,
    message: str,
) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"pools": [{"name": "p", "nodes": [{"gpus": 2}]}]}))
    trace = tmp_path / "trace.csv"
    if trace_text is not None:
        trace.write_text(trace_text)
    argv = ["--cluster", str(cluster_file), "--trace", str(trace), "--out", str(tmp_path / "out")]
    if engine is not None:
        (tmp_path / "engine.json").write_text(engine)
        argv += ["--engine-config", str(tmp_path / "engine.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m scheduling.engine.sim: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_job_that_never_starts_counts_its_wait_until_the_replay_gives_up() -> None:
    config = SimConfig(tick=0.0, period=600.0, idle_cycles_to_stop=6)
    jobs = [job("forever", 0, None, 1), job("next", 5, 10, 1)]
    sim, summary = simulate(cluster(1, 1), jobs, quotas(a=1), "fifo", config)
    # The cycle at 5 s and five periodic ones find nothing to do: the replay stops at 3005 s.
    assert sim.now == 3005.0
    assert (summary["never_started"], summary["finished"]) == (1, 0)
    assert summary["queueing_delay_s"] == {"mean": 1500.0, "p95": 3000.0}
