"""The simulated cluster's mutable state: which GPU, CPU and memory each job holds.

The engine's snapshot types are frozen; the simulator changes allocations thousands of
times, so it keeps its own mutable mirror and converts it to a snapshot when a policy
needs one (see engine_policy.py), rebuilding only the nodes that changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.engine.mig import Profile, profiles_for
from scheduling.engine.sim.specs import NodeSpec
from scheduling.engine.types import MigInstance, PodPlacement

EPSILON = 1e-9


@dataclass(slots=True)
class GpuState:
    """One device: held whole by one job, or shared by fractional pods, or free; a MIG
    device holds instances instead (idle ones stay for the next pod of their shape)."""

    index: int
    whole_by: str | None = None
    shares: list[tuple[str, float]] = field(default_factory=list)  # (job id, share)
    mig: bool = False
    instances: list[MigInstance] = field(default_factory=list)

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


@dataclass(slots=True)
class MigCounts:
    """What happened to MIG instances over a replay, and the slices held over time."""

    gpus: int = 0
    created: int = 0
    reused: int = 0
    destroyed: int = 0
    repartitions: int = 0  # placements that destroyed idle instances to cut theirs
    held: int = 0  # compute slices held now
    slice_seconds: float = 0.0
    window_slice_seconds: float = 0.0  # up to the last submission, as gpu_allocation
    since: float = 0.0

    def advance(self, time: float, window_end: float) -> None:
        """Count the slices held from the last call up to `time`."""
        if time > self.since:
            self.slice_seconds += self.held * (time - self.since)
            inside = max(0.0, min(time, window_end) - self.since)
            self.window_slice_seconds += self.held * inside
            self.since = time


def _gpus(spec: NodeSpec, static: bool) -> list[GpuState]:
    """A node's devices: the last mig_gpus MIG-enabled, holding the static layout if asked."""
    first_mig = spec.gpus - spec.mig_gpus
    layout = [MigInstance(name, start) for name, start in spec.mig_layout] if static else []
    return [
        GpuState(i, mig=i >= first_mig, instances=list(layout) if i >= first_mig else [])
        for i in range(spec.gpus)
    ]


class ClusterState:
    """All nodes, indexed by name, with allocation and release of placements. With
    `static_mig`, MIG devices start with their node's mig_layout and the engine may not
    repartition them (engine_policy.node_snapshot)."""

    def __init__(self, specs: list[NodeSpec], static_mig: bool = False) -> None:
        self.nodes = [NodeState(spec, _gpus(spec, static_mig)) for spec in specs]
        self.by_name = {node.spec.name: node for node in self.nodes}
        self.capacity = sum(spec.gpus for spec in specs)
        self.allocated = 0.0  # GPUs held, fractions included
        self.static_mig = static_mig
        self.mig = MigCounts(gpus=sum(spec.mig_gpus for spec in specs))

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
            if pod.mig_gpu is not None:
                self._take_instance(node, pod, job_id)
            node.cpu_used += cpu
            node.memory_used_gib += mem
            node.version += 1
            self.allocated += self._pod_gpus(node, pod)

    def release(self, job_id: str, pods: tuple[PodPlacement, ...], cpu: float, mem: float) -> None:
        """Give back what allocate() recorded for the same placement."""
        for pod in pods:
            node = self.by_name[pod.node_id]
            for index in pod.gpus:
                node.gpus[index].whole_by = None
            if pod.shared_gpu is not None:
                gpu = node.gpus[pod.shared_gpu]
                gpu.shares.remove((job_id, pod.share))
            if pod.mig_gpu is not None:
                self._leave_instance(node, pod, job_id)
            node.cpu_used -= cpu
            node.memory_used_gib -= mem
            node.version += 1
            self.allocated -= self._pod_gpus(node, pod)

    @staticmethod
    def _pod_gpus(node: NodeState, pod: PodPlacement) -> float:
        """GPUs a placed pod holds: whole devices, a share, or a MIG instance's slices / 7."""
        if pod.mig_gpu is not None:
            return _profiles(node)[pod.mig_profile].fraction
        return len(pod.gpus) + (pod.share if pod.shared_gpu is not None else 0)

    def _take_instance(self, node: NodeState, pod: PodPlacement, job_id: str) -> None:
        """The pod's instance: an idle one of its shape reused, or one cut in its place,
        destroying the idle instances it overlaps (never one in use)."""
        assert pod.mig_gpu is not None
        gpu = node.gpus[pod.mig_gpu]
        profiles = _profiles(node)
        profile = profiles[pod.mig_profile]
        mask = profile.mask(pod.mig_start)
        same = [
            i for i in gpu.instances if (i.profile, i.start) == (pod.mig_profile, pod.mig_start)
        ]
        overlap = [i for i in gpu.instances if profiles[i.profile].mask(i.start) & mask]
        if not gpu.mig or any(i.workload_id is not None for i in overlap):
            raise RuntimeError(f"MIG slices {pod.mig_start}+ of {node.spec.name} are not free")
        if same:
            self.mig.reused += 1
        else:
            self.mig.created += 1
            self.mig.destroyed += len(overlap)
            self.mig.repartitions += bool(overlap)
        kept = [i for i in gpu.instances if i not in overlap]
        gpu.instances = sorted(
            [*kept, MigInstance(pod.mig_profile, pod.mig_start, job_id)], key=lambda i: i.start
        )
        self.mig.held += profile.slices

    def _leave_instance(self, node: NodeState, pod: PodPlacement, job_id: str) -> None:
        """The pod's instance stays, idle, for the next pod of its shape."""
        assert pod.mig_gpu is not None
        gpu = node.gpus[pod.mig_gpu]
        mine = MigInstance(pod.mig_profile, pod.mig_start, job_id)
        gpu.instances[gpu.instances.index(mine)] = MigInstance(pod.mig_profile, pod.mig_start)
        self.mig.held -= _profiles(node)[pod.mig_profile].slices


def _profiles(node: NodeState) -> dict[str, Profile]:
    return profiles_for(node.spec.gpu_model, node.spec.gpu_memory_mib)
