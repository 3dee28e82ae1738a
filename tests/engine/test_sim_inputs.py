"""The simulator reads traces, cluster and quota descriptions as documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.engine.sim.specs import (
    SpecError,
    cluster_from_dict,
    largest_remainder,
    proportional_quotas,
    quotas_from_dict,
    quotas_to_dict,
)
from scheduling.engine.sim.trace import TraceError, TraceJob, read_trace


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_a_philly_style_trace_gets_shifted_times_and_gangs_of_eight_gpu_pods(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        "submit_time,duration_s,gpus,team\n"
        "2017-10-23 00:01:40,100.0,1,a\n"
        "2017-10-23 00:00:40,50,16,b\n"
        "2017-10-23 00:02:40,,12,a\n",
    )
    jobs, origin = read_trace(path)
    assert origin == 1508716840.0  # 2017-10-23T00:00:40Z
    assert [(j.id, j.submit, j.duration, j.pods, j.gpus_per_pod) for j in jobs] == [
        ("j00002", 0.0, 50.0, 2, 8.0),
        ("j00001", 60.0, 100.0, 1, 1.0),
        ("j00003", 120.0, None, 2, 6.0),
    ]


def test_optional_columns_give_models_fractions_host_resources_and_priority(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        "id,submit_time,duration_s,team,pods,gpus,gpu_model,cpu,memory_gib,priority,preemptible\n"
        "x,10,5,t,3,0.47,A100|H100,4,16,7,no\n",
    )
    (job,), _ = read_trace(path)
    assert job == TraceJob(
        id="x",
        team="t",
        submit=0.0,
        duration=5.0,
        pods=3,
        gpus_per_pod=0.47,
        gpu_models=("A100", "H100"),
        cpu=4.0,
        memory_gib=16.0,
        priority=7,
        preemptible=False,
    )
    assert job.is_fractional
    assert job.gpus == pytest.approx(1.41)


@pytest.mark.parametrize("gpus", ["1.5", "-1", "0"])
def test_a_gpu_count_that_is_neither_whole_nor_a_fraction_names_the_row(
    tmp_path: Path, gpus: str
) -> None:
    path = _write(tmp_path, f"submit_time,duration_s,gpus,team\n0,1,1,a\n0,1,{gpus},a\n")
    with pytest.raises(TraceError, match="row 3"):
        read_trace(path)


def test_node_groups_expand_into_named_nodes_in_racks() -> None:
    nodes = cluster_from_dict(
        {
            "pools": [
                {"name": "a", "nodes": [{"count": 3, "gpus": 8, "nodes_per_rack": 2}]},
                {"name": "b", "nodes": [{"name": "big", "gpus": 4, "rack": "r9", "cpu": 32}]},
            ]
        }
    )
    assert [(n.name, n.pool, n.gpus, n.rack, n.cpu) for n in nodes] == [
        ("a-n000", "a", 8, "a-r00", None),
        ("a-n001", "a", 8, "a-r00", None),
        ("a-n002", "a", 8, "a-r01", None),
        ("big", "b", 4, "r9", 32.0),
    ]


def test_a_cluster_without_nodes_is_refused() -> None:
    with pytest.raises(SpecError):
        cluster_from_dict({"pools": [{"name": "a", "nodes": []}]})


def test_quotas_read_back_what_they_write() -> None:
    data = {
        "teams": {
            "vision": {
                "department": "research",
                "pools": {"a": {"deserved": 16.0, "limit": 32.0, "weight": 2.0}},
            }
        }
    }
    spec = quotas_from_dict(data)
    assert spec.deserved("vision") == 16.0
    assert spec.departments == {"vision": "research"}
    assert quotas_to_dict(spec) == data


def test_largest_remainder_splits_exactly_and_breaks_ties_by_name() -> None:
    assert largest_remainder({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert largest_remainder({"a": 3, "b": 1}, 8) == {"a": 6, "b": 2}


def test_generated_quotas_follow_each_teams_gpu_hours() -> None:
    nodes = cluster_from_dict({"pools": [{"name": "p", "nodes": [{"count": 2, "gpus": 8}]}]})
    jobs = [
        TraceJob("1", "a", 0.0, 3600.0, 1, 3.0),  # 3 GPU-hours
        TraceJob("2", "b", 0.0, 3600.0, 1, 1.0),  # 1 GPU-hour
        TraceJob("3", "b", 7200.0, None, 1, 0.0 + 1.0),  # never ends: counts to last submit
    ]
    spec = proportional_quotas(jobs, nodes)
    # a: 3 GPU-h, b: 1 + 0 (submitted at the last submit, so it counts for no time).
    assert {t: spec.deserved(t) for t in spec.quotas} == {"a": 12.0, "b": 4.0}
    assert spec.quotas["a"]["p"].weight == 12.0
