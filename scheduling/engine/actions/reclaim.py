"""Reclaim: a queue below its deserved quota takes GPUs back from queues above theirs.

The rules: a queue reclaims only while its allocation after admission stays within its
deserved quota and its fair share; a victim's queue must hold more than its fair share,
and keeps at least that share rounded down to whole GPUs. (Shares are rarely whole
numbers while pods hold whole GPUs: insisting on the exact share would leave, say, a
queue deserving 2 of 5 GPUs stuck at 1 while two others sit at 2 with shares of 1.33.)
Queues in different departments compare their departments the same way.

Why this never flip-flops, pool by pool: after a reclaim the reclaimer holds at most its
fair share, so it is never a victim later (victims hold more than theirs). It stays so
for the rest of the cycle: GPUs that evictions free beyond their beneficiaries' needs are
handed out again, but not to a queue past its fair share in a pool where it reclaimed
(Context.share_block; without it the surplus could lift the reclaimer above its share
and the queue it reclaimed from would take GPUs back next cycle). The victim
may reclaim in turn only from queues above their share, which the former reclaimer is
not. Every reclaim lowers what queues hold above their fair shares, and fair shares
depend on quotas and demand, not on who holds the GPUs, so reclaims die out instead of
cycling. (A pending workload counts as demand in every pool it may use, a running one
in its own pool, so an eviction can shift shares in the victim's other pools: the same
two queues may then reclaim from each other in different pools, each under its
deserved quota there, but never back and forth in one pool.) Tests: the 50-cycle
scenario in test_evictions.py and the random-snapshot property in test_properties.py.
"""

from __future__ import annotations

import math

from scheduling.engine.actions.allocate import in_allocation_order
from scheduling.engine.actions.elastic import has_extras, shrink_for
from scheduling.engine.actions.victims import (
    Cause,
    Rule,
    Victim,
    VictimIndex,
    make_room,
    preemptible,
)
from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.types import EvictionReason, Workload

MAX_VICTIMS = 64


class Failures:
    """Requests that failed, per (queue, pool, constraints): a request at least as large
    on both counts (biggest pod, whole gang) would fail too, so it is skipped. Evictions
    only shrink what other queues may still give up, so this holds through the phase."""

    def __init__(self) -> None:
        self.seen: dict[tuple[object, ...], list[tuple[float, float]]] = {}

    @staticmethod
    def _size(wl: Workload, need: float) -> tuple[float, float]:
        return max(max(p.gpus, p.gpu_fraction) for p in wl.pods), need

    def known(self, key: tuple[object, ...], wl: Workload, need: float) -> bool:
        big, total = self._size(wl, need)
        return any(big >= b and total >= t for b, t in self.seen.get(key, ()))

    def add(self, key: tuple[object, ...], wl: Workload, need: float) -> None:
        self.seen.setdefault(key, []).append(self._size(wl, need))


def reclaim(ctx: Context) -> None:
    """Let starved queues' pending workloads evict over-share work of other queues."""
    if not ctx.config.reclaim:
        return
    index = preemptible(ctx)
    if not index.by_queue and not has_extras(ctx):
        return
    failures = Failures()
    waiting = ctx.pending()
    in_allocation_order(ctx, waiting)
    for wl in waiting:
        if ctx.searches_left <= 0:
            return
        for pool in ctx.pools_for(wl):
            if _try_reclaim(ctx, wl, pool, index, failures):
                break


def _try_reclaim(
    ctx: Context, wl: Workload, pool: str, index: VictimIndex, failures: Failures
) -> bool:
    need = ctx.gpu_need(wl, pool)
    if not _may_reclaim(ctx, wl, pool, need):
        return False
    key = (wl.queue_id, pool, wl.gpu_models, wl.topology, wl.pods[0].is_shared)
    if failures.known(key, wl, need):
        return False
    if ctx.quota_block(wl, pool) is not None:
        return False
    free = ctx.state.free_whole(pool, ctx.state.models_for(pool, wl.gpu_models))
    if free + _over_share(ctx, wl.queue_id, pool) < need - EPS:
        failures.add(key, wl, need)
        return False
    rule = ReclaimRule(ctx, wl, pool)
    mark = ctx.stmt.mark()
    # Extra pods of elastic workloads go first; whole workloads only for what is left.
    slots = shrink_for(ctx, wl, pool, rule) if ctx.book.originals else None
    if slots is None:
        cause = owed(ctx, wl, pool)
        found = make_room(ctx, wl, pool, index.pool(pool), rule, cause, MAX_VICTIMS)
        if found is None:
            ctx.stmt.discard(mark)
            failures.add(key, wl, need)
            return False
        slots = found[1]
    ctx.admit(wl, pool, slots)
    ctx.reclaimed.update((qid, pool) for qid in ctx.ledger.chain(wl.queue_id))
    return True


def owed(ctx: Context, wl: Workload, pool: str) -> Cause:
    """Why a reclaim evicts: the beneficiary's project takes back what its guaranteed
    quota owes it, with the numbers ("4 GPUs in pool a100; p1 holds 2 of its deserved
    8"), worked out before anything is evicted."""
    qid = wl.queue_id
    held, deserved = ctx.ledger.get(qid, pool), ctx.deserved(qid, pool)
    gpus = ctx.gpu_need(wl, pool)
    detail = (
        f"{gpus:g} GPU{'s' if gpus != 1 else ''} in pool {pool}; {ctx.name(qid)} holds "
        f"{held:g} of its deserved {deserved:g}"
    )
    return lambda _victim: (EvictionReason.RECLAIM, detail)


def _over_share(ctx: Context, queue_id: str, pool: str) -> float:
    """GPUs other leaf queues hold above their fair share: the most reclaim could free."""
    donors = ctx.donors(pool)
    # fsum: exact, so the order the donors were found in cannot change the figure; kept
    # until the ledger moves (exact sums of sevenths from MIG slices are slow to redo)
    moved = len(ctx.ledger.moved)
    seen, total = ctx.over_memo.get(pool, (-1, 0.0))
    if seen != moved:
        total = math.fsum(v for q, v in donors.items() if ctx.is_leaf(q))
        ctx.over_memo[pool] = (moved, total)
    return total - donors.get(queue_id, 0.0)


def _may_reclaim(ctx: Context, wl: Workload, pool: str, need: float) -> bool:
    """The project stays within its deserved quota and fair share after admitting wl,
    which needs `need` GPUs there."""
    after = ctx.ledger.get(wl.queue_id, pool) + need
    limit = min(ctx.deserved(wl.queue_id, pool), ctx.fair_share(wl.queue_id, pool))
    return after <= limit + EPS


class ReclaimRule(Rule):
    """A victim is fair game when every queue on its side of the tree stays at or above
    its fair share without it, and every queue on the reclaimer's side stays within its
    own share with the new workload.

    A reclaimer is always within its deserved quota (_may_reclaim): the guarantee means
    now, so it never waits for a victim's checkpoint (issue 24: an owner waited 1,220 s
    for a borrower's half-hourly checkpoint). Only claims between over-quota work wait.
    """

    wait_for_checkpoints = False

    def __init__(self, ctx: Context, wl: Workload, pool: str) -> None:
        self.ctx, self.wl, self.pool = ctx, wl, pool
        self.sides: dict[str, list[str]] = {}
        need = ctx.gpu_need(wl, pool)
        # Evicting other queues' work never changes the reclaimer's side: check it once.
        self.fits = {
            qid: ctx.ledger.get(qid, pool) + need <= ctx.fair_share(qid, pool) + EPS
            for qid in ctx.ledger.chain(wl.queue_id)
        }
        self.misfits = [qid for qid, ok in self.fits.items() if not ok]

    def _their_side(self, queue_id: str) -> list[str]:
        side = self.sides.get(queue_id)
        if side is None:
            side = [qid for qid in self.ctx.ledger.chain(queue_id) if qid not in self.fits]
            self.sides[queue_id] = side
        return side

    def queue_ok(self, queue_id: str) -> bool:
        return self._ok(queue_id, self.ctx.donors(self.pool))

    def allowed(self) -> dict[str, bool]:
        """queue_ok for every queue at once, from the set of queues above fair share:
        only those can give anything up. It asks only who the donors are, so it is the
        same for every reclaimer of the queue with the same misfits until a queue joins or
        leaves them: kept that long (the caller must not change it)."""
        ctx = self.ctx
        donors = ctx.donors(self.pool)
        turns = ctx.donor_turns.get(self.pool, 0)
        key = (self.pool, self.wl.queue_id, *self.misfits)
        seen, found = ctx.allowed_memo.get(key, (-1, {}))
        if seen != turns:
            found = self._fresh(donors)
            ctx.allowed_memo[key] = (turns, found)
        return found

    def _fresh(self, donors: dict[str, float]) -> dict[str, bool]:
        return {qid: self._ok(qid, donors) for qid in donors}

    def _ok(self, queue_id: str, donors: dict[str, float]) -> bool:
        if queue_id == self.wl.queue_id or queue_id not in donors:
            return False
        if self.misfits:  # usually none: then the victim's side alone decides
            theirs = self.ctx.ledger.chain(queue_id)
            if any(mine not in theirs for mine in self.misfits):
                return False
        return all(q in donors for q in self._their_side(queue_id))

    def victim_ok(self, victim: Victim) -> bool:
        freed = victim.gpus.get(self.pool, 0.0) - EPS
        donors = self.ctx.donors(self.pool)  # what each may give up, down to its floor
        side = self.sides.get(victim.wl.queue_id)
        for qid in self._their_side(victim.wl.queue_id) if side is None else side:
            if donors.get(qid, 0.0) < freed:
                return False
        return True
