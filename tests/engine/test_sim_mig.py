"""MIG in the simulator (issue 14): trace and cluster columns, dynamic vs static layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.engine.sim.cli import main, simulate
from scheduling.engine.sim.loop import SimConfig
from scheduling.engine.sim.mig_trace import Params, rows
from scheduling.engine.sim.specs import SpecError, cluster_from_dict, load_json
from scheduling.engine.sim.trace import TraceError, TraceJob, read_trace

SIM = Path(__file__).resolve().parents[2] / "sim"
HEADER = "submit_time,duration_s,team,gpus,mig_profile,gpu_memory_mib\n"


def _trace(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "".join(f"{line}\n" for line in lines))
    return path


def _cluster(**entry: object) -> dict[str, object]:
    node = {"gpus": 8, "gpu_model": "H100", "gpu_memory_mib": 81920, "mig_gpus": 8, **entry}
    return {"pools": [{"name": "h100", "nodes": [node]}]}


def test_trace_rows_ask_a_mig_profile_or_memory_and_count_its_slices(tmp_path: Path) -> None:
    jobs, _ = read_trace(_trace(tmp_path, "0,60,a,,3g.40gb,", "5,60,a,1,auto,15000"))
    assert [(j.mig_profile, j.gpu_memory_mib, j.pods) for j in jobs] == [
        ("3g.40gb", 0, 1),
        ("auto", 15000, 1),
    ]
    assert jobs[0].gpus_per_pod == pytest.approx(3 / 7)
    assert jobs[1].gpus_per_pod == pytest.approx(1 / 7)  # 1g.20gb holds 15000 MiB
    assert not any(j.is_fractional for j in jobs)


@pytest.mark.parametrize(
    ("cells", "field"),
    [
        ("0,60,a,,9g.1tb,", "mig_profile"),
        ("0,60,a,,auto,", "gpu_memory_mib"),
        ("0,60,a,,auto,lots", "gpu_memory_mib"),
        ("0,60,a,,3g.40gb,20000", "gpu_memory_mib"),
        ("0,60,a,0.5,,20000", "gpu_memory_mib"),
        ("0,60,a,2,3g.40gb,", "gpus"),
    ],
)
def test_the_reader_refuses_a_bad_mig_cell_naming_the_field(
    tmp_path: Path, cells: str, field: str
) -> None:
    with pytest.raises(TraceError, match=rf"row 2: {field}:"):
        read_trace(_trace(tmp_path, cells))


def test_cluster_nodes_have_mig_gpus_and_a_static_layout_at_the_engine_s_starts() -> None:
    layout = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    (node,) = cluster_from_dict(_cluster(mig_gpus=4, mig_layout=layout))
    assert node.mig_gpus == 4
    assert node.mig_layout == (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"mig_gpus": 9}, "mig_gpus must be"),
        ({"gpu_model": "T4", "gpu_memory_mib": 15360}, "mig_gpus: GPU model 'T4' has no MIG"),
        ({"mig_layout": ["3g.20gb"]}, "mig_layout: H100-80GB has no profile '3g.20gb'"),
        ({"mig_layout": ["7g.80gb", "1g.10gb"]}, "mig_layout: 1g.10gb does not fit"),
        ({"mig_layout": ["3g.40gb"]}, "mig_layout leaves room"),
        ({"mig_gpus": 0, "mig_layout": ["7g.80gb"]}, "mig_layout needs mig_gpus"),
    ],
)
def test_a_bad_mig_node_entry_is_refused_naming_the_field(
    entry: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        cluster_from_dict(_cluster(**entry))


def _replay(layout: str) -> dict[str, object]:
    nodes = cluster_from_dict(load_json(SIM / "mig-cluster.json"))
    jobs, _ = read_trace(SIM / "mig-trace.csv")
    config = SimConfig(mig_layout=layout)
    sim, summary = simulate(nodes, jobs, config=config, baselines=False)
    static = sorted(nodes[0].mig_layout)
    summary["final_layouts"] = {
        sorted((i.profile, i.start) for i in gpu.instances) == static
        for node in sim.cluster.nodes
        for gpu in node.gpus
    }
    return summary


def test_a_static_layout_is_never_repartitioned_where_dynamic_mig_is() -> None:
    static, dynamic = _replay("static")["mig"], _replay("dynamic")["mig"]
    assert (static["instances_created"], static["instances_destroyed"]) == (0, 0)
    assert static["repartitions"] == 0
    assert static["instances_reused"] == static["jobs"] == 451
    assert dynamic["repartitions"] > 0 and dynamic["instances_destroyed"] > 0
    assert dynamic["instances_reused"] > 0


def test_the_static_replay_ends_with_every_mig_gpu_in_its_layout() -> None:
    assert _replay("static")["final_layouts"] == {True}


def test_the_committed_trace_is_what_its_generator_makes() -> None:
    lines = (SIM / "mig-trace.csv").read_text().splitlines()[1:]
    made = [",".join(str(cell) for cell in row) for row in rows(Params())]
    assert lines == made


def test_mig_jobs_need_the_engine_and_no_private_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--cluster", str(SIM / "mig-cluster.json"), "--trace", str(SIM / "mig-trace.csv")]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "--no-baseline" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    bare.write_text(
        '{"pools": [{"name": "p", "nodes": [{"gpus": 8, "gpu_model": "H100",'
        ' "gpu_memory_mib": 81920, "mig_gpus": 2}]}]}'
    )
    static = ["--cluster", str(bare), "--trace", str(SIM / "mig-trace.csv"), "--no-baseline"]
    assert main([*static, "--mig-layout", "static", "--out", str(tmp_path / "s")]) == 2
    assert "has no mig_layout" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_trace_job_without_mig_keeps_its_old_defaults() -> None:
    job = TraceJob("j", "t", 0.0, 1.0, 1, 0.5)
    assert (job.mig_profile, job.gpu_memory_mib, job.is_fractional) == ("", 0, True)
