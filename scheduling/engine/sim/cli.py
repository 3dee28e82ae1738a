"""Command line and `simulate()`: load the inputs, replay, add baselines, write outputs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scheduling.engine.sim.baseline import PrivateResult, private_cluster_queueing
from scheduling.engine.sim.engine_policy import EnginePolicy
from scheduling.engine.sim.fifo import FifoPolicy
from scheduling.engine.sim.loop import MIG_LAYOUTS, Policy, SimConfig, Simulation
from scheduling.engine.sim.report import summarize, write_outputs
from scheduling.engine.sim.specs import (
    NodeSpec,
    QuotaSpec,
    cluster_from_dict,
    load_json,
    proportional_quotas,
    quotas_from_dict,
    quotas_to_dict,
)
from scheduling.engine.sim.trace import TraceJob, made_elastic, read_trace
from scheduling.engine.types import PlacementStrategy, SchedulerConfig

POLICIES = ("fifo", "static", "gpupool")


def engine_config(overrides: Mapping[str, Any] | None = None) -> SchedulerConfig:
    """SchedulerConfig with fields from a JSON object (unknown keys are an error)."""
    values = dict(overrides or {})
    if "default_placement" in values:
        values["default_placement"] = PlacementStrategy(values["default_placement"])
    known = {f.name for f in dataclasses.fields(SchedulerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown engine config keys: {', '.join(unknown)}")
    return SchedulerConfig(**values)


def policy_factory(name: str, config: SchedulerConfig) -> Callable[[Simulation], Policy]:
    """A function that builds the named policy for a replay."""
    if name == "fifo":
        return FifoPolicy
    if name in ("static", "gpupool"):
        borrowing = name == "gpupool"
        return lambda sim: EnginePolicy(sim, name, config, borrowing=borrowing)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


def private_baselines(
    jobs: list[TraceJob], quotas: QuotaSpec, nodes: list[NodeSpec], config: SimConfig
) -> dict[str, PrivateResult]:
    """Each team's queueing alone on a private cluster of its quota."""
    by_team: dict[str, list[TraceJob]] = {}
    for job in jobs:
        by_team.setdefault(job.team, []).append(job)
    return {
        team: private_cluster_queueing(team, team_jobs, quotas, nodes, config, FifoPolicy)
        for team, team_jobs in sorted(by_team.items())
    }


def check_mig(
    nodes: list[NodeSpec], jobs: list[TraceJob], policy: str, baselines: bool, layout: str
) -> None:
    """ValueError when the replay cannot hold its MIG jobs or layout as asked."""
    if any(job.mig_profile for job in jobs) and (policy == "fifo" or baselines):
        raise ValueError(
            "MIG jobs need the static or gpupool policy and no private baselines"
            " (--no-baseline): the FIFO replay does not cut MIG instances"
        )
    if layout == "static":
        for node in nodes:
            if node.mig_gpus and not node.mig_layout:
                raise ValueError(f"--mig-layout static: node {node.name} has no mig_layout")


def simulate(
    nodes: list[NodeSpec],
    jobs: list[TraceJob],
    quotas: QuotaSpec | None = None,
    policy: str = "gpupool",
    config: SimConfig | None = None,
    scheduler_config: SchedulerConfig | None = None,
    baselines: bool = True,
) -> tuple[Simulation, dict[str, Any]]:
    """Replay `jobs` on `nodes` under `policy` and return the replay and its summary."""
    config = config or SimConfig()
    check_mig(nodes, jobs, policy, baselines, config.mig_layout)
    quotas = quotas or proportional_quotas(jobs, nodes)
    started = time.perf_counter()
    factory = policy_factory(policy, scheduler_config or SchedulerConfig())
    sim = Simulation(nodes, jobs, quotas, factory, config).run()
    wall = time.perf_counter() - started
    private = private_baselines(jobs, quotas, nodes, config) if baselines else {}
    extra = {
        "policy": policy,
        "sim_config": dataclasses.asdict(config),
        "wall_s": round(wall, 2),
        "engine_s": round(getattr(sim.policy, "cycle_seconds", 0.0), 2),
    }
    return sim, summarize(sim, private, extra)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see docs/simulator.md."""
    parser = argparse.ArgumentParser(prog="python -m scheduling.engine.sim", description=__doc__)
    parser.add_argument("--cluster", type=Path, required=True, help="cluster JSON")
    parser.add_argument("--trace", type=Path, required=True, help="trace CSV")
    parser.add_argument("--quotas", type=Path, help="quotas JSON (default: ∝ GPU-hours)")
    parser.add_argument("--policy", choices=POLICIES, default="gpupool")
    parser.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    parser.add_argument("--engine-config", type=Path, help="JSON of SchedulerConfig fields")
    defaults = SimConfig()
    parser.add_argument("--tick", type=float, default=defaults.tick)
    parser.add_argument("--period", type=float, default=defaults.period)
    parser.add_argument("--checkpoint-interval", type=float, default=defaults.checkpoint_interval)
    parser.add_argument("--no-baseline", action="store_true", help="skip private clusters")
    parser.add_argument(
        "--mig-layout",
        choices=MIG_LAYOUTS,
        default="dynamic",
        help="static: MIG GPUs hold their node's mig_layout and are never repartitioned",
    )
    parser.add_argument(
        "--elastic-from",
        type=float,
        metavar="GPUS",
        help="make jobs of at least GPUS whole GPUs elastic (1-GPU pods, half to all of them)",
    )
    parser.add_argument(
        "--elastic-unit", type=int, default=1, help="GPUs per pod of a job made elastic"
    )
    parser.add_argument(
        "--elastic-resizes-itself",
        action="store_true",
        help="jobs made elastic follow size changes without restarting from a checkpoint",
    )
    parser.add_argument(
        "--plot", type=Path, help="PNG of per-team extra queueing (this run and --compare)"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        help="output folder of an earlier run to draw beside this one (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one replay from the command line and print the headline figures. Unreadable
    or invalid inputs end with one line on stderr naming the file and the problem, and
    exit status 2 (as argparse does for bad options); nothing is written."""
    args = parse_args(argv)
    try:
        nodes = cluster_from_dict(load_json(args.cluster))
        gpus_per_node = max(node.gpus for node in nodes)
        jobs, origin = read_trace(args.trace, gpus_per_node)
        if args.elastic_from is not None:
            jobs = made_elastic(
                jobs, args.elastic_from, args.elastic_unit, args.elastic_resizes_itself
            )
        quotas = quotas_from_dict(load_json(args.quotas)) if args.quotas else None
        quotas = quotas or proportional_quotas(jobs, nodes)
        earlier = {}
        for folder in args.compare:
            found = load_json(folder / "summary.json")
            earlier[_label(found, folder)] = found
        if args.plot and args.no_baseline:
            raise ValueError("--plot needs the private baselines (leave out --no-baseline)")
        check_mig(nodes, jobs, args.policy, not args.no_baseline, args.mig_layout)
        overrides = load_json(args.engine_config) if args.engine_config else None
        try:
            engine = engine_config(overrides)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{args.engine_config}: {error}") from error
    except (OSError, ValueError) as error:
        print(f"python -m scheduling.engine.sim: error: {error}", file=sys.stderr)
        return 2
    config = SimConfig(
        tick=args.tick,
        period=args.period,
        checkpoint_interval=args.checkpoint_interval,
        mig_layout=args.mig_layout,
    )
    sim, summary = simulate(nodes, jobs, quotas, args.policy, config, engine, not args.no_baseline)
    summary = {"trace": str(args.trace), "trace_origin": origin, **summary}
    write_outputs(sim, summary, args.out)
    args.out.joinpath("quotas.json").write_text(_json(quotas_to_dict(quotas)))
    print(_headline(summary))
    if args.plot:
        from scheduling.engine.sim.plot import plot_extra_queueing  # noqa: PLC0415

        runs = {**earlier, _label(summary, args.out): summary}
        title = f"{args.trace.name} on {summary['nodes']} nodes, {summary['gpus']:g} GPUs"
        plot_extra_queueing(runs, args.plot, title)
    return 0


def _label(summary: Mapping[str, Any], folder: Path) -> str:
    return str(summary.get("policy") or folder.name)


def _json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def _headline(summary: Mapping[str, Any]) -> str:
    keys = (
        "policy",
        "gpu_allocation",
        "fairness_jain",
        "worst_team",
        "worst_team_extra_queueing_s",
        "worst_team_within_quota",
        "worst_team_extra_queueing_within_quota_s",
        "preemptions",
        "gpu_hours_lost_to_preemption",
        "wall_s",
        "engine_s",
        "resizes",
        "mig",
    )
    parts = [f"{key}={summary.get(key)}" for key in keys]
    parts.append(f"queueing={summary['queueing_delay_s']} jct={summary['jct_s']}")
    return " ".join(parts)
