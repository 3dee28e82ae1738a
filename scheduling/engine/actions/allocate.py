"""Allocate: place pending workloads, most starved queue first.

Queues are ordered by (at or above deserved quota, allocation ÷ fair share, id), so a
queue under its deserved quota always goes before one above it. Inside a queue,
workloads go by priority, then submit time. A shape that did not fit a pool is not
tried again in this phase: free capacity only shrinks while allocating, so it would
fail again, and skipping it keeps the phase linear in pending workloads.
"""

from __future__ import annotations

import heapq
import math

from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.reasons import capacity_reason
from scheduling.engine.types import Workload


def starvation_key(ctx: Context, queue_id: str) -> tuple[bool, float, float, str]:
    """Sort key of a queue: under its (reachable) deserved quota first, then the least
    allocated against its fair share."""
    alloc = sum(ctx.ledger.get(queue_id, pool) for pool in ctx.pools)
    fair, deserved = ctx.totals(queue_id)
    at_quota = alloc >= deserved - EPS
    # A queue with no fair share comes after every queue that has one.
    ratio = alloc / fair if fair > EPS else math.inf
    return (at_quota, ratio, alloc, queue_id)


def allocate(ctx: Context) -> None:
    """Place pending workloads queue by queue (most starved first), each all-or-nothing.

    1. group pending workloads by queue, each group by priority then age;
    2. pop the most starved queue, try its next workload in each allowed pool in order;
    3. put the queue back with its new key while it has workloads left.
    """
    by_queue: dict[str, list[Workload]] = {}
    for wl in reversed(ctx.pending()):
        by_queue.setdefault(wl.queue_id, []).append(wl)  # reversed: pop() gives the next
    heap = [(starvation_key(ctx, qid), qid) for qid in sorted(by_queue)]
    heapq.heapify(heap)
    while heap:
        _, qid = heapq.heappop(heap)
        waiting = by_queue[qid]
        try_admit(ctx, waiting.pop())
        if waiting:
            heapq.heappush(heap, (starvation_key(ctx, qid), qid))


def try_admit(ctx: Context, wl: Workload) -> bool:
    """Place the workload in its first pool that has quota and room; record why not."""
    if not wl.pods or wl.gang_min > len(wl.pods):
        ctx.reasons[wl.id] = f"asks for {len(wl.pods)} pods but needs {wl.gang_min} to start"
        return False
    reasons = []
    shape = ctx.shape_of(wl)
    for pool in ctx.pools_for(wl):
        blocked = ctx.quota_block(wl, pool)
        if blocked is None:
            blocked = ctx.shape_failures.get((pool, shape))
        if blocked is None:
            slots = None if ctx.placer.cannot_fit(wl, pool) else ctx.placer.place(wl, pool)
            if slots is not None:
                ctx.admit(wl, pool, slots)
                return True
            blocked = capacity_reason(ctx, wl, pool)
            ctx.shape_failures[(pool, shape)] = blocked
            ctx.capacity_failed.add(wl.id)
        elif (pool, shape) in ctx.shape_failures:
            ctx.capacity_failed.add(wl.id)
        reasons.append(blocked)
    ctx.reasons[wl.id] = "; ".join(reasons) or "no node pool allowed for this workload"
    return False
