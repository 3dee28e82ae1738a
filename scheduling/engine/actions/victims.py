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
from dataclasses import dataclass

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


@dataclass(slots=True, eq=False)
class Victim:
    """A running workload that could be evicted: its cost and GPUs held per pool."""

    wl: Workload
    cost: tuple[float, int, float, str]
    gpus: dict[str, float]
    nodes: tuple[int, ...]


class VictimIndex:
    """Running workloads that could be evicted, per queue, cheapest first."""

    def __init__(self, ctx: Context, admissible: Eligible) -> None:
        self.ctx = ctx
        self.by_queue: dict[str, list[Victim]] = {}
        for wl in ctx.workloads.values():
            if wl.placement is None or wl.id not in ctx.state.slots or not admissible(wl):
                continue
            gpus: dict[str, float] = {}
            for slot in ctx.state.slots[wl.id]:
                gpus[slot.node.pool] = gpus.get(slot.node.pool, 0.0) + slot_amounts(slot)[0]
            nodes = tuple(sorted({s.node.order for s in ctx.state.slots[wl.id]}))
            cost = victim_cost(wl, sum(gpus.values()), ctx.now)
            self.by_queue.setdefault(wl.queue_id, []).append(Victim(wl, cost, gpus, nodes))
        for victims in self.by_queue.values():
            victims.sort(key=lambda v: v.cost)

    def live(self, queue_id: str, pool: str) -> list[Victim]:
        """The queue's victims holding GPUs in the pool and not evicted yet."""
        evicted = self.ctx.stmt.evicted
        return [
            v for v in self.by_queue.get(queue_id, ()) if pool in v.gpus and v.wl.id not in evicted
        ]

    def by_node(self, victims: list[Victim]) -> dict[int, list[Victim]]:
        """Victims grouped by the nodes they hold, each group cheapest first."""
        grouped: dict[int, list[Victim]] = {}
        for victim in sorted(victims, key=lambda v: v.cost):
            for order in victim.nodes:
                grouped.setdefault(order, []).append(victim)
        return grouped


def make_room(
    ctx: Context,
    wl: Workload,
    pool: str,
    candidates: dict[int, list[Victim]],
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
        batch = _cheapest_batch(ctx, pool, models, need, candidates, eligible)
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
    candidates: dict[int, list[Victim]],
    eligible: Eligible,
) -> list[Workload]:
    best: tuple[tuple[float, int, int], list[Victim]] | None = None
    for order, victims in candidates.items():
        node = ctx.state.nodes[order]
        if node.pool != pool or not node.schedulable:
            continue
        found = _node_batch(ctx, node, models, need, victims, eligible)
        if found is None:
            continue
        cost = (sum(v.cost[0] for v in found), len(found), order)
        if best is None or cost < best[0]:
            best = (cost, found)
    return [] if best is None else [v.wl for v in best[1]]


def _node_batch(
    ctx: Context,
    node: NodeState,
    models: list[str],
    need: int,
    victims: list[Victim],
    eligible: Eligible,
) -> list[Victim] | None:
    """The cheapest eligible victims on a node whose eviction leaves `need` free devices."""
    free = {m: node.free_by_model.get(m, 0) for m in models}
    if need == 0 or max(free.values(), default=0) >= need:
        return None  # room is there already; what blocks is not this node's GPUs
    chosen: list[Victim] = []
    gone: set[str] = set()
    for victim in victims:
        wid = victim.wl.id
        if wid in ctx.stmt.evicted or not eligible(victim.wl):
            continue
        chosen.append(victim)
        gone.add(wid)
        for gpu in _devices_on(ctx, wid, node):
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
