"""apply_result chains cycles; the benchmark entry point prints what it promises."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scheduling.engine import bench
from scheduling.engine.apply import apply_changes, apply_result, remove_workloads
from scheduling.engine.arrival import run_arrival
from scheduling.engine.cycle import schedule
from scheduling.engine.types import (
    Admission,
    CycleResult,
    Eviction,
    EvictionReason,
    Gpu,
    GpuShare,
    PodPlacement,
    Resource,
    SchedulerConfig,
    Snapshot,
    UsageRecord,
)
from tests.engine.builders import dept, frac, job, nodes, project, run, running, snapshot
from tests.engine.test_properties import NOW, random_snapshot


def test_admissions_become_placements_and_device_holders() -> None:
    snap = snapshot(
        nodes(1, gpus=2),
        [dept(), project("p1", deserved=2)],
        [job("w", "p1"), frac("f", "p1", 0.5)],
    )
    result = CycleResult(
        admissions=(
            Admission("w", (PodPlacement(0, "n0", gpus=(0,)),)),
            Admission("f", (PodPlacement(0, "n0", shared_gpu=1, share=0.5, gpu_memory_mib=20480),)),
        )
    )
    after = apply_result(snap, result, now=42.0)
    by_id = {wl.id: wl for wl in after.workloads}
    assert by_id["w"].placement == (PodPlacement(0, "n0", gpus=(0,)),)
    assert by_id["w"].started_at == 42.0
    assert after.nodes[0].gpus == (
        Gpu(0, "A100", 40960, whole_by="w"),
        Gpu(1, "A100", 40960, shares=(GpuShare("f", 0.5, 20480),)),
    )


def test_an_evicted_workload_goes_back_to_pending_and_frees_its_devices() -> None:
    snap = snapshot(
        nodes(1, gpus=1),
        [dept(), project("p1", deserved=1)],
        [running(job("w", "p1", last_checkpoint_time=5.0), "n0", [0], started=1.0)],
    )
    after = apply_result(snap, CycleResult(evictions=(Eviction("w", EvictionReason.PREEMPT),)), 9)
    (wl,) = after.workloads
    assert (wl.placement, wl.started_at, wl.last_checkpoint_time) == (None, None, 5.0)
    assert after.nodes[0].gpus[0].whole_by is None


def test_removing_finished_work_frees_its_devices_but_not_foreign_ones() -> None:
    cluster = nodes(1, gpus=2)
    foreign = (
        cluster[0].__class__(
            **{
                **{
                    f: getattr(cluster[0], f)
                    for f in (
                        "id",
                        "pool",
                        "cluster",
                        "labels",
                        "topology",
                        "schedulable",
                        "cpu",
                        "memory_mib",
                    )
                },
                "gpus": (cluster[0].gpus[0], Gpu(1, "A100", 40960, whole_by="not-ours")),
            }
        ),
    )
    snap = snapshot(
        foreign, [dept(), project("p1", deserved=2)], [running(job("done", "p1"), "n0", [0])]
    )
    after = remove_workloads(snap, {"done"})
    assert after.workloads == ()
    assert [g.whole_by for g in after.nodes[0].gpus] == [None, "not-ours"]


def test_time_based_fairness_gives_the_spare_gpus_to_the_project_that_used_less() -> None:
    queues = [dept(), project("p1", deserved=1), project("p2", deserved=1)]
    work = [job(f"{q}-{i}", q, t=i) for q in ("p1", "p2") for i in range(6)]
    snap = snapshot(nodes(1, gpus=6), queues, work)
    history = (UsageRecord("p1", "a", 0.0, 3600.0, 6 * 3600.0),)
    snap = replace(snap, usage_history=history)
    config = SchedulerConfig(fairness_half_life_s=3600.0)
    plain, weighted = run(snap), run(snap, config, now=3600.0)
    g = Resource.GPU
    assert plain.fair_shares[("p1", "a", g)] == plain.fair_shares[("p2", "a", g)] == 3
    assert weighted.fair_shares[("p1", "a", g)] < weighted.fair_shares[("p2", "a", g)]
    held = {q: sum(a.workload_id.startswith(q) for a in weighted.admissions) for q in ("p1", "p2")}
    assert held["p1"] < held["p2"]


def test_the_small_benchmark_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--scenario", "scale-small", "--repeat", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["nodes"], figures["gpus"], figures["queues"]) == (100, 800, 22)
    assert (figures["running"], figures["pending"]) == (500, 1000)
    for key in (
        "cycle_ms_median",
        "cycle_ms_p90",
        "cycle_cpu_ms_median",
        "floor_ms",
        "peak_rss_mb",
    ):
        assert figures[key] > 0
    assert figures["admitted"] > 0
    assert figures["evicted"] >= 0


def test_the_benchmark_times_packing_on_by_default_and_off_on_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.config_for(True) == SchedulerConfig()
    assert bench.config_for(True).fragmentation_half_life_s
    assert bench.config_for(False).fragmentation_half_life_s is None
    assert bench.main(["--scenario", "arrival", "--repeat", "2", "--packing", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["packing"] is False
    assert bench.run("scale-small", repeat=1)["packing"] is True


def test_the_benchmark_keeps_the_state_and_checks_it_against_a_rebuild() -> None:
    figures = bench.run("scale-small", repeat=2)
    assert figures["rebuild_ms"] > 0
    assert figures["cycle_ms_median"] > 0
    assert len(figures["load"]) == 3  # type: ignore[arg-type]


def test_the_arrival_benchmark_updates_the_kept_state_once_per_arrival() -> None:
    figures = run_arrival(cycles=3)
    assert (figures["nodes"], figures["gpus"], figures["running_at_start"]) == (1200, 6000, 8000)
    assert (figures["builds"], figures["updates"], figures["admitted"]) == (1, 3, 3)


def test_applying_only_the_changes_gives_the_snapshot_apply_result_gives() -> None:
    snap = random_snapshot(5)
    for now in (NOW, NOW + 60, NOW + 120):
        result = schedule(snap, SchedulerConfig(), now)
        full, changed = apply_result(snap, result, now), apply_changes(snap, result, now)
        assert full.workloads == changed.workloads
        assert _holders(full) == _holders(changed)
        named = {p.node_id for a in result.admissions for p in a.pods}
        named |= {p.node_id for wl in snap.workloads if wl.placement for p in wl.placement}
        assert all(
            new is old
            for old, new in zip(snap.nodes, changed.nodes, strict=True)
            if old.id not in named
        )
        snap = changed


def _holders(snap: Snapshot) -> list[tuple[str, int, str | None, list[tuple[str, float]]]]:
    return [
        (node.id, gpu.index, gpu.whole_by, sorted((s.workload_id, s.share) for s in gpu.shares))
        for node in snap.nodes
        for gpu in node.gpus
    ]


def test_the_mig_benchmark_times_its_baseline_in_the_same_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.main(["--scenario", "scale-mig-small", "--repeat", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert (figures["gpus"], figures["mig_gpus"]) == (800, 200)
    assert figures["mig_admitted"] > 0
    assert figures["baseline"] == "scale-small"
    ratio = figures["cycle_ms_median"] / figures["baseline_cycle_ms_median"]
    assert figures["ratio_to_baseline"] == pytest.approx(ratio, abs=0.01)
    # one turn: the paired ratio is that turn's CPU times' ratio
    cpu = figures["cycle_cpu_ms_median"] / figures["baseline_cycle_cpu_ms_median"]
    assert figures["paired_cpu_ratio_median"] == pytest.approx(cpu, abs=0.01)


def test_the_sharing_benchmark_times_each_size_without_sharing_with_mps_and_with_mig(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = (("scale-small", ("scale-whole-small", "scale-small", "scale-mig-small")),)
    monkeypatch.setattr(bench, "SHARING", small)
    found = bench.run_sharing(repeat=1)
    rows = found["sizes"]["scale-small"]  # type: ignore[index]
    assert list(rows) == ["scale-whole-small", "scale-small", "scale-mig-small"]
    whole, mps, mig = rows.values()
    assert (whole["shared_admitted"], whole["mig_admitted"]) == (0, 0)
    assert whole["cycle_cpu_ms_min_ratio"] == 1.0
    assert mps["shared_admitted"] > 0 and mps["mig_admitted"] == 0
    assert mig["mig_admitted"] > 0
    assert mig["cycle_ms_median_ratio"] == pytest.approx(
        mig["cycle_ms_median"] / whole["cycle_ms_median"], abs=0.01
    )
    assert mig["cycle_cpu_ms_min"] <= mig["cycle_cpu_ms_median"]
