"""Choosing running workloads to evict so that a pending one fits, cheapest first.

A victim's cost is the work it loses: GPU-seconds since its last checkpoint (or its
start), then its priority, then the most recently started goes first. Room is made
node by node: each round picks the node where the cheapest eligible victims free a
block big enough for the largest pod, evicts them, and tries the placement again. This
evicts far fewer workloads than taking victims in global cost order, which scatters the
freed GPUs over many nodes.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.engine.context import Context
from scheduling.engine.state import GpuState, NodeState, PodSlot
from scheduling.engine.statement import slot_amounts
from scheduling.engine.types import EvictionReason, Workload

Eligible = Callable[[Workload], bool]


def victim_cost(wl: Workload, gpus: float, now: float) -> tuple[float, int, float, str]:
    """Sort key of a victim: least work lost, lowest priority, most recently started."""
    started = now if wl.started_at is None else wl.started_at
    since = started
    if wl.last_checkpoint_time is not None:
        since = max(started, wl.last_checkpoint_time)
    return (gpus * max(now - since, 0.0), wl.priority, -started, wl.id)


def held_gpus(ctx: Context, wid: str, pool: str | None = None) -> float:
    """GPUs a workload holds now (in one pool, or in all)."""
    return sum(
        slot_amounts(s)[0]
        for s in ctx.state.slots.get(wid, ())
        if pool is None or s.node.pool == pool
    )


class VictimIndex:
    """Running workloads that could be evicted, per node, cheapest first."""

    def __init__(self, ctx: Context, admissible: Eligible) -> None:
        self.by_node: dict[int, list[Workload]] = {}
        self.nodes: dict[int, NodeState] = {}
        running = [
            wl
            for wl in ctx.workloads.values()
            if wl.placement is not None and wl.id in ctx.state.slots and admissible(wl)
        ]
        running.sort(key=lambda wl: victim_cost(wl, held_gpus(ctx, wl.id), ctx.now))
        for wl in running:
            for order in sorted({s.node.order for s in ctx.state.slots[wl.id]}):
                self.by_node.setdefault(order, []).append(wl)
                self.nodes[order] = ctx.state.nodes[order]


def make_room(
    ctx: Context,
    wl: Workload,
    pool: str,
    index: VictimIndex,
    eligible: Eligible,
    reason: EvictionReason,
    max_victims: int,
    ready: Callable[[], bool] = lambda: True,
) -> tuple[list[Workload], list[PodSlot]] | None:
    """Evict the cheapest eligible victims until wl fits in pool, and place it.

    Returns the victims and wl's slots (applied, not yet recorded as an admission), or
    None with everything undone. `ready` is asked before each placement try (a quota
    check that evictions may turn true).
    """
    mark = ctx.stmt.mark()
    models = ctx.state.models_for(pool, wl.gpu_models)
    need = max((max(p.gpus, 1 if p.is_shared else 0) for p in wl.pods), default=0)
    evicted: list[Workload] = []
    while len(evicted) <= max_victims:
        if ready():
            slots = ctx.placer.place(wl, pool)
            if slots is not None:
                return evicted, slots
        batch = _cheapest_batch(ctx, pool, models, need, index, eligible)
        if not batch or len(evicted) + len(batch) > max_victims:
            break
        for victim in batch:
            if not eligible(victim):
                break  # earlier evictions of this batch changed the victim's standing
            ctx.stmt.evict(victim, reason, wl.id)
            evicted.append(victim)
    ctx.stmt.discard(mark)
    return None


def _cheapest_batch(
    ctx: Context,
    pool: str,
    models: list[str],
    need: int,
    index: VictimIndex,
    eligible: Eligible,
) -> list[Workload]:
    best: tuple[tuple[float, int, int], list[Workload]] | None = None
    for order, victims in index.by_node.items():
        node = index.nodes[order]
        if node.pool != pool or not node.schedulable:
            continue
        found = _node_batch(ctx, node, models, need, victims, eligible)
        if found is None:
            continue
        cost = (
            sum(victim_cost(v, held_gpus(ctx, v.id), ctx.now)[0] for v in found),
            len(found),
            order,
        )
        if best is None or cost < best[0]:
            best = (cost, found)
    return [] if best is None else best[1]


def _node_batch(
    ctx: Context,
    node: NodeState,
    models: list[str],
    need: int,
    victims: list[Workload],
    eligible: Eligible,
) -> list[Workload] | None:
    """The cheapest eligible victims on a node whose eviction leaves `need` free devices."""
    free = {m: node.free_by_model.get(m, 0) for m in models}
    if need == 0 or max(free.values(), default=0) >= need:
        return None  # room is there already; what blocks is not this node's GPUs
    chosen: list[Workload] = []
    gone: set[str] = set()
    for victim in victims:
        if victim.id in ctx.stmt.evicted or victim.id not in ctx.state.slots:
            continue
        if not eligible(victim):
            continue
        chosen.append(victim)
        gone.add(victim.id)
        for gpu in _devices_on(ctx, victim.id, node):
            if gpu.model in free and _all_holders_gone(gpu, gone):
                free[gpu.model] += 1
        if max(free.values()) >= need:
            return chosen
    return None


def _devices_on(ctx: Context, wid: str, node: NodeState) -> list[GpuState]:
    devices: list[GpuState] = []
    for slot in ctx.state.slots.get(wid, ()):
        if slot.node is node:
            devices.extend(slot.gpus)
            if slot.shared is not None and slot.shared not in devices:
                devices.append(slot.shared)
    return devices


def _all_holders_gone(gpu: GpuState, gone: set[str]) -> bool:
    if gpu.owner is not None:
        return gpu.owner in gone
    return bool(gpu.shares) and all(wid in gone for wid, _, _ in gpu.shares)
