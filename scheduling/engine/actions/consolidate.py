"""Consolidate: defragment when a workload fits in the pool's free GPUs but on no node.

The plan evicts a few preemptible workloads from the node that needs the fewest moves,
places the waiting workload there, then places every moved workload again: elsewhere in
the same pool, or else in another pool it allows and where its quota lets it in. It is
kept only when all of that succeeds; otherwise the whole statement is discarded and
nothing moves. A gang moves whole (all its pods restart together, placed again under its
own topology rule); its cost counts all its GPUs, so single pods go first.
"""

from __future__ import annotations

from scheduling.engine.actions.allocate import borrow_block, in_allocation_order
from scheduling.engine.actions.elastic import shrink_to_defragment
from scheduling.engine.actions.victims import Candidates, VictimRule, make_room, preemptible
from scheduling.engine.context import Context
from scheduling.engine.state import share_units
from scheduling.engine.types import EvictionReason, Workload

MAX_ATTEMPTS = 32  # plans tried per cycle; each may scan every node of a pool


def consolidate(ctx: Context) -> None:
    """Try a move plan for workloads that failed on fragmentation, most starved first."""
    if not ctx.config.consolidate or ctx.config.max_consolidation_moves <= 0:
        return
    waiting = _candidates(ctx)
    if not waiting:
        return
    index = preemptible(ctx)
    movable: dict[str, Candidates] = {}
    in_allocation_order(ctx, waiting)
    attempts = 0
    for wl in waiting:
        for pool in ctx.pools_for(wl):
            if attempts >= MAX_ATTEMPTS:
                return
            if not _fits_in_total(ctx, wl, pool) or ctx.quota_block(wl, pool) is not None:
                continue
            if borrow_block(ctx, wl, pool) is not None:
                continue
            attempts += 1
            slots = shrink_to_defragment(ctx, wl, pool)  # extra pods before whole moves
            if slots is not None:
                ctx.admit(wl, pool, slots)
                break
            if pool not in movable:
                movable[pool] = index.pool(pool)
            if _plan(ctx, wl, pool, movable[pool]):
                break


def _candidates(ctx: Context) -> list[Workload]:
    """Workloads that failed on capacity but that the free GPUs of one of their pools
    could hold in total (for a fractional pod: the free shares of its shared GPUs). Free
    capacity only drops during this phase, so a filter taken once at its start never
    drops a candidate it would later accept."""
    fits: dict[tuple[str, int], bool] = {}  # workloads of one shape fit alike

    def fits_somewhere(wl: Workload) -> bool:
        shape = ctx.shape_of(wl)
        for pool in ctx.pools_for(wl):
            found = fits.get((pool, shape))
            if found is None:
                found = fits[(pool, shape)] = _fits_in_total(ctx, wl, pool)
            if found:
                return True
        return False

    return [wl for wl in ctx.pending() if wl.id in ctx.capacity_failed and fits_somewhere(wl)]


def _fits_in_total(ctx: Context, wl: Workload, pool: str) -> bool:
    models = ctx.state.models_for(pool, wl.gpu_models)
    if not models:
        return False
    whole = sum(p.gpus for p in wl.pods)
    if whole > 0:
        return whole <= ctx.state.free_whole(pool, models)
    if len(wl.pods) != 1 or not wl.pods[0].is_shared:
        return False
    # One fractional pod: the free units of the shared GPUs hold it in total, but no
    # single one does (a free GPU would have taken it).
    for model in models:
        buckets = ctx.state.shared.get((pool, model), {})
        need = share_units(wl.pods[0], ctx.state.group_memory.get((pool, model), 0))
        if sum(free * len(bucket) for free, bucket in buckets.items()) >= need:
            return True
    return False


def _plan(ctx: Context, wl: Workload, pool: str, candidates: Candidates) -> bool:
    """Make room for wl, then re-place every moved workload; all or nothing."""
    mark = ctx.stmt.mark()
    found = make_room(
        ctx,
        wl,
        pool,
        candidates,
        VictimRule(lambda v: v.wl.id not in ctx.stmt.admitted),
        EvictionReason.CONSOLIDATE,
        ctx.config.max_consolidation_moves,
    )
    if found is None:
        return False
    moved, slots = found
    ctx.admit(wl, pool, slots)
    for victim in moved:
        placed = None
        for target in [pool, *(p for p in ctx.pools_for(victim) if p != pool)]:
            # Its own pool first, where moving changes no queue's total; another of its
            # pools only where its quota there allows the GPUs it brings.
            if target == pool or ctx.quota_block(victim, target) is None:
                placed = ctx.placer.place(victim, target)
            if placed is not None:
                break
        if placed is None:
            ctx.stmt.discard(mark)
            return False
        ctx.stmt.record_admission(victim, placed)
    return True
