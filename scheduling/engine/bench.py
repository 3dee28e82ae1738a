"""Benchmark of scheduling cycles on large synthetic clusters.

    python -m scheduling.engine.bench [--scenario NAME] [--repeat N] --json

`scale`: 1,000 nodes x 8 GPUs in 2 pools and 10 racks, 20 departments x 10 projects,
5,000 running and 10,000 pending workloads (whole, fractional, gangs of 2-16 pods).
`scale-mig` is `scale` with a quarter of the GPUs MIG-enabled (the last 2 of each node)
and one single-pod workload in five asking for a MIG profile (or for memory, mapped to a
profile); it also times `scale` in the same run, one cycle of each in turn, and reports
the ratio of the medians and the median of each turn's ratio (`scale-mig-small`: the
same at one tenth). `scale-small` is the same at one tenth,
`scale-x10` ten times as large (10,000 nodes, 50,000 running, 100,000 pending; the same
220 queues). `scale-whole` and `scale-whole-small` are `scale` and `scale-small` without
GPU sharing: the pods that ask a fraction or GPU memory (shared through MPS on the nodes)
ask one whole GPU instead. `--scenario sharing` times the six at two sizes in one run and
reports each one's cycle against its size's `-whole` (issue 14: sharing through MPS or MIG
adds no per-cycle cost that grows with the cluster). The running set is placed by the
engine itself (so it is a state the engine could have produced); then pending work is
added. The first cycle builds the engine's state from the snapshot (`rebuild_ms`); the
timed cycles run on the same snapshot with the state kept between cycles (cycle.Engine),
as the portal's cycle runs when little changed, and must decide as the rebuild did.

`arrival` (arrival.py): 1,200 nodes with 6,000 GPUs, about 8,000 running fractional and
whole pods that never leave, and one new pending workload per cycle: the steady state
of a busy cluster, where a cycle should cost what changed. Everything is drawn from a
seeded generator.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from random import Random

from scheduling.engine.apply import apply_result
from scheduling.engine.cycle import Engine, schedule
from scheduling.engine.types import (
    CycleResult,
    Gpu,
    Node,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    TopologyConstraint,
    TopologyMode,
    Workload,
)

POOLS = (("pool-a", "A100-80GB"), ("pool-b", "H100-80GB"))
NOW = 1_000_000.0
GPU_MEMORY = 81920


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: int
    departments: int
    projects: int  # per department
    running: int
    pending: int
    racks: int = 10
    gpus_per_node: int = 8
    mig_gpus: int = 0  # per node, the last ones: MIG-enabled
    mig_share: float = 0.0  # of single-pod workloads, the part that asks for MIG
    fractions: bool = True  # some pods ask a fraction or GPU memory (else one whole GPU)
    baseline: str = ""  # a scenario timed in the same run, for comparison


SCALE = Scenario(nodes=1000, departments=20, projects=10, running=5000, pending=10000)
SCALE_SMALL = Scenario(nodes=100, departments=2, projects=10, running=500, pending=1000)
# The MIG scenarios are their baselines with two MIG GPUs per node and a fifth of the
# single-pod workloads asking a MIG profile, timed beside them in the same run.
MIG = {"mig_gpus": 2, "mig_share": 0.2}
SCENARIOS = {
    "scale": SCALE,
    "scale-small": SCALE_SMALL,
    "scale-mig": replace(SCALE, **MIG, baseline="scale"),
    "scale-mig-small": replace(SCALE_SMALL, **MIG, baseline="scale-small"),
    "scale-whole": replace(SCALE, fractions=False),
    "scale-whole-small": replace(SCALE_SMALL, fractions=False),
    "scale-x10": Scenario(
        nodes=10000, departments=20, projects=10, running=50000, pending=100000, racks=100
    ),
}
# Per size: the scenario without sharing, then with fractions (MPS), then with MIG besides.
SHARING = (
    ("scale-small", ("scale-whole-small", "scale-small", "scale-mig-small")),
    ("scale", ("scale-whole", "scale", "scale-mig")),
)
MIG_REQUESTS = ("1g.10gb", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "auto")


def build_nodes(sc: Scenario) -> tuple[Node, ...]:
    """Nodes split evenly over the pools, racks striped across both pools."""
    nodes = []
    per_rack = max(sc.nodes // sc.racks, 1)
    for i in range(sc.nodes):
        pool, model = POOLS[i * len(POOLS) // sc.nodes]
        mig_from = sc.gpus_per_node - sc.mig_gpus
        gpus = tuple(Gpu(j, model, GPU_MEMORY, mig=j >= mig_from) for j in range(sc.gpus_per_node))
        topology = {"zone": f"z{i // (per_rack * 5)}", "rack": f"rack-{i // per_rack}"}
        nodes.append(
            Node(f"node-{i:04d}", pool, gpus, topology=topology, cpu=128.0, memory_mib=1 << 20)
        )
    return tuple(nodes)


def build_queues(sc: Scenario, rng: Random) -> tuple[Queue, ...]:
    """Departments and projects whose deserved GPUs add up to 90% of each pool."""
    per_pool = sc.nodes * sc.gpus_per_node / len(POOLS)
    weights = [rng.uniform(0.5, 2.0) for _ in range(sc.departments * sc.projects)]
    total = sum(weights)
    queues = []
    for d in range(sc.departments):
        dept_quotas = {}
        for pool, _ in POOLS:
            share = sum(weights[d * sc.projects : (d + 1) * sc.projects]) / total
            dept_quotas[(pool, Resource.GPU)] = Quota(deserved=round(0.9 * per_pool * share))
        queues.append(Queue(f"dept-{d:02d}", None, dept_quotas))
        for p in range(sc.projects):
            w = weights[d * sc.projects + p]
            quotas = {}
            for pool, _ in POOLS:
                limit = None if rng.random() < 0.8 else round(per_pool * w / total * 3)
                quotas[(pool, Resource.GPU)] = Quota(
                    deserved=round(0.9 * per_pool * w / total),
                    limit=limit,
                    over_quota_weight=rng.choice((1.0, 1.0, 2.0)),
                )
            queues.append(Queue(f"proj-{d:02d}-{p}", f"dept-{d:02d}", quotas))
    return tuple(queues)


def _pods(
    rng: Random, gang: bool, small: bool, mig: float, fractions: bool = True
) -> tuple[PodRequest, ...]:
    """Pods of one workload; `small` shapes keep 5,000 running ones within 8,000 GPUs.
    A `mig` part of single-pod workloads asks for a MIG profile; without `fractions` the
    pods that would ask part of a GPU ask one whole GPU."""
    kind = rng.random()
    cpu, mem = float(rng.choice((2, 4, 8))), rng.choice((8192, 16384, 32768))
    if mig and not gang and rng.random() < mig:
        profile = rng.choice(MIG_REQUESTS)
        memory = rng.choice((8192, 20480, 30720)) if profile == "auto" else 0
        return (PodRequest(mig_profile=profile, gpu_memory_mib=memory, cpu=cpu),)
    if gang:
        size = rng.randint(2, 4) if small else rng.randint(2, 16)
        gpus = 1 if small else rng.choice((1, 2, 4, 8))
        return (PodRequest(gpus=gpus, cpu=cpu, memory_mib=mem),) * size
    if kind < 0.4 and not fractions:
        return (PodRequest(gpus=1, cpu=cpu, memory_mib=mem),)
    if kind < 0.3:
        fraction = rng.choice((0.25, 0.5, 0.5, 0.75))
        return (PodRequest(gpu_fraction=fraction, cpu=cpu, memory_mib=mem),)
    if kind < 0.4:
        return (PodRequest(gpu_memory_mib=rng.choice((10240, 20480)), cpu=cpu),)
    sizes = (1, 1, 1, 2) if small else (1, 1, 2, 4, 8)
    return (PodRequest(gpus=rng.choice(sizes), cpu=cpu, memory_mib=mem),)


def build_workload(
    wid: str, projects: list[str], rng: Random, now: float, small: bool, sc: Scenario
) -> Workload:
    """One random workload: whole, fractional, MIG or a gang, some with pool or rack wishes."""
    gang = rng.random() < (0.05 if small else 0.1)
    pods = _pods(rng, gang, small, sc.mig_share, sc.fractions)
    pools: tuple[str, ...] = ()
    if rng.random() < 0.5:
        pools = tuple(p for p, _ in rng.sample(POOLS, 2))
    topology = None
    if gang and rng.random() < 0.5:
        mode = rng.choice((TopologyMode.REQUIRED, TopologyMode.PREFERRED))
        topology = TopologyConstraint("rack", mode)
    return Workload(
        id=wid,
        queue_id=rng.choice(projects),
        pods=pods,
        priority=rng.choice((0, 50, 100)),
        priority_class=rng.choice(("train", "build", "inference")),
        preemptible=rng.random() < 0.8,
        submit_time=now - rng.uniform(0, 86400),
        pools=pools,
        topology=topology,
    )


def build_snapshot(name: str, seed: int = 7) -> Snapshot:
    """The named scenario's snapshot (scenario_snapshot)."""
    return scenario_snapshot(SCENARIOS[name], seed)


def scenario_snapshot(sc: Scenario, seed: int = 7) -> Snapshot:
    """A scenario's snapshot: running workloads placed by the engine, then pending."""
    rng = Random(seed)
    now = NOW
    nodes, queues = build_nodes(sc), build_queues(sc, rng)
    projects = [q.id for q in queues if q.parent_id is not None]
    first = tuple(
        build_workload(f"run-{i:05d}", projects, rng, now, True, sc) for i in range(sc.running)
    )
    # Place without limits (non-preemptible work over quota too, as it may run from
    # before an admin took the permission back); the timed cycles apply every rule.
    open_queues = tuple(replace(q, quotas={}, nonpreemptible_over_quota=True) for q in queues)
    seed_snap = Snapshot(tuple(p for p, _ in POOLS), nodes, open_queues, first)
    placed = apply_result(seed_snap, schedule(seed_snap, SchedulerConfig(), now - 3600), now)
    running = tuple(
        replace(wl, started_at=now - rng.uniform(0, 7200), last_checkpoint_time=now - 600)
        for wl in placed.workloads
        if wl.placement is not None
    )
    pending = tuple(
        build_workload(f"pend-{i:05d}", projects, rng, now, False, sc) for i in range(sc.pending)
    )
    return replace(placed, queues=queues, workloads=running + pending)


def floor_pass(snapshot: Snapshot) -> int:
    """One plain pass reading every workload's pods and every GPU: the least any cycle
    must do."""
    total = 0
    for wl in snapshot.workloads:
        for pod in wl.pods:
            total += pod.gpus
        for placed in wl.placement or ():
            total += len(placed.gpus)
    for node in snapshot.nodes:
        for gpu in node.gpus:
            total += gpu.memory_mib > 0 and gpu.whole_by is None
    return total


def _timed(fn: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each run. CPU time is reported too because other
    processes on a small shared machine stretch wall time without the cycle doing more."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return sorted(wall), sorted(cpu)


def figures(cycles: list[float], cpu: list[float]) -> dict[str, float]:
    """Median and p90 of sorted wall times, median of CPU times, peak memory."""
    return {
        "cycle_ms_median": round(statistics.median(cycles), 2),
        "cycle_ms_p90": round(cycles[min(len(cycles) - 1, int(0.9 * len(cycles)))], 2),
        "cycle_cpu_ms_median": round(statistics.median(cpu), 2),
        "cycle_cpu_ms_min": round(min(cpu), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def load() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages, as `uptime` shows them."""
    with open("/proc/loadavg") as f:  # Linux only
        return [float(x) for x in f.read().split()[:3]]


def run(
    name: str, repeat: int, searches: int | None = None, packing: bool = True
) -> dict[str, object]:
    """The scenario's figures; with a baseline, that one's median and the ratio too (the
    two timed in turns, so that load from elsewhere falls on both alike)."""
    baseline = SCENARIOS[name].baseline
    names = [name, baseline] if baseline else [name]
    ready = {n: prepare(n, searches, packing) for n in names}
    turns: dict[str, list[float]] = {}
    times = _in_turns(ready, repeat, turns)
    figures = _measure(name, ready[name], *times[name])
    if baseline:
        base = _measure(baseline, ready[baseline], *times[baseline])
        figures["baseline"] = baseline
        figures["baseline_cycle_ms_median"] = base["cycle_ms_median"]
        figures["baseline_cycle_cpu_ms_median"] = base["cycle_cpu_ms_median"]
        figures["baseline_cycle_cpu_ms_min"] = base["cycle_cpu_ms_min"]
        figures["cpu_ratio_to_baseline"] = _ratio(figures, base, "cycle_cpu_ms_median")
        figures["cpu_min_ratio_to_baseline"] = _ratio(figures, base, "cycle_cpu_ms_min")
        figures["ratio_to_baseline"] = _ratio(figures, base, "cycle_ms_median")
        # Each turn's two cycles ran back to back: the median of their ratios is the
        # least moved by a machine whose speed drifts while the bench runs.
        pairs = [a / b for a, b in zip(turns[name], turns[baseline], strict=True)]
        figures["paired_cpu_ratio_median"] = round(statistics.median(pairs), 3)
    return figures


def config_for(packing: bool) -> SchedulerConfig:
    """The default config, or with fragmentation-aware packing off (plain best fit)."""
    return SchedulerConfig() if packing else SchedulerConfig(fragmentation_half_life_s=None)


@dataclass(slots=True)
class Prepared:
    """A scenario's snapshot and engine after its first cycle (the state built), and what
    a rebuild decides."""

    snapshot: Snapshot
    config: SchedulerConfig
    engine: Engine
    result: CycleResult
    rebuild: tuple[list[float], list[float]]

    def cycle(self) -> object:
        return self.engine.schedule(self.snapshot, self.config, NOW)


def prepare(name: str, searches: int | None = None, packing: bool = True) -> Prepared:
    snapshot = build_snapshot(name)
    config = config_for(packing)
    if searches is not None:
        config = replace(config, max_victim_searches=searches)
    engine = Engine()
    rebuild = _timed(lambda: engine.schedule(snapshot, config, NOW), 1)
    assert engine.state is not None
    return Prepared(snapshot, config, engine, schedule(snapshot, config, NOW), rebuild)


def _in_turns(
    ready: dict[str, Prepared], repeat: int, turns: dict[str, list[float]] | None = None
) -> dict[str, tuple[list[float], ...]]:
    """Sorted wall and CPU milliseconds of `repeat` cycles of each, one of each in turn;
    `turns` gets each one's CPU milliseconds in the order they ran."""
    times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in ready}
    for _ in range(repeat):
        for name, prepared in ready.items():
            wall, cpu = _timed(prepared.cycle, 1)
            times[name][0].extend(wall)
            times[name][1].extend(cpu)
    if turns is not None:
        turns.update({name: list(cpu) for name, (_, cpu) in times.items()})
    return {name: (sorted(wall), sorted(cpu)) for name, (wall, cpu) in times.items()}


def _measure(
    name: str, ready: Prepared, cycles: list[float], cpu: list[float]
) -> dict[str, object]:
    snapshot, config, engine, result = ready.snapshot, ready.config, ready.engine, ready.result
    (rebuild_wall,), (rebuild_cpu,) = ready.rebuild
    if engine.schedule(snapshot, config, NOW) != result:
        raise AssertionError("the kept state decided otherwise than a rebuild")
    floor = min(_timed(lambda: floor_pass(snapshot), 5)[0])
    running = sum(1 for wl in snapshot.workloads if wl.placement is not None)
    return {
        "scenario": name,
        "nodes": len(snapshot.nodes),
        "gpus": sum(len(n.gpus) for n in snapshot.nodes),
        "queues": len(snapshot.queues),
        "workloads": len(snapshot.workloads),
        "running": running,
        "pending": len(snapshot.workloads) - running,
        **figures(cycles, cpu),
        "rebuild_ms": round(rebuild_wall, 1),
        "rebuild_cpu_ms": round(rebuild_cpu, 1),
        "floor_ms": round(floor, 2),
        "mig_gpus": sum(g.mig for n in snapshot.nodes for g in n.gpus),
        **_decided(result),
        "max_victim_searches": config.max_victim_searches,
        "packing": bool(config.fragmentation_half_life_s),
        "repeat": len(cycles),
        "load": load(),
    }


def _decided(result: CycleResult) -> dict[str, int]:
    pods = [p for a in result.admissions for p in a.pods]
    return {
        "mig_admitted": sum(1 for p in pods if p.mig_gpu is not None),
        "shared_admitted": sum(1 for p in pods if p.shared_gpu is not None),
        "admitted": len(result.admissions),
        "evicted": len(result.evictions),
    }


def run_sharing(repeat: int) -> dict[str, object]:
    """Each size's scenarios without sharing, with fractions (MPS) and with MIG besides,
    in one run, their cycles timed in turns (one of each, `repeat` times, so that load
    from elsewhere falls on all alike): medians and minima (wall and CPU), what they
    admitted, and each one's ratio to its size's scenario without sharing."""
    sizes: dict[str, object] = {}
    for size, names in SHARING:
        ready = {name: prepare(name) for name in names}
        times = _in_turns(ready, repeat)
        rows = {n: _row(*times[n], ready[n].result) for n in names}
        base = rows[names[0]]
        for row in rows.values():
            for key in ("cycle_ms_median", "cycle_cpu_ms_median", "cycle_cpu_ms_min"):
                row[f"{key}_ratio"] = _ratio(row, base, key)
        sizes[size] = rows
    return {"sizes": sizes, "repeat": repeat, "load": load()}


def _row(wall: list[float], cpu: list[float], result: CycleResult) -> dict[str, object]:
    return {
        "cycle_ms_median": round(statistics.median(wall), 2),
        "cycle_cpu_ms_median": round(statistics.median(cpu), 2),
        "cycle_cpu_ms_min": round(min(cpu), 2),
        **_decided(result),
    }


def _ratio(figures: dict[str, object], base: dict[str, object], key: str) -> float:
    return round(float(figures[key]) / float(base[key]), 3)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenario", choices=sorted([*SCENARIOS, "arrival", "sharing"]), default="scale"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed cycles (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--max-victim-searches",
        type=int,
        default=None,
        help="override the per-cycle budget of eviction-plan searches",
    )
    parser.add_argument(
        "--packing",
        choices=("on", "off"),
        default="on",
        help="fragmentation-aware packing (the default config) or plain best fit",
    )
    args = parser.parse_args(argv)
    packing = args.packing == "on"
    if args.scenario == "arrival":
        from scheduling.engine.arrival import run_arrival  # noqa: PLC0415  # it imports this

        found = run_arrival(max(args.repeat, 1), config=config_for(packing))
        found["packing"] = packing
    elif args.scenario == "sharing":
        found = run_sharing(max(args.repeat, 1))
    else:
        found = run(args.scenario, args.repeat, args.max_victim_searches, packing)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        for key, value in found.items():
            print(f"{key:>16}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
