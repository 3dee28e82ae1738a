"""The simulated cluster's mutable state: which GPU, CPU and memory each job holds.

The engine's snapshot types are frozen; the simulator changes allocations thousands of
times, so it keeps its own mutable mirror and converts it to a snapshot when a policy
needs one (see engine_policy.py), rebuilding only the nodes that changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.engine.sim.specs import NodeSpec
from scheduling.engine.types import PodPlacement

EPSILON = 1e-9


@dataclass(slots=True)
class GpuState:
    """One device: held whole by one job, or shared by fractional pods, or free."""

    index: int
    whole_by: str | None = None
    shares: list[tuple[str, float]] = field(default_factory=list)  # (job id, share)

    @property
    def shared_used(self) -> float:
        """The sum of the shares on this device."""
        return sum(share for _, share in self.shares)

    @property
    def is_free(self) -> bool:
        """Nobody holds any part of it."""
        return self.whole_by is None and not self.shares


@dataclass(slots=True)
class NodeState:
    """One node and its devices; version counts changes so snapshots can be cached."""

    spec: NodeSpec
    gpus: list[GpuState]
    cpu_used: float = 0.0
    memory_used_gib: float = 0.0
    version: int = 0

    @property
    def free_whole(self) -> int:
        """Devices nobody holds any part of."""
        return sum(1 for gpu in self.gpus if gpu.is_free)

    def cpu_free(self) -> float:
        """Cores left; unlimited when the node does not declare its CPU."""
        return float("inf") if self.spec.cpu is None else self.spec.cpu - self.cpu_used

    def memory_free_gib(self) -> float:
        """Host memory left; unlimited when the node does not declare it."""
        total = self.spec.memory_gib
        return float("inf") if total is None else total - self.memory_used_gib


class ClusterState:
    """All nodes, indexed by name, with allocation and release of placements."""

    def __init__(self, specs: list[NodeSpec]) -> None:
        self.nodes = [NodeState(spec, [GpuState(i) for i in range(spec.gpus)]) for spec in specs]
        self.by_name = {node.spec.name: node for node in self.nodes}
        self.capacity = sum(spec.gpus for spec in specs)
        self.allocated = 0.0  # GPUs held, fractions included

    def allocate(self, job_id: str, pods: tuple[PodPlacement, ...], cpu: float, mem: float) -> None:
        """Record that job_id's pods hold these devices (cpu and mem are per pod)."""
        for pod in pods:
            node = self.by_name[pod.node_id]
            for index in pod.gpus:
                gpu = node.gpus[index]
                if not gpu.is_free:
                    raise RuntimeError(f"GPU {index} of {node.spec.name} is not free for {job_id}")
                gpu.whole_by = job_id
            if pod.shared_gpu is not None:
                gpu = node.gpus[pod.shared_gpu]
                if gpu.whole_by is not None or gpu.shared_used + pod.share > 1 + EPSILON:
                    raise RuntimeError(f"shared GPU {pod.shared_gpu} of {node.spec.name} is full")
                gpu.shares.append((job_id, pod.share))
            node.cpu_used += cpu
            node.memory_used_gib += mem
            node.version += 1
            self.allocated += len(pod.gpus) + (pod.share if pod.shared_gpu is not None else 0)

    def release(self, job_id: str, pods: tuple[PodPlacement, ...], cpu: float, mem: float) -> None:
        """Give back what allocate() recorded for the same placement."""
        for pod in pods:
            node = self.by_name[pod.node_id]
            for index in pod.gpus:
                node.gpus[index].whole_by = None
            if pod.shared_gpu is not None:
                gpu = node.gpus[pod.shared_gpu]
                gpu.shares.remove((job_id, pod.share))
            node.cpu_used -= cpu
            node.memory_used_gib -= mem
            node.version += 1
            self.allocated -= len(pod.gpus) + (pod.share if pod.shared_gpu is not None else 0)
