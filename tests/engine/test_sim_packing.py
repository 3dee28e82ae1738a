"""The openb-shaped generator and the packing comparison (random, best fit, FGD, GPUPool)."""

from __future__ import annotations

from pathlib import Path

from scheduling.engine.sim.openb import OpenbParams, arrivals, cluster_nodes, write_trace
from scheduling.engine.sim.packing import POLICIES, Packer, markdown, typical_shapes
from scheduling.engine.sim.trace import read_trace


def test_the_full_size_cluster_has_openb_node_and_gpu_counts() -> None:
    nodes = cluster_nodes(OpenbParams())
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    assert sorted({n.gpus for n in nodes}) == [0, 1, 2, 4, 8]


def test_arrivals_are_seeded_and_stop_at_the_demand_level() -> None:
    params = OpenbParams(scale=0.05, demand=1.3, seed=4)
    pods = arrivals(params)
    assert pods == arrivals(params)
    assert pods != arrivals(OpenbParams(scale=0.05, demand=1.3, seed=5))
    capacity = sum(n.gpus for n in cluster_nodes(params))
    requested = sum(p.gpu for p in pods)
    assert 1.3 * capacity <= requested < 1.3 * capacity + 8
    kinds = {(p.gpus > 0, p.milli > 0) for p in pods}
    assert kinds == {(False, False), (False, True), (True, False)}  # CPU, shared, whole


def test_parameters_round_trip_through_json() -> None:
    params = OpenbParams(scale=0.5, seed=9)
    assert OpenbParams.from_json(params.to_json()) == params


def test_the_trace_is_what_the_simulator_reads(tmp_path: Path) -> None:
    params = OpenbParams(scale=0.02, demand=1.0, seed=2)
    write_trace(params, tmp_path / "t.csv")
    jobs, _ = read_trace(tmp_path / "t.csv")
    pods = arrivals(params)
    assert [(j.id, j.gpus_per_pod, j.cpu, j.duration) for j in jobs] == [
        (p.id, p.gpu, p.cpu, None) for p in pods
    ]


def test_the_typical_mix_weighs_like_the_pod_kinds() -> None:
    mix = typical_shapes(OpenbParams())
    cpu_only = sum(w for s, w in mix.items() if s.gpus == 0 and s.units == 0)
    assert abs(sum(mix.values()) - 1.0) < 1e-9
    assert abs(cpu_only - 0.133) < 1e-9


def test_every_policy_allocates_exactly_what_it_placed_and_never_overcommits() -> None:
    params = OpenbParams(scale=0.03, demand=1.3, seed=3)
    pods = {p.id: p for p in arrivals(params)}
    for policy in POLICIES:
        packer = Packer(policy, params, params.seed)
        placed = [p for t, p in enumerate(pods.values()) if packer.place(p, float(t))]
        gpus = sum(len(n.gpus) for n in packer.state.nodes)
        assert abs(packer.allocation() * gpus - sum(p.gpu for p in placed)) < 1e-6, policy
        assert set(packer.state.slots) == {p.id for p in placed}
        for node in packer.state.nodes:
            assert node.cpu_free >= -1e-9 and node.mem_free >= 0, policy
            assert all(0 <= g.used_units <= 1000 for g in node.gpus), policy


def test_the_table_has_a_row_per_demand_and_policy_and_the_mean_of_its_seeds() -> None:
    rows = [
        {"policy": "fgd", "demand": 1.0, "seed": 1, "allocation": 0.9},
        {"policy": "fgd", "demand": 1.0, "seed": 2, "allocation": 0.8},
        {"policy": "gpupool", "demand": 1.3, "seed": 2, "allocation": 0.95},
    ]
    assert markdown(rows).splitlines() == [
        "| demand | policy | seed 1 | seed 2 | mean |",
        "|---|---|---|---|---|",
        "| 100% | `fgd` | 90.00% | 80.00% | **85.00%** |",
        "| 130% | `gpupool` |  | 95.00% | **95.00%** |",
    ]
