"""The `arrival` benchmark: one new workload per cycle on a busy cluster.

    python -m scheduling.engine.bench --scenario arrival --repeat 300 --json

1,200 nodes: 600 with 8 GPUs and 300 with 4 (6,000 GPUs, A100 40 GB), 300 without GPUs.
About 8,000 pods run, none preemptible and none leaving: 65 % ask a fraction of a GPU
(0.1, 0.2, 0.25 or 0.5), 30 % whole GPUs (1, 1, 1 or 2), 5 % CPU only; each 1-8 cores
and 4-32 GiB. They are placed by the engine itself. Ten projects in one department
share the pool by deserved quota and may run non-preemptible work over it. Then each
cycle gets one new pending pod of the same mix, the engine (cycle.Engine, state kept
between cycles) decides, and its decision is applied before the next arrival; the
cycle time is the engine call, snapshot diff included. Every 50th cycle is also run
from scratch and must decide alike.
"""

from __future__ import annotations

import time
from random import Random

from scheduling.engine.apply import apply_changes, apply_result
from scheduling.engine.bench import figures, load
from scheduling.engine.cycle import Engine, schedule
from scheduling.engine.types import (
    Gpu,
    Node,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)

POOL, MODEL, GPU_MEMORY = "pool-a", "A100-40GB", 40960
PROJECTS = 10
RUNNING = 8000
CHECK_EVERY = 50


def build_cluster() -> tuple[Node, ...]:
    """600 nodes x 8 GPUs, 300 x 4, 300 CPU-only; 96 cores and 768 GiB each; 12 racks."""
    nodes = []
    for i in range(1200):
        count = 8 if i < 600 else 4 if i < 900 else 0
        gpus = tuple(Gpu(j, MODEL, GPU_MEMORY) for j in range(count))
        topology = {"rack": f"rack-{i % 12}"}
        nodes.append(
            Node(f"node-{i:04d}", POOL, gpus, topology=topology, cpu=96.0, memory_mib=768 << 10)
        )
    return tuple(nodes)


def build_queues() -> tuple[Queue, ...]:
    """One department, ten projects with equal deserved quota summing to the pool."""
    share = {(POOL, Resource.GPU): Quota(deserved=6000 / PROJECTS)}
    projects = tuple(
        Queue(f"proj-{p}", "dept", share, nonpreemptible_over_quota=True) for p in range(PROJECTS)
    )
    return (Queue("dept", None, {(POOL, Resource.GPU): Quota(deserved=6000)}), *projects)


def arriving(rng: Random, i: int, now: float) -> Workload:
    """One pod of the mix, non-preemptible (an inference or a notebook, say)."""
    kind = rng.random()
    cpu, memory = float(rng.randint(1, 8)), rng.choice((4, 8, 16, 32)) << 10
    if kind < 0.65:
        pod = PodRequest(gpu_fraction=rng.choice((0.1, 0.2, 0.25, 0.5)), cpu=cpu, memory_mib=memory)
    elif kind < 0.95:
        pod = PodRequest(gpus=rng.choice((1, 1, 1, 2)), cpu=cpu, memory_mib=memory)
    else:
        pod = PodRequest(cpu=cpu, memory_mib=memory)
    return Workload(
        id=f"pod-{i:06d}",
        queue_id=f"proj-{rng.randrange(PROJECTS)}",
        pods=(pod,),
        preemptible=False,
        submit_time=now,
    )


def build_running(seed: int = 11, config: SchedulerConfig | None = None) -> Snapshot:
    """The cluster with RUNNING pods placed by the engine."""
    rng = Random(seed)
    now = 1_000_000.0
    first = tuple(arriving(rng, i, now - 3600) for i in range(RUNNING))
    snap = Snapshot((POOL,), build_cluster(), build_queues(), first)
    config = config or SchedulerConfig()
    placed = apply_result(snap, schedule(snap, config, now - 3600), now - 3600)
    running = tuple(wl for wl in placed.workloads if wl.placement is not None)
    return Snapshot(placed.pools, placed.nodes, placed.queues, running)


def run_arrival(
    cycles: int, seed: int = 11, config: SchedulerConfig | None = None
) -> dict[str, object]:
    """Time `cycles` cycles, one arrival each; check every CHECK_EVERY-th against a rebuild."""
    rng = Random(seed + 1)
    config = config or SchedulerConfig()
    snap = build_running(seed, config)
    running = len(snap.workloads)
    engine = Engine()
    now = 1_000_000.0
    engine.schedule(snap, config, now)  # the first cycle builds the state
    wall: list[float] = []
    cpu: list[float] = []
    admitted = 0
    for i in range(cycles):
        now += 10.0
        workloads = (*snap.workloads, arriving(rng, RUNNING + i, now))
        snap = Snapshot(snap.pools, snap.nodes, snap.queues, workloads)
        start, start_cpu = time.perf_counter(), time.process_time()
        result = engine.schedule(snap, config, now)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        if i % CHECK_EVERY == 0 and schedule(snap, config, now) != result:
            raise AssertionError(f"cycle {i}: the kept state decided otherwise than a rebuild")
        admitted += len(result.admissions)
        snap = apply_changes(snap, result, now)
    wall.sort()
    cpu.sort()
    return {
        "scenario": "arrival",
        "nodes": len(snap.nodes),
        "gpus": sum(len(n.gpus) for n in snap.nodes),
        "running_at_start": running,
        "cycles": cycles,
        "admitted": admitted,
        **figures(wall, cpu),
        "builds": engine.builds,
        "updates": engine.updates,
        "load": load(),
    }
