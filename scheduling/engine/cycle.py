"""The scheduling cycle: one pure function from a snapshot to decisions."""

from __future__ import annotations

import math

from scheduling.engine.actions.allocate import allocate
from scheduling.engine.actions.consolidate import consolidate
from scheduling.engine.actions.preempt import preempt
from scheduling.engine.actions.reclaim import reclaim
from scheduling.engine.actions.stale import evict_stale_gangs
from scheduling.engine.actions.victims import can_evict
from scheduling.engine.context import Context, waiting_sizes
from scheduling.engine.fairshare import (
    FairShareInput,
    Key,
    decayed_usage,
    fair_shares,
    rollup_usage,
)
from scheduling.engine.fragmentation import ShapeHistogram, workload_shapes
from scheduling.engine.placement import Placer
from scheduling.engine.state import ClusterState, PodSlot
from scheduling.engine.statement import Ledger, Statement, slot_placement
from scheduling.engine.types import (
    RESOURCES,
    Admission,
    CycleResult,
    Eviction,
    Resource,
    SchedulerConfig,
    Snapshot,
)


def schedule(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """Run one scheduling cycle over `snapshot` at time `now` and return its decisions.

    Steps, in order:
    1. evict running gangs that stayed below their minimum pods past the grace period;
    2. compute each queue's fair share per pool and resource (hierarchical water-filling);
    3. allocate pending workloads, most starved queue first, gangs all-or-nothing;
    4. consolidate: move preemptible work to free a whole slot when fragmentation blocks;
    5. reclaim: under-quota queues evict preemptible work of queues above fair share;
    6. preempt: inside a project, higher priority evicts lower-priority preemptible work;
    (4-6 are skipped whole when no running workload may be evicted: they could not act);
    7. allocate what evictions freed beyond their beneficiaries' needs;
    8. give every workload still pending a readable reason.

    Pure and deterministic: the same snapshot, config and now give the same result. The
    snapshot is never mutated; apply the result with scheduling.engine.apply.apply_result.
    """
    ctx = build_context(snapshot, config, now)
    evict_stale_gangs(ctx)
    inp = _fair_share_input(ctx)
    ctx.fair = fair_shares(inp)
    ctx.scarce = {
        r: [p for p in ctx.pools if 0 < inp.capacity[(p, r)] < math.inf] for r in Resource
    }
    ctx.scarce[Resource.GPU] = ctx.pools
    allocate(ctx)
    if can_evict(ctx):  # nothing preemptible: no eviction search can find a victim
        consolidate(ctx)
        reclaim(ctx)
        preempt(ctx)
    _reallocate(ctx)
    return _result(ctx)


def _reallocate(ctx: Context) -> None:
    """Evictions can free more than their beneficiaries took: hand what is left to the
    most starved queues, as the first pass would have."""
    if ctx.stmt.evicted:
        ctx.shape_failures.clear()
        allocate(ctx)


def build_context(snapshot: Snapshot, config: SchedulerConfig, now: float) -> Context:
    """The cycle's working set: state with indexes, ledger of running work, placer."""
    state = ClusterState(snapshot)
    queues = {q.id: q for q in snapshot.queues}
    ledger = Ledger(state, snapshot.queues)
    workloads = {wl.id: wl for wl in sorted(snapshot.workloads, key=lambda wl: wl.id)}
    for wid, slots in state.slots.items():
        wl = workloads[wid]
        ledger.add(wl.queue_id, slots, +1, log=False, fixed=not wl.preemptible)
    pools = sorted(set(snapshot.pools) | {n.pool for n in snapshot.nodes})
    pending = [wl for wl in workloads.values() if wl.placement is None]
    strategies = {pool: config.strategy_for(pool) for pool in pools}
    shapes = _shapes(snapshot, config, now, state)
    placer = Placer(state, strategies, waiting_sizes(state, pending), shapes)
    stmt = Statement(state, ledger)
    return Context(snapshot, config, now, state, ledger, stmt, placer, queues, workloads, pools)


def _shapes(
    snapshot: Snapshot, config: SchedulerConfig, now: float, state: ClusterState
) -> ShapeHistogram | None:
    """The pod-shape histogram that fragmentation-aware packing scores against."""
    if not config.fragmentation_half_life_s:
        return None
    memory = min(state.group_memory.values(), default=0)
    return workload_shapes(snapshot.workloads, now, config.fragmentation_half_life_s, memory)


def _fair_share_input(ctx: Context) -> FairShareInput:
    capacity: dict[tuple[str, Resource], float] = {}
    for node in ctx.snapshot.nodes:
        if not node.schedulable:
            continue
        cpu = math.inf if node.cpu is None else node.cpu
        memory = math.inf if node.memory_mib is None else float(node.memory_mib)
        for resource, amount in zip(RESOURCES, (len(node.gpus), cpu, memory), strict=True):
            capacity[(node.pool, resource)] = capacity.get((node.pool, resource), 0.0) + amount
    for pool in ctx.pools:
        for resource in Resource:
            capacity.setdefault((pool, resource), 0.0)
    demand: dict[Key, float] = {k: v for k, v in ctx.ledger.alloc.items() if k[0] in ctx.queues}
    for wl in ctx.pending():
        for pool in ctx.pools_for(wl):
            for resource, amount in zip(RESOURCES, ctx.need(wl, pool), strict=True):
                key = (wl.queue_id, pool, resource)
                demand[key] = demand.get(key, 0.0) + amount
    usage: dict[tuple[str, str], float] = {}
    if ctx.config.fairness_half_life_s:
        raw = decayed_usage(ctx.snapshot.usage_history, ctx.now, ctx.config.fairness_half_life_s)
        usage = rollup_usage(ctx.snapshot.queues, raw)
    return FairShareInput(
        tuple(ctx.queues.values()), capacity, demand, usage, ctx.config.fairness_usage_weight
    )


def _result(ctx: Context) -> CycleResult:
    """Decisions in a stable order, with reasons for all that still wait."""
    stmt = ctx.stmt
    admissions = tuple(
        Admission(wid, tuple(slot_placement(s) for s in sorted(stmt.admitted[wid], key=_pod)))
        for wid in stmt.order
    )
    evictions = tuple(
        Eviction(wid, rec.reason, rec.beneficiary, rec.detail)
        for wid, rec in sorted(stmt.evicted.items())
    )
    reasons = {}
    for wl in ctx.pending():
        reasons[wl.id] = ctx.reasons.get(wl.id, "waiting for the next cycle")
    for wid, rec in sorted(stmt.evicted.items()):
        if wid not in stmt.admitted:
            by = f" for {rec.beneficiary}" if rec.beneficiary else ""
            reasons[wid] = f"evicted ({rec.reason}){by}; waiting to be placed again"
    allocations = {k: v for k, v in sorted(ctx.ledger.alloc.items()) if k[0] in ctx.queues}
    return CycleResult(
        admissions=admissions,
        evictions=evictions,
        pending_reasons=dict(sorted(reasons.items())),
        fair_shares=dict(sorted(ctx.fair.items())),
        allocations=allocations,
        pending_order=tuple(ctx.considered),
    )


def _pod(slot: PodSlot) -> int:
    return slot.pod
