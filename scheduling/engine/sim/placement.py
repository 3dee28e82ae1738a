"""Bin-packing placement for the simulator's own baseline policies (fifo, private clusters).

The engine places pods itself; this module exists so the baselines are independent of it.
Placements made during one cycle go into an Overlay first, so a gang is all-or-nothing and
later jobs of the same cycle see the GPUs earlier ones took.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduling.engine.sim.state import EPSILON, ClusterState, NodeState
from scheduling.engine.sim.trace import TraceJob
from scheduling.engine.types import PodPlacement


class Overlay:
    """Tentative allocations on top of the cluster state, made during one cycle."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.taken: dict[str, set[int]] = {}
        self.shared: dict[tuple[str, int], float] = {}
        self.cpu: dict[str, float] = {}
        self.memory: dict[str, float] = {}
        self.free_total = sum(node.free_whole for node in cluster.nodes)

    def free_indices(self, node: NodeState) -> list[int]:
        """Devices of the node that nobody holds, tentatively or really."""
        name = node.spec.name
        taken = self.taken.get(name, ())
        return [
            gpu.index
            for gpu in node.gpus
            if gpu.is_free and gpu.index not in taken and (name, gpu.index) not in self.shared
        ]

    def free_count(self, node: NodeState) -> int:
        """How many of the node's devices nobody holds."""
        return len(self.free_indices(node))

    def shared_used(self, node: NodeState, index: int) -> float:
        """The share of a device in use, tentative shares included."""
        return node.gpus[index].shared_used + self.shared.get((node.spec.name, index), 0.0)

    def host_fits(self, node: NodeState, job: TraceJob) -> bool:
        """Whether one more pod of the job fits the node's CPU and memory."""
        name = node.spec.name
        cpu_ok = node.cpu_free() - self.cpu.get(name, 0.0) >= job.cpu - EPSILON
        return cpu_ok and node.memory_free_gib() - self.memory.get(name, 0.0) >= job.memory_gib

    def take(self, pod: PodPlacement, job: TraceJob) -> None:
        """Record a tentative pod placement."""
        name = pod.node_id
        self.taken.setdefault(name, set()).update(pod.gpus)
        self.free_total -= len(pod.gpus)
        if pod.shared_gpu is not None:
            key = (name, pod.shared_gpu)
            node = self.cluster.by_name[name]
            if node.gpus[pod.shared_gpu].is_free and key not in self.shared:
                self.free_total -= 1  # opening a new shared device
            self.shared[key] = self.shared.get(key, 0.0) + pod.share
        self.cpu[name] = self.cpu.get(name, 0.0) + job.cpu
        self.memory[name] = self.memory.get(name, 0.0) + job.memory_gib


def candidate_nodes(cluster: ClusterState, job: TraceJob) -> list[NodeState]:
    """Schedulable nodes with an allowed GPU model, in cluster order."""
    if not job.gpu_models:
        return cluster.nodes
    return [node for node in cluster.nodes if node.spec.gpu_model in job.gpu_models]


def _place_whole(
    overlay: Overlay, nodes: list[NodeState], job: TraceJob, pod: int
) -> PodPlacement | None:
    """Best fit: the node left with the fewest free devices that still holds the pod."""
    need = int(job.gpus_per_pod)
    best: tuple[int, list[int], NodeState] | None = None
    for node in nodes:
        free = overlay.free_indices(node)
        if len(free) < need or not overlay.host_fits(node, job):
            continue
        if best is None or len(free) < best[0]:
            best = (len(free), free, node)
            if len(free) == need:
                break
    if best is None:
        return None
    return PodPlacement(pod=pod, node_id=best[2].spec.name, gpus=tuple(best[1][:need]))


def _place_fraction(
    overlay: Overlay, nodes: list[NodeState], job: TraceJob, pod: int
) -> PodPlacement | None:
    """Pack onto the fullest shared device that still fits; open a new one only if none."""
    share = job.gpus_per_pod
    best: tuple[float, str, int] | None = None
    for node in nodes:
        if not overlay.host_fits(node, job):
            continue
        for gpu in node.gpus:
            used = overlay.shared_used(node, gpu.index)
            if gpu.whole_by is not None or used <= 0 or used + share > 1 + EPSILON:
                continue
            if best is None or used > best[0]:
                best = (used, node.spec.name, gpu.index)
    if best is None:
        opened = _place_whole(overlay, nodes, job_with_one_gpu(job), pod)
        if opened is None:
            return None
        best = (0.0, opened.node_id, opened.gpus[0])
    return PodPlacement(pod=pod, node_id=best[1], shared_gpu=best[2], share=share)


def job_with_one_gpu(job: TraceJob) -> TraceJob:
    """The same job asking for one whole device, to find a device to open for sharing."""
    return replace(job, gpus_per_pod=1.0)


def place_job(overlay: Overlay, job: TraceJob) -> tuple[PodPlacement, ...] | None:
    """All pods of the job, or None (nothing is taken then). Commits into the overlay.

    A gang with a topology_level goes into one domain of that level (a rack): the domain
    with the fewest free GPUs that holds it, as best fit does for nodes. When the rule is
    only preferred and no single domain holds it, it may spread."""
    whole_needed = 0 if job.is_fractional else job.gpus
    if whole_needed > overlay.free_total:
        return None
    nodes = candidate_nodes(overlay.cluster, job)
    if not job.topology_level or job.pods == 1:
        return _place_pods(overlay, nodes, job)
    domains: dict[str, list[NodeState]] = {}
    for node in nodes:
        if node.spec.rack:  # a node without the level is in no domain of it
            domains.setdefault(node.spec.rack, []).append(node)
    tightest = sorted(domains.items(), key=lambda kv: (sum(map(overlay.free_count, kv[1])), kv[0]))
    for _, members in tightest:
        placed = _place_pods(overlay, members, job)
        if placed is not None:
            return placed
    return None if job.topology_required else _place_pods(overlay, nodes, job)


def _place_pods(
    overlay: Overlay, nodes: list[NodeState], job: TraceJob
) -> tuple[PodPlacement, ...] | None:
    """Every pod of the job on these nodes, or None with nothing taken."""
    # A one-pod job takes nothing before it fails, so only gangs pay for the undo copy.
    saved = _save(overlay) if job.pods > 1 else None
    placer = _place_fraction if job.is_fractional else _place_whole
    placed: list[PodPlacement] = []
    for pod in range(job.pods):
        placement = placer(overlay, nodes, job, pod)
        if placement is None:
            if saved is not None:
                overlay.taken, overlay.shared, overlay.cpu, overlay.memory = saved[:4]
                overlay.free_total = saved[4]
            return None
        overlay.take(placement, job)
        placed.append(placement)
    return tuple(placed)


def _save(overlay: Overlay) -> tuple[Any, ...]:
    return (
        {k: set(v) for k, v in overlay.taken.items()},
        dict(overlay.shared),
        dict(overlay.cpu),
        dict(overlay.memory),
        overlay.free_total,
    )
