"""Allocate: place pending workloads, most starved queue first, level by level.

Like the fair share, the order is hierarchical: the most starved department first, then
its most starved project, then that project's best workload (priority, then submit
time). Each level orders its queues by (at or above deserved quota, allocation ÷ fair
share, allocation, id), so a queue under its deserved quota always goes before one above
it, among departments and among a department's projects. A top-level queue without
children is its own department. Admitting a workload changes only its project's and its
department's keys, so each level is a heap and one step costs O(log queues).

A shape that did not fit a pool is not tried again in this phase: free capacity only
shrinks while allocating, so it would fail again, and skipping it keeps the phase linear
in pending workloads.
"""

from __future__ import annotations

import heapq
import math

from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.reasons import capacity_reason
from scheduling.engine.types import Resource, Workload

StarvationKey = tuple[bool, float, float, str]


def starvation_key(ctx: Context, queue_id: str) -> StarvationKey:
    """Sort key of one queue among its siblings: under its (reachable) deserved quota
    first, then the least allocated against its fair share, then the fewest GPUs.

    With CPU or memory limited on the nodes, a queue's standing is its dominant share
    (as in dominant resource fairness): the largest allocation ÷ fair share over GPUs,
    CPU and memory, so a project that holds most of its CPU share with few GPUs does not
    jump the line. It is under its deserved quota while under it in any resource."""
    at_quota, ratio, gpus = True, -math.inf, 0.0
    held = ctx.ledger.alloc.get
    totals = ctx.total_memo.get(queue_id) or ctx.totals(queue_id)
    for is_gpu, keys, fair, deserved in totals:
        alloc = 0.0
        for key in keys:
            alloc += held(key, 0.0)
        if is_gpu:
            gpus = alloc
        if alloc < deserved - EPS:
            at_quota = False
        if fair > EPS:
            ratio = max(ratio, alloc / fair)
        elif alloc > EPS:
            ratio = math.inf  # holds what it has no share of
    # A queue with no fair share comes after every queue that has one.
    return (at_quota, ratio if ratio > -math.inf else math.inf, gpus, queue_id)


def department_of(ctx: Context, queue_id: str) -> str:
    """The top of the queue's chain: its department, or itself at the top level."""
    return ctx.ledger.chain(queue_id)[-1]


def order_key(ctx: Context, queue_id: str) -> tuple[StarvationKey, StarvationKey]:
    """The hierarchical order as one sort key: department's standing, then project's."""
    return (starvation_key(ctx, department_of(ctx, queue_id)), starvation_key(ctx, queue_id))


def in_allocation_order(ctx: Context, waiting: list[Workload]) -> None:
    """Sort workloads as allocation takes them (department, project, then priority and
    age), from each queue's standing now; each queue's key is computed once. `waiting`
    comes in pending order (a part of ctx.pending()), and the sort is stable: sorting by
    queue alone keeps priority and age order inside each queue."""
    keys = {qid: order_key(ctx, qid) for qid in sorted({wl.queue_id for wl in waiting})}
    waiting.sort(key=lambda wl: keys[wl.queue_id])


def allocate(ctx: Context) -> None:
    """Place pending workloads, most starved department and project first, each
    all-or-nothing.

    1. group pending workloads by project (by priority then age) and projects by
       department, each level in a heap of starvation keys;
    2. pop the most starved department, its most starved project, and try that
       project's next workload in each allowed pool in order;
    3. push the project and the department back with their new keys while they have
       workloads left (after an admission: until then they stay on top).
    """
    by_queue: dict[str, list[Workload]] = {}
    for wl in reversed(ctx.pending()):
        by_queue.setdefault(wl.queue_id, []).append(wl)  # reversed: pop() gives the next
    inner: dict[str, list[tuple[StarvationKey, str]]] = {}
    for qid in sorted(by_queue):
        inner.setdefault(department_of(ctx, qid), []).append((starvation_key(ctx, qid), qid))
    for heap in inner.values():
        heapq.heapify(heap)
    top = [(starvation_key(ctx, dept), dept) for dept in sorted(inner)]
    heapq.heapify(top)
    considered = ctx.considered
    while top:
        # Read the tops and put them back with heapreplace (one sift, not a pop and a
        # push): keys end with the queue id, so the order is the same either way.
        dept = top[0][1]
        projects = inner[dept]
        qid = projects[0][1]
        waiting = by_queue[qid]
        # A workload that is not admitted changes no allocation: both keys stay, and
        # the same department and project would come out on top again; so the project's
        # next workload goes without the heaps until one is admitted.
        admitted = False
        failed: dict[FailureKey, tuple[str, bool]] = {}  # nothing moves until admitted
        while waiting and not admitted:
            wl = waiting.pop()
            considered.setdefault(wl.id, None)  # ctx.consider
            admitted = try_admit(ctx, wl, failed)
        if waiting:
            heapq.heapreplace(projects, (starvation_key(ctx, qid), qid))
        else:
            heapq.heappop(projects)
        if projects:
            heapq.heapreplace(top, (starvation_key(ctx, dept), dept))
        else:
            heapq.heappop(top)


FailureKey = tuple[int, bool, tuple[str, ...]]


def try_admit(
    ctx: Context, wl: Workload, failed: dict[FailureKey, tuple[str, bool]] | None = None
) -> bool:
    """Place the workload in its first pool that has quota and room; record why not.

    `failed` holds the outcomes of this queue's workloads that failed since its ledger
    last moved: one of the same shape, kind (preemptible or not) and pools fails alike,
    for the same reasons, so it is not worked out again."""
    if not wl.pods or wl.gang_min > len(wl.pods):
        ctx.reasons[wl.id] = f"asks for {len(wl.pods)} pods but needs {wl.gang_min} to start"
        return False
    shape = ctx.shape_of(wl)
    key = (shape, wl.preemptible, wl.pools)
    seen = failed.get(key) if failed is not None else None
    if seen is not None:
        ctx.reasons[wl.id] = seen[0]
        if seen[1]:
            ctx.capacity_failed.add(wl.id)
        return False
    reasons = []
    capacity = False
    failures = ctx.shape_failures
    for pool in ctx.pools_for(wl):
        blocked = ctx.quota_block(wl, pool) or ctx.share_block(wl, pool)
        failure = failures.get((pool, shape))
        if blocked is None and failure is None:  # else it waits anyway: spare the check
            blocked = borrow_block(ctx, wl, pool)
        if blocked is None and failure is None:
            slots = None if ctx.placer.cannot_fit(wl, pool) else ctx.placer.place(wl, pool)
            if slots is not None:
                ctx.admit(wl, pool, slots)
                return True
            failure = failures[(pool, shape)] = capacity_reason(ctx, wl, pool)
        if failure is not None:
            capacity = True
            ctx.capacity_failed.add(wl.id)
        reasons.append(blocked or failure)
    reason = "; ".join(reasons) or "no node pool allowed for this workload"  # type: ignore[arg-type]
    ctx.reasons[wl.id] = reason
    if failed is not None:
        failed[key] = (reason, capacity)
    return False


# A queue borrows idle GPUs up to this many times its fair share while another queue
# below its fair share is waiting in the pool (issue 18, docs/simulator.md).
BORROW_LIMIT = 2.0


def borrow_block(ctx: Context, wl: Workload, pool: str) -> str | None:
    """Why the workload's queue may not borrow more idle GPUs in the pool, or None.

    A queue past both its deserved quota and BORROW_LIMIT x its fair share takes no more
    while another queue with pending work holds less than its fair share: the GPUs it
    would fill are the ones that queue's work is waiting to see freed (a gang waiting for
    a node to drain), and on the Philly week one team of quota 2 otherwise held 10 GPUs
    for a day while others queued (docs/simulator.md, issue 18)."""
    qid = wl.queue_id
    cap = ctx.borrow_caps.get((qid, pool))
    if cap is None:  # fair shares and quotas stay for the cycle
        fair = ctx.fair.get((qid, pool, Resource.GPU), 0.0)
        cap = ctx.borrow_caps[(qid, pool)] = max(
            BORROW_LIMIT * fair + EPS, ctx.deserved(qid, pool) + EPS
        )
    if ctx.ledger.get(qid, pool) + ctx.gpu_need(wl, pool) <= cap:
        return None
    starved = _starved(ctx, pool)
    if len(starved) <= (qid in starved):
        return None
    fair = ctx.fair.get((qid, pool, Resource.GPU), 0.0)
    return (
        f"{ctx.kind(qid)} {ctx.name(qid)} holds more than {BORROW_LIMIT:g} x its fair share"
        f" of {fair:.3g} GPUs in pool {pool} while other queues wait below theirs"
    )


def _starved(ctx: Context, pool: str) -> set[str]:
    """Queues with pending work (at the cycle's start) holding less than their fair share
    in the pool; kept up to date from the ledger's changes, like Context.donors."""
    seen, found = ctx.starved_memo.get(pool, (-1, set()))
    moved = ctx.ledger.moved
    if seen < 0:
        keys = [k[0] for k in ctx.pending_demand if k[1] == pool and k[2] is Resource.GPU]
    else:
        keys = [k[0] for k in moved[seen:] if k[1] == pool]
    for qid in keys:
        if (
            ctx.pending_demand.get((qid, pool, Resource.GPU), 0.0) > EPS
            and ctx.ledger.get(qid, pool) < ctx.fair.get((qid, pool, Resource.GPU), 0.0) - EPS
        ):
            found.add(qid)
        else:
            found.discard(qid)
    ctx.starved_memo[pool] = (len(moved), found)
    return found
