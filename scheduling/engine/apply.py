"""Apply a cycle's result to a snapshot to get the next one (simulation and tests).

Evictions first: an evicted workload loses its placement and goes back to pending
(keeping its last checkpoint, so it resumes from there) with one restart more, as the
portal counts it (Workload.restart_count; victim cost charges restarts); then
admissions: each admitted workload gets its placement and started_at = now, and its
devices are marked on the nodes; then resizes: an elastic workload's placement loses the
pods taken back and gains the pods added, with resized_at = now. Nothing else changes,
so a test can run many cycles without a database.
"""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.mig import next_instances
from scheduling.engine.types import (
    CycleResult,
    Gpu,
    GpuShare,
    Node,
    PodPlacement,
    Resize,
    Snapshot,
    Workload,
)


def apply_result(snapshot: Snapshot, result: CycleResult, now: float) -> Snapshot:
    """The snapshot after the result's evictions and admissions take effect at `now`."""
    evicted = {e.workload_id for e in result.evictions}
    admitted = {a.workload_id: a.pods for a in result.admissions}
    resized = {r.workload_id: r for r in result.resizes}
    workloads = tuple(
        _resized(_next_workload(wl, evicted, admitted, now), resized, now)
        for wl in snapshot.workloads
    )
    return _with_devices(replace(snapshot, workloads=workloads), known=set())


def remove_workloads(snapshot: Snapshot, ids: set[str]) -> Snapshot:
    """The snapshot without these workloads (finished ones) and what they held."""
    workloads = tuple(wl for wl in snapshot.workloads if wl.id not in ids)
    return _with_devices(replace(snapshot, workloads=workloads), known=ids)


def _with_devices(snapshot: Snapshot, known: set[str]) -> Snapshot:
    """Device allocations rebuilt from the workloads' placements. Allocations by ids
    neither in the snapshot nor in `known` (pods the engine does not manage) stay."""
    known = known | {wl.id for wl in snapshot.workloads}
    held = _holdings(snapshot.workloads)
    nodes = tuple(_next_node(node, held.get(node.id, {}), known) for node in snapshot.nodes)
    return replace(snapshot, nodes=nodes)


def _next_workload(
    wl: Workload,
    evicted: set[str],
    admitted: dict[str, tuple[PodPlacement, ...]],
    now: float,
) -> Workload:
    if wl.id in admitted:
        return replace(wl, placement=admitted[wl.id], started_at=now, degraded_since=None)
    if wl.id in evicted:
        return replace(
            wl, placement=None, started_at=None, degraded_since=None, restarts=wl.restarts + 1
        )
    return wl


def _resized(wl: Workload, resized: dict[str, Resize], now: float) -> Workload:
    change = resized.get(wl.id)
    if change is None or wl.placement is None:
        return wl
    gone = set(change.removed)
    kept = tuple(p for p in wl.placement if p.pod not in gone)
    placement = tuple(sorted(kept + change.added, key=lambda p: p.pod))
    return replace(wl, placement=placement, resized_at=now)


Holding = tuple[str, PodPlacement]


def _holdings(workloads: tuple[Workload, ...]) -> dict[str, dict[int, list[Holding]]]:
    """node id -> device index -> (workload id, pod placement) for every running pod."""
    held: dict[str, dict[int, list[Holding]]] = {}
    for wl in workloads:
        for placed in wl.placement or ():
            devices = held.setdefault(placed.node_id, {})
            indices = placed.gpus if placed.shared_gpu is None else (placed.shared_gpu,)
            if placed.mig_gpu is not None:
                indices = (placed.mig_gpu,)
            for index in indices:
                devices.setdefault(index, []).append((wl.id, placed))
    return held


def _next_node(node: Node, held: dict[int, list[Holding]], known: set[str]) -> Node:
    gpus = tuple(_next_gpu(gpu, held.get(gpu.index, []), known) for gpu in node.gpus)
    return replace(node, gpus=gpus)


def _next_gpu(gpu: Gpu, holders: list[Holding], known: set[str]) -> Gpu:
    if gpu.mig:
        return replace(gpu, mig_instances=next_instances(gpu, holders, known))
    foreign = gpu.whole_by if gpu.whole_by not in known else None
    owner = next((wid for wid, p in holders if p.shared_gpu is None), foreign)
    shares = tuple(
        GpuShare(wid, p.share, p.gpu_memory_mib) for wid, p in holders if p.shared_gpu is not None
    ) + tuple(s for s in gpu.shares if s.workload_id not in known)
    return replace(gpu, whole_by=owner, shares=shares)


def apply_changes(snapshot: Snapshot, result: CycleResult, now: float) -> Snapshot:
    """apply_result for a snapshot whose node rows agree with its placements, in time of
    what changed: only the nodes the result names get new objects, the way a caller that
    keeps its rows between cycles (the simulator) hands the next snapshot to cycle.Engine."""
    evicted = {e.workload_id for e in result.evictions}
    admitted = {a.workload_id: a.pods for a in result.admissions}
    touched: dict[str, tuple[set[str], list[Holding]]] = {}
    for wl in snapshot.workloads:
        if wl.id in evicted:
            for placed in wl.placement or ():
                touched.setdefault(placed.node_id, (set(), []))[0].add(wl.id)
    for wid, pods in admitted.items():
        for placed in pods:
            touched.setdefault(placed.node_id, (set(), []))[1].append((wid, placed))
    workloads = tuple(
        _next_workload(wl, evicted, admitted, now) if wl.id in evicted or wl.id in admitted else wl
        for wl in snapshot.workloads
    )
    nodes = tuple(
        _changed_node(node, *touched[node.id]) if node.id in touched else node
        for node in snapshot.nodes
    )
    return replace(snapshot, nodes=nodes, workloads=workloads)


def _changed_node(node: Node, gone: set[str], added: list[Holding]) -> Node:
    gpus = []
    for gpu in node.gpus:
        owner = None if gpu.whole_by in gone else gpu.whole_by
        shares = [s for s in gpu.shares if s.workload_id not in gone]
        for wid, placed in added:
            if placed.shared_gpu == gpu.index:
                shares.append(GpuShare(wid, placed.share, placed.gpu_memory_mib))
            elif placed.shared_gpu is None and gpu.index in placed.gpus:
                owner = wid
        gpus.append(replace(gpu, whole_by=owner, shares=tuple(shares)))
    return replace(node, gpus=tuple(gpus))
