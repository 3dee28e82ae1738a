"""Preempt: inside a project, a higher-priority workload evicts lower-priority ones, and
work within the project's guarantee evicts the project's own borrowed work.

Only preemptible workloads of the same project that have run their minimum runtime are
victims, and only when the project's quota allows the newcomer once they are gone. Runs
after reclaim: it costs the project its own work. A victim has a strictly lower
priority, or it is borrowed (see `Guarantee`) and the newcomer, of at least its
priority, fits inside the deserved quota beside the project's guaranteed work.

Why the second rule (issue 18, docs/simulator.md "No team worse off"): a team whose
running work includes a job larger than its quota, started on idle GPUs, would
otherwise keep its next in-quota job waiting until that job ends: on the 64-node Philly
replay, a 4-GPU job of a team with a quota of 4 waited 81,000 s behind the team's own
8-GPU job. On a private cluster of its quota the 8-GPU job could never have run, and
the 4-GPU job would have started at once. It cannot flip-flop: the guaranteed set
(taken in the queue's own order, greedily, within the deserved quota) only grows by
this rule (the newcomer joins it and everything in it still fits), and a borrowed
victim that comes back is borrowed again, so it never evicts its evictor this way.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.engine.actions.allocate import borrow_block
from scheduling.engine.actions.elastic import has_extras, shrink_for, shrink_in_queue
from scheduling.engine.actions.guarantee import Guarantee
from scheduling.engine.actions.reclaim import BorrowedRule, Failures, owed
from scheduling.engine.actions.victims import (
    Candidates,
    Cause,
    Victim,
    VictimIndex,
    VictimRule,
    make_room,
    preemptible,
)
from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.state import PodSlot
from scheduling.engine.types import EvictionReason, Workload

MAX_VICTIMS = 64
# Skip a search for borrowed work that provably fails as one before it did (NoPlan), and
# walk only the victims such a search may take (BorrowedRule.candidates);
# tests/engine/test_preempt_memo.py turns both off to check that decisions stay the same.
MEMO_SEARCHES = True


def preempt(ctx: Context) -> None:
    """Let each pending workload evict lower-priority work of its own project."""
    if not ctx.config.preempt:
        return
    index = preemptible(ctx)
    if not index.by_queue and not has_extras(ctx):
        return
    failures = Failures()
    guarantee = Guarantee(ctx)
    no_plan = NoPlan(ctx)
    for wl in ctx.pending():
        if ctx.searches_left <= 0:
            return
        if wl.queue_id not in index.by_queue and not has_extras(ctx, wl.queue_id):
            continue
        for pool in ctx.pools_for(wl):
            if _try_preempt(ctx, wl, pool, index, failures, guarantee, no_plan):
                break


def _try_preempt(
    ctx: Context,
    wl: Workload,
    pool: str,
    index: VictimIndex,
    failures: Failures,
    guarantee: Guarantee,
    no_plan: NoPlan,
) -> bool:
    need = ctx.gpu_need(wl, pool)
    borrowed = guarantee.borrowed_for(wl, pool, need)
    key = (wl.queue_id, wl.priority, pool, wl.gpu_models, wl.topology, wl.pods[0].is_shared)
    # Most tries at scale have no victim they may take here and no extra pods to take
    # back: they end as the search for victims below would, without it.
    nothing = not ctx.book.originals and not index.outranked(wl.queue_id, pool, wl.priority)
    if not borrowed and (nothing or failures.known(key, wl, need)):
        return False
    if not wl.preemptible and ctx.nonpreemptible_block(wl, pool) is not None:
        return False  # evicting preemptible work frees none of its non-preemptible quota
    mark = ctx.stmt.mark()
    # Extra pods of the project's elastic workloads go before any whole workload.
    slots = shrink_in_queue(ctx, wl, pool, lambda e: _extras_of(e, wl))
    if slots is None and borrowed:  # then other projects' borrowed work, then its own
        slots = _take_borrowed(ctx, wl, pool, index, guarantee, no_plan)
    if slots is not None:
        ctx.admit(wl, pool, slots)
        guarantee.forget(wl.queue_id)
        return True

    def eligible(victim: Victim) -> bool:
        if victim.wl.queue_id != wl.queue_id:
            return False
        return victim.wl.priority < wl.priority or (
            victim.wl.priority <= wl.priority and victim.wl.id in borrowed
        )

    if borrowed:
        victims = [v for v in index.live(wl.queue_id, pool) if eligible(v)]
    else:  # eligible() is then only the lower priority, and asked of many alike
        victims = index.outranked(wl.queue_id, pool, wl.priority)
    free = ctx.state.free_whole(pool, ctx.state.models_for(pool, wl.gpu_models))
    if not victims or free + sum(v.gpus[pool] for v in victims) < need - EPS:
        ctx.stmt.discard(mark)
        if not borrowed:
            failures.add(key, wl, need)
        return False

    found = make_room(
        ctx,
        wl,
        pool,
        Candidates.of(victims),
        VictimRule(eligible, wait=not borrowed),
        _outranked_or_owed(ctx, wl, pool, guarantee),
        MAX_VICTIMS,
        # Work within the guarantee is not borrowing; other newcomers borrow no more
        # than allocation would let them (allocate.borrow_block).
        ready=lambda: ctx.quota_block(wl, pool) is None
        and (bool(borrowed) or borrow_block(ctx, wl, pool) is None),
    )
    if found is None:
        ctx.stmt.discard(mark)
        if not borrowed:
            failures.add(key, wl, need)
        return False
    ctx.admit(wl, pool, found[1])
    guarantee.forget(wl.queue_id)
    return True


def _outranked_or_owed(ctx: Context, wl: Workload, pool: str, guarantee: Guarantee) -> Cause:
    """Why wl evicts a workload of its own project: a higher priority, or (at the same
    priority) its guaranteed quota taking back GPUs the victim borrowed over it."""
    owes = owed(ctx, wl, pool, guarantee)

    def cause(victim: Workload) -> tuple[EvictionReason, str]:
        if victim.priority < wl.priority:
            return EvictionReason.PREEMPT, f"priority {wl.priority} over {victim.priority}"
        return EvictionReason.BORROWED, owes(victim)[1]

    return cause


def _take_borrowed(
    ctx: Context,
    wl: Workload,
    pool: str,
    index: VictimIndex,
    guarantee: Guarantee,
    no_plan: NoPlan,
) -> list[PodSlot] | None:
    """Work within its project's guarantee first evicts other projects' borrowed work
    (reason `reclaim`): only work their own deserved quota does not cover, of a project
    above its fair share that keeps that share rounded down (as reclaim does). Returns
    wl's slots (placed, not recorded), or None with nothing evicted."""
    rule = BorrowedRule(ctx, wl, pool, guarantee)
    if not any(rule.allowed().values()):
        return None
    mark = ctx.stmt.mark()
    # Other projects' extra pods go before any of their whole workloads, as in reclaim.
    extras = BorrowedRule(ctx, wl, pool, guarantee, extras=True)
    slots = shrink_for(ctx, wl, pool, extras) if ctx.book.originals else None
    if slots is None:
        found = no_plan.search(
            wl,
            pool,
            lambda: make_room(
                ctx,
                wl,
                pool,
                rule.candidates(index.pool(pool)) if MEMO_SEARCHES else index.pool(pool),
                rule,
                owed(ctx, wl, pool, guarantee),
                MAX_VICTIMS,
            ),
        )
        if found is None:
            ctx.stmt.discard(mark)
            return None
        for victim in found[0]:
            guarantee.forget(victim.queue_id)
        slots = found[1]
    ctx.reclaimed.update((qid, pool) for qid in ctx.ledger.chain(wl.queue_id))
    return slots


def _extras_of(owner: Workload, wl: Workload) -> bool:
    """Whose extra pods wl may take back: its project's elastic work of at most its
    priority (extras run on idle GPUs; they never outrank a waiting job)."""
    return owner.queue_id == wl.queue_id and owner.priority <= wl.priority and owner.id != wl.id


Search = Callable[[], tuple[list[Workload], list[PodSlot]] | None]


class NoPlan:
    """Searches for other projects' borrowed work (_take_borrowed's make_room) that found
    no plan and changed nothing, per request and the state they ran in: the same request
    in the same state finds none again, so it is answered without the walk.

    Why the answer is the same, not merely likely: the search reads the state (slots,
    free devices, evictions, ledger), the queue's donors and guarantees, and of the
    workload only its queue, its GPU need and its shape (pods, gang, models, topology,
    growth: ShapeKey and grows_to; BorrowedRule never waits for checkpoints, so its
    submit time and id do not count). The state is the same while the ledger's version
    (bumped by every admission and eviction, and by their undoing) and the undo log's
    length are: nothing was evicted or admitted since, not even tentatively, so every
    memo the walk reads (Guarantee.split, Context.donors, keyed by counts) holds what the
    first walk read. A search that itself evicted anything, tentatively or not, is never
    matched again. A skipped search still spends its share of the cycle's search budget, as
    make_room would have, so later searches run exactly as before."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.failed: dict[tuple[object, ...], tuple[int, int]] = {}

    def _state(self) -> tuple[int, int]:
        return self.ctx.ledger.version, len(self.ctx.state.log)

    def search(
        self, wl: Workload, pool: str, walk: Search
    ) -> tuple[list[Workload], list[PodSlot]] | None:
        """walk()'s answer, or None without walking where it would find none again."""
        ctx = self.ctx
        key = (wl.queue_id, pool, ctx.gpu_need(wl, pool), ctx.shape_of(wl), wl.grows_to)
        before = self._state()
        if MEMO_SEARCHES and self.failed.get(key) == before:
            if ctx.searches_left > 0:  # as make_room spends it
                ctx.searches_left -= 1
            return None
        budget = ctx.searches_left
        found = walk()
        if found is None and budget > 0:
            # kept under the state it began in: one that evicted, even tentatively, moved
            # the ledger's version, which only grows, so that state never comes back
            self.failed[key] = before
        return found
