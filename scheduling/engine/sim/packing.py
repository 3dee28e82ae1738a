"""Packing policies compared on openb-like arrivals: the GPU allocation ratio they reach.

    python -m scheduling.engine.sim.packing [--scale 0.25] [--demand 1.0 1.3] \\
        [--seeds 1 2 3] [--policies random bestfit fgd gpupool] [--params P.json] [--out F]

Every policy places the same pods, one by one, into the engine's own ClusterState (so the
figures count capacity the same way); a pod that fits nowhere is dropped, and no pod ever
leaves, as in the ATC'23 paper's experiment. The baselines:
- random: a uniformly random node and device among those that fit;
- bestfit: the node left with the least resources (free GPU ÷ its GPUs + free CPU ÷ its
  CPU + free memory ÷ its memory), the fullest device that fits;
- fgd: fragmentation gradient descent as published: the placement whose node
  fragmentation against the workload's shape distribution (known in advance, as in the
  paper) grows least, ties broken at random like kube-scheduler's pick among equal scores.
gpupool is the engine's placement (placement.Placer, the path every admission takes) with a
ShapeHistogram: the typical openb mix as a prior plus the decayed mix of recent arrivals.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from scheduling.engine.fragmentation import Shape, ShapeHistogram, after_key, node_key
from scheduling.engine.placement import Placer
from scheduling.engine.sim.openb import OpenbParams, Pod, arrivals, cluster_nodes
from scheduling.engine.state import UNITS, ClusterState, GpuState, NodeState, PodSlot
from scheduling.engine.types import (
    Gpu,
    Node,
    PlacementStrategy,
    PodRequest,
    SchedulerConfig,
    Snapshot,
    Workload,
)

POLICIES = ("random", "bestfit", "fgd", "gpupool")
POOL = "default"
# Arrivals of history that count half as much as the newest in GPUPool's shape histogram,
# and how many arrivals' worth the typical (prior) mix weighs.
HALF_LIFE = 500.0
PRIOR_WEIGHT = 200.0

Choice = tuple[NodeState, GpuState | None]  # node, and the device to share (None: whole/host)


def empty_state(params: OpenbParams) -> ClusterState:
    """The generated cluster, nothing running, as the engine's state."""
    nodes = tuple(
        Node(
            id=spec.name,
            pool=POOL,
            gpus=tuple(Gpu(i, spec.gpu_model, spec.gpu_memory_mib) for i in range(spec.gpus)),
            cpu=spec.cpu,
            memory_mib=None if spec.memory_gib is None else int(spec.memory_gib * 1024),
        )
        for spec in cluster_nodes(params)
    )
    return ClusterState(Snapshot((POOL,), nodes, (), ()))


def request(pod: Pod) -> PodRequest:
    return PodRequest(
        gpus=pod.gpus,
        gpu_fraction=pod.milli / 1000,
        cpu=pod.cpu,
        memory_mib=int(pod.memory_gib * 1024),
    )


def shape_of(pod: Pod) -> Shape:
    return Shape(pod.gpus, pod.milli, pod.cpu, float(int(pod.memory_gib * 1024)))


def typical_shapes(params: OpenbParams) -> dict[Shape, float]:
    """The generator's pod-shape distribution: every combination of its tables."""
    mix: dict[Shape, float] = {}
    for kind in params.pods:
        millis = kind.milli or {0: 1.0}
        cpus = kind.cpu or {0.0: 1.0}
        mems = kind.memory_gib or {0.0: 1.0}
        wm, wc, wg = sum(millis.values()), sum(cpus.values()), sum(mems.values())
        for (m, a), (c, b), (g, d) in itertools.product(millis.items(), cpus.items(), mems.items()):
            shape = Shape(kind.gpus, m, float(c), float(int(g * 1024)))
            mix[shape] = mix.get(shape, 0.0) + kind.weight * a / wm * b / wc * d / wg
    return mix


def choices(state: ClusterState, pod: PodRequest) -> Iterator[Choice]:
    """Every node, and device for a fractional pod, where the pod fits."""
    for node in state.nodes:
        if not node.schedulable or not node.fits_host(pod):
            continue
        if pod.is_shared:
            seen: set[int] = set()
            for gpu in node.gpus:
                free = _free(gpu)
                if free not in seen and free >= max(1, round(pod.gpu_fraction * UNITS)):
                    seen.add(free)
                    yield node, gpu
        elif sum(1 for g in node.gpus if g.is_free) >= pod.gpus:
            yield node, None


def _free(gpu: GpuState) -> int:
    return 0 if gpu.owner is not None else UNITS - gpu.used_units


def slot_for(choice: Choice, pod: PodRequest) -> PodSlot:
    node, gpu = choice
    host = {"cpu": pod.cpu, "host_memory": pod.memory_mib}
    if gpu is not None:
        units = max(1, round(pod.gpu_fraction * UNITS))
        memory = int(pod.gpu_fraction * gpu.memory_mib)
        return PodSlot(0, node, shared=gpu, units=units, memory=memory, **host)
    whole = tuple(g for g in node.gpus if g.is_free)[: pod.gpus]
    return PodSlot(0, node, gpus=whole, **host)


def _key_and_after(choice: Choice, pod: PodRequest) -> tuple:
    node, gpu = choice
    key = node_key(node.cpu_free, node.mem_free, [_free(g) for g in node.gpus])
    take = [(UNITS, UNITS)] * pod.gpus
    if gpu is not None:
        take = [(_free(gpu), max(1, round(pod.gpu_fraction * UNITS)))]
    return key, after_key(key, pod.cpu, float(pod.memory_mib), take)


class Packer:
    """One policy placing arrivals into one ClusterState."""

    def __init__(self, policy: str, params: OpenbParams, seed: int) -> None:
        self.policy = policy
        self.state = empty_state(params)
        self.rng = random.Random(f"{policy}-{seed}")
        self.capacity = {n.id: (n.cpu_free, n.mem_free) for n in self.state.nodes}
        if policy == "fgd":
            self.shapes = ShapeHistogram(
                typical_shapes(params), half_life=1.0, prior_weight=1.0, repeat=False
            )
        elif policy == "gpupool":
            self.shapes = ShapeHistogram(
                typical_shapes(OpenbParams()), half_life=HALF_LIFE, prior_weight=PRIOR_WEIGHT
            )
            strategies = {POOL: PlacementStrategy.BINPACK}
            candidates = SchedulerConfig().fragmentation_candidates  # as the engine's cycle
            self.placer = Placer(self.state, strategies, {}, self.shapes, candidates)
        pick: dict[str, Callable[[PodRequest], Choice | None]] = {
            "random": self._random,
            "bestfit": self._bestfit,
            "fgd": self._fgd,
        }
        self.pick = pick.get(policy)

    def place(self, pod: Pod, t: float) -> bool:
        req = request(pod)
        if self.policy == "gpupool":
            self.shapes.observe(shape_of(pod), t)
            wl = Workload(id=pod.id, queue_id="openb", pods=(req,))
            return self.placer.place(wl, POOL) is not None
        assert self.pick is not None
        choice = self.pick(req)
        if choice is None:
            return False
        self.state.add_slot(pod.id, slot_for(choice, req))
        return True

    def _random(self, pod: PodRequest) -> Choice | None:
        found = list(choices(self.state, pod))
        return self.rng.choice(found) if found else None

    def _bestfit(self, pod: PodRequest) -> Choice | None:
        best = None
        for choice in choices(self.state, pod):
            node, _ = choice
            cpu0, mem0 = self.capacity[node.id]
            key, (cpu, memory, frees) = _key_and_after(choice, pod)
            left = sum(frees) / (UNITS * len(node.gpus)) if node.gpus else 0.0
            left += cpu / cpu0 if math.isfinite(cpu0) and cpu0 else 0.0
            left += memory / mem0 if math.isfinite(mem0) and mem0 else 0.0
            gpu_free = _free(choice[1]) if choice[1] is not None else 0
            rank = (left, gpu_free, node.order)
            if best is None or rank < best[0]:
                best = (rank, choice)
        return None if best is None else best[1]

    def _fgd(self, pod: PodRequest) -> Choice | None:
        best: list[Choice] = []
        low = math.inf
        for choice in choices(self.state, pod):
            delta = self.shapes.delta(*_key_and_after(choice, pod))
            if delta < low - 1e-9:
                low, best = delta, [choice]
            elif delta <= low + 1e-9:
                best.append(choice)
        return self.rng.choice(best) if best else None

    def allocation(self) -> float:
        """Allocated GPUs ÷ all GPUs."""
        held = total = 0
        for node in self.state.nodes:
            for gpu in node.gpus:
                total += UNITS
                held += UNITS if gpu.owner is not None else gpu.used_units
        return held / total if total else 0.0


def run(policy: str, params: OpenbParams) -> dict[str, float]:
    """Place the arrivals of `params` under `policy`; the allocation ratio and counts."""
    packer = Packer(policy, params, params.seed)
    pods = arrivals(params)
    started = time.process_time()
    placed = sum(packer.place(pod, float(t)) for t, pod in enumerate(pods))
    return {
        "allocation": packer.allocation(),
        "arrivals": len(pods),
        "placed": placed,
        "cpu_s": time.process_time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.engine.sim.packing")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--demand", type=float, nargs="+", default=[1.0, 1.3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--params", type=Path, help="OpenbParams as JSON (defaults if absent)")
    parser.add_argument("--out", type=Path, help="write every row as JSON here")
    args = parser.parse_args(argv)
    base = json.loads(args.params.read_text()) if args.params else {}
    rows = []
    for demand, seed, policy in itertools.product(args.demand, args.seeds, args.policies):
        params = OpenbParams.from_json(
            {**base, "scale": args.scale, "demand": demand, "seed": seed}
        )
        row = {"policy": policy, "demand": demand, "seed": seed, **run(policy, params)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    """GPU allocation ratio (%) per demand level and policy, one column per seed, the mean."""
    seeds = sorted({r["seed"] for r in rows})
    head = ["demand", "policy", *(f"seed {s}" for s in seeds), "mean"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for demand in sorted({r["demand"] for r in rows}):
        for policy in POLICIES:
            mine = {r["seed"]: r["allocation"] for r in rows
                    if r["policy"] == policy and r["demand"] == demand}  # fmt: skip
            if not mine:
                continue
            cells = [f"{mine[s]:.2%}" if s in mine else "" for s in seeds]
            mean = sum(mine.values()) / len(mine)
            lines.append(
                f"| {demand:.0%} | `{policy}` | " + " | ".join(cells) + f" | **{mean:.2%}** |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
