"""A synthetic cluster and trace shaped like Alibaba's `openb` (cluster-trace-gpu-v2023).

The paper ("Beware of Fragmentation", Weng et al., ATC'23) and the public trace's README
describe `openb`: about 1,213 nodes holding 6,212 GPUs (nodes of 0, 1, 2, 4 and 8 GPUs with
their CPU and memory), and about 8,000 pods of which roughly one in eight asks for no GPU,
about two in five for part of one GPU (`gpu_milli`, most often half a GPU or less), and most
of the rest for one whole GPU; 2-, 4- and 8-GPU pods are rare. The figures below are
approximations of that mix, not copied rows: every one is a parameter (OpenbParams, also
readable from JSON) so an experiment says exactly what it ran.

As in the paper's experiment, pods arrive one by one and never leave; arrivals go on until
the GPUs requested add up to `demand` times the cluster's GPUs (1.0 and 1.3 in the paper).
A pod that fits nowhere is dropped (it stays pending). The figure of merit is the GPU
allocation ratio when the arrivals stop: allocated GPUs ÷ total GPUs.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduling.engine.sim.specs import NodeSpec


@dataclass(frozen=True, slots=True)
class NodeKind:
    """count nodes with `gpus` devices each (0 = CPU-only), `cpu` cores, `memory_gib`."""

    count: int
    gpus: int
    cpu: float
    memory_gib: float
    gpu_model: str = "G"
    gpu_memory_mib: int = 16384


@dataclass(frozen=True, slots=True)
class PodKind:
    """A class of pods: `weight` of all pods, asking for `gpus` whole devices, or a
    fraction of one drawn from `milli` ({gpu_milli: weight}), or no GPU (gpus 0 and no
    milli); CPU cores and memory drawn from the (value: weight) tables."""

    weight: float
    gpus: int = 0
    milli: dict[int, float] = field(default_factory=dict)
    cpu: dict[float, float] = field(default_factory=dict)
    memory_gib: dict[float, float] = field(default_factory=dict)


def _default_nodes() -> tuple[NodeKind, ...]:
    # 1,213 nodes, 6,212 GPUs: mostly 8-GPU servers, then 4-, 2- and 1-GPU ones (V100,
    # T4, P100, A10, G2, G3 in the trace; one model here since no pod in openb pins one),
    # and CPU-only nodes that take CPU pods.
    return (
        NodeKind(count=560, gpus=8, cpu=96, memory_gib=512),
        NodeKind(count=330, gpus=4, cpu=64, memory_gib=256),
        NodeKind(count=156, gpus=2, cpu=64, memory_gib=256),
        NodeKind(count=100, gpus=1, cpu=32, memory_gib=128),
        NodeKind(count=67, gpus=0, cpu=96, memory_gib=512),
    )


def _default_pods() -> tuple[PodKind, ...]:
    host_small = {4: 0.3, 6: 0.2, 8: 0.3, 12: 0.1, 16: 0.1}
    mem_small = {12: 0.3, 24: 0.3, 32: 0.2, 48: 0.1, 64: 0.1}
    return (
        # CPU-only pods: fewer but CPU- and memory-heavy.
        PodKind(
            weight=0.133,
            cpu={8: 0.3, 16: 0.3, 32: 0.25, 64: 0.15},
            memory_gib={32: 0.3, 64: 0.3, 128: 0.25, 256: 0.15},
        ),
        # Sharing pods: gpu_milli, most often 500 or less.
        PodKind(
            weight=0.378,
            milli={
                100: 0.06,
                200: 0.08,
                250: 0.12,
                300: 0.06,
                400: 0.06,
                500: 0.38,
                600: 0.06,
                700: 0.06,
                750: 0.04,
                800: 0.04,
                900: 0.04,
            },
            cpu=host_small,
            memory_gib=mem_small,
        ),
        PodKind(weight=0.464, gpus=1, cpu=host_small, memory_gib=mem_small),
        PodKind(weight=0.010, gpus=2, cpu={16: 0.5, 24: 0.5}, memory_gib={64: 0.5, 96: 0.5}),
        PodKind(weight=0.010, gpus=4, cpu={32: 0.6, 48: 0.4}, memory_gib={128: 0.6, 192: 0.4}),
        PodKind(weight=0.005, gpus=8, cpu={64: 0.6, 88: 0.4}, memory_gib={256: 0.6, 384: 0.4}),
    )


@dataclass(frozen=True, slots=True)
class OpenbParams:
    """Everything the generator draws from. scale shrinks the node counts (0.25 = a
    quarter-size cluster with the same mix); demand is the GPUs requested by all arrivals
    as a multiple of the cluster's GPUs."""

    nodes: tuple[NodeKind, ...] = field(default_factory=_default_nodes)
    pods: tuple[PodKind, ...] = field(default_factory=_default_pods)
    scale: float = 1.0
    demand: float = 1.3
    seed: int = 1

    @staticmethod
    def from_json(data: dict[str, Any]) -> OpenbParams:
        """Parameters from a JSON object with the field names above (missing = default)."""
        values = dict(data)
        if "nodes" in values:
            values["nodes"] = tuple(NodeKind(**n) for n in values["nodes"])
        if "pods" in values:
            values["pods"] = tuple(_pod_from_json(p) for p in values["pods"])
        return OpenbParams(**values)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pod_from_json(data: dict[str, Any]) -> PodKind:
    tables = {k: {float(v) if k != "milli" else int(v): w for v, w in data.get(k, {}).items()}
              for k in ("milli", "cpu", "memory_gib")}  # fmt: skip
    return PodKind(weight=data["weight"], gpus=data.get("gpus", 0), **tables)


@dataclass(frozen=True, slots=True)
class Pod:
    """One arrival: whole GPUs, or gpu_milli of one, or neither; CPU and memory."""

    id: str
    gpus: int
    milli: int
    cpu: float
    memory_gib: float

    @property
    def gpu(self) -> float:
        """GPUs the pod requests."""
        return self.gpus + self.milli / 1000


def cluster_nodes(params: OpenbParams) -> list[NodeSpec]:
    """The cluster's nodes, kinds interleaved so that node order says nothing of kind."""
    nodes: list[NodeSpec] = []
    for kind in params.nodes:
        for _ in range(max(1, round(kind.count * params.scale)) if kind.count else 0):
            nodes.append(
                NodeSpec(
                    name="",
                    pool="default",
                    gpus=kind.gpus,
                    gpu_model=kind.gpu_model,
                    gpu_memory_mib=kind.gpu_memory_mib,
                    rack="",
                    cpu=kind.cpu,
                    memory_gib=kind.memory_gib,
                )
            )
    random.Random(f"nodes-{params.seed}").shuffle(nodes)
    return [_named(node, i) for i, node in enumerate(nodes)]


def _named(node: NodeSpec, i: int) -> NodeSpec:
    return replace(node, name=f"n{i:04d}")


def _draw(rng: random.Random, table: dict[Any, float]) -> Any:
    values = sorted(table)
    return rng.choices(values, weights=[table[v] for v in values])[0]


def arrivals(params: OpenbParams) -> list[Pod]:
    """Pods in arrival order until their GPUs add up to demand times the cluster's GPUs."""
    rng = random.Random(f"pods-{params.seed}")
    capacity = sum(n.gpus for n in cluster_nodes(params))
    kinds = list(params.pods)
    pods: list[Pod] = []
    requested = 0.0
    while requested < params.demand * capacity - 1e-9:
        kind = rng.choices(kinds, weights=[k.weight for k in kinds])[0]
        milli = _draw(rng, kind.milli) if kind.milli else 0
        cpu = float(_draw(rng, kind.cpu)) if kind.cpu else 0.0
        memory = float(_draw(rng, kind.memory_gib)) if kind.memory_gib else 0.0
        pod = Pod(f"p{len(pods) + 1:05d}", kind.gpus, milli, cpu, memory)
        pods.append(pod)
        requested += pod.gpu
    return pods


def write_cluster(params: OpenbParams, path: Path) -> None:
    """The cluster as the simulator's cluster JSON (one entry per node)."""
    entries = [
        {"name": n.name, "gpus": n.gpus, "gpu_model": n.gpu_model, "cpu": n.cpu,
         "memory_gib": n.memory_gib}
        for n in cluster_nodes(params)
    ]  # fmt: skip
    path.write_text(json.dumps({"pools": [{"name": "default", "nodes": entries}]}, indent=1))


def write_trace(params: OpenbParams, path: Path) -> None:
    """The arrivals as the simulator's trace CSV: one pod per second, never ending."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "submit_time", "duration_s", "team", "gpus", "cpu", "memory_gib"])
        for i, pod in enumerate(arrivals(params)):
            gpus = f"{pod.milli / 1000:g}" if pod.milli else str(pod.gpus)
            writer.writerow([pod.id, i, "", "openb", gpus, f"{pod.cpu:g}", f"{pod.memory_gib:g}"])


def main(argv: list[str] | None = None) -> int:
    """Write the cluster JSON and trace CSV for the simulator's event-driven replay."""
    parser = argparse.ArgumentParser(prog="python -m scheduling.engine.sim.openb")
    parser.add_argument("--params", type=Path, help="OpenbParams as JSON (defaults if absent)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--demand", type=float, default=1.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cluster", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    args = parser.parse_args(argv)
    base = json.loads(args.params.read_text()) if args.params else {}
    values = {**base, "scale": args.scale, "demand": args.demand, "seed": args.seed}
    params = OpenbParams.from_json(values)
    write_cluster(params, args.cluster)
    write_trace(params, args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
