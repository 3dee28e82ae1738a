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
from scheduling.engine.actions.guarantee import Guarantee
from scheduling.engine.actions.victims import (
    Candidates,
    Cause,
    Rule,
    Victim,
    VictimIndex,
    make_room,
    preemptible,
)
from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.state import PodSlot
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
    guarantee = Guarantee(ctx)
    waiting = ctx.pending()
    in_allocation_order(ctx, waiting)
    for wl in waiting:
        if ctx.searches_left <= 0:
            return
        for pool in ctx.pools_for(wl):
            if _try_reclaim(ctx, wl, pool, index, failures, guarantee):
                guarantee.forget(wl.queue_id)
                break


def _try_reclaim(
    ctx: Context,
    wl: Workload,
    pool: str,
    index: VictimIndex,
    failures: Failures,
    guarantee: Guarantee,
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
    within_shares = free + _over_share(ctx, wl.queue_id, pool) >= need - EPS
    if not within_shares and free + _over_quota(ctx, wl.queue_id, pool) < need - EPS:
        failures.add(key, wl, need)
        return False
    rule = ReclaimRule(ctx, wl, pool)
    mark = ctx.stmt.mark()
    # Extra pods of elastic workloads go first; whole workloads only for what is left.
    slots = shrink_for(ctx, wl, pool, rule) if ctx.book.originals else None
    if slots is None:
        slots = _evict_for(ctx, wl, pool, index, rule if within_shares else None, guarantee)
        if slots is None:
            ctx.stmt.discard(mark)
            failures.add(key, wl, need)
            return False
    ctx.admit(wl, pool, slots)
    ctx.reclaimed.update((qid, pool) for qid in ctx.ledger.chain(wl.queue_id))
    return True


def _evict_for(
    ctx: Context,
    wl: Workload,
    pool: str,
    index: VictimIndex,
    rule: ReclaimRule | None,
    guarantee: Guarantee,
) -> list[PodSlot] | None:
    """wl's slots after evicting victims (applied, not recorded), or None with nothing
    evicted. Two searches, the second only where the first found no plan:

    1. other projects' work above their fair shares, cheapest first (`rule`; None when
       what they hold above their shares cannot cover wl);
    2. their borrowed work (what their deserved quota does not cover: extra pods of
       elastic workloads first, then whole workloads), each victim's
       side keeping its deserved quota, not its fair share (OverQuotaRule): the
       guarantee is kept even when the only borrowed work is a job too large to take
       within the holder's fair share (issue 24: an owner at 0 of its 4 GPUs waited
       13 min while another project held 22 against a deserved 6).

    (Searching borrowed work first, above the fair shares, was tried: it passes over
    cheaper victims, and the Philly week lost 127.7 GPU-hours instead of 110.1.)
    """
    cause = owed(ctx, wl, pool)
    if rule is not None:
        found = make_room(ctx, wl, pool, index.pool(pool), rule, cause, MAX_VICTIMS)
        if found is not None:
            return found[1]
    if ctx.book.originals:
        # The fallback's extra pods go before its whole workloads too (reclaim's own went
        # first, above the fair shares): a project below its fair share but over its
        # deserved quota lost a whole job while its elastic job kept an extra pod.
        extras = OverQuotaRule(ctx, wl, pool, guarantee, extras=True)
        slots = shrink_for(ctx, wl, pool, extras)
        if slots is not None:
            return slots
    fallback = OverQuotaRule(ctx, wl, pool, guarantee)
    found = make_room(ctx, wl, pool, index.pool(pool), fallback, cause, MAX_VICTIMS)
    return None if found is None else found[1]


def owed(ctx: Context, wl: Workload, pool: str, guarantee: Guarantee | None = None) -> Cause:
    """Why a reclaim evicts: the beneficiary's project takes back what its guaranteed
    quota owes it, with the numbers ("4 GPUs in pool a100; p1 holds 2 of its deserved
    8"), worked out before anything is evicted. A project that holds more than its
    deserved quota takes GPUs back only for work within its guarantee (preempt's rules,
    with `guarantee`): the numbers then say how much of what it holds is its own borrowed
    work, or "holds 18.75 of its deserved 16" reads as a reclaim past the quota."""
    qid = wl.queue_id
    held, deserved = ctx.ledger.get(qid, pool), ctx.deserved(qid, pool)
    gpus = ctx.gpu_need(wl, pool)
    detail = (
        f"{gpus:g} GPU{'s' if gpus != 1 else ''} in pool {pool}; {ctx.name(qid)} holds "
        f"{held:g} of its deserved {deserved:g}"
    )
    if guarantee is not None and held > deserved + EPS:
        borrowed = held - guarantee.split(qid, pool, deserved)[0]
        detail += f", {borrowed:g} of them borrowed by its own work later in its queue"
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


def _over_quota(ctx: Context, queue_id: str, pool: str) -> float:
    """GPUs other leaf queues hold above their deserved quota: the most the fallback of
    a reclaim (OverQuotaRule) could free."""
    over = over_quota(ctx, pool)
    return math.fsum(v for q, v in over.items() if ctx.is_leaf(q)) - over.get(queue_id, 0.0)


def over_quota(ctx: Context, pool: str) -> dict[str, float]:
    """Queues holding more than their deserved quota of GPUs in the pool, each with what
    it holds above it; kept until the ledger moves."""
    moved = len(ctx.ledger.moved)
    seen, found = ctx.over_quota_memo.get(pool, (-1, {}))
    if seen != moved:
        found = {}
        for qid in ctx.queue_ids:
            held, deserved = ctx.ledger.get(qid, pool), ctx.deserved(qid, pool)
            if held > deserved + EPS:
                found[qid] = held - deserved
        ctx.over_quota_memo[pool] = (moved, found)
    return found


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

    def donors(self) -> dict[str, float]:
        """Queues that may give GPUs up, each with how many: down to its fair share
        rounded down."""
        return self.ctx.donors(self.pool)

    def queue_ok(self, queue_id: str) -> bool:
        return self._ok(queue_id, self.donors())

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
        donors = self.donors()  # what each may give up, down to its floor
        side = self.sides.get(victim.wl.queue_id)
        for qid in self._their_side(victim.wl.queue_id) if side is None else side:
            if donors.get(qid, 0.0) < freed:
                return False
        return True


class BorrowedRule(ReclaimRule):
    """Victims for work within its project's guarantee: other projects' borrowed work,
    where reclaim would allow taking it (their side stays at or above its fair share).
    Guaranteed work only ever evicts borrowed work this way, and a project's guaranteed
    set only grows by it, so it cannot flip-flop."""

    def __init__(
        self, ctx: Context, wl: Workload, pool: str, guarantee: Guarantee, extras: bool = False
    ) -> None:
        super().__init__(ctx, wl, pool)
        self.guarantee = guarantee
        self.extras = extras  # judging extra pods: all of them are borrowed room
        self.answer: tuple[int, dict[str, bool]] | None = None

    def allowed(self) -> dict[str, bool]:
        """Not kept between rules as reclaim's is (which work is borrowed moves with the
        guarantees); this rule keeps its answer while the ledger stands still (its
        version moves with every admission, eviction and undoing, and with them the
        donors and the guarantees' splits)."""
        version = self.ctx.ledger.version
        if self.answer is None or self.answer[0] != version:
            self.answer = (version, self._fresh(self.donors()))
        return self.answer[1]

    def _ok(self, queue_id: str, donors: dict[str, float]) -> bool:
        if queue_id == self.wl.queue_id or queue_id not in donors:
            return False
        if not self.ctx.is_leaf(queue_id) or not self.borrowed(queue_id):
            return False
        return all(q in donors for q in self._their_side(queue_id))

    def victim_ok(self, victim: Victim) -> bool:
        if not self.extras and victim.wl.id not in self.borrowed(victim.wl.queue_id):
            return False
        return super().victim_ok(victim)

    def candidates(self, victims: Candidates) -> Candidates:
        """Of the pool's victims, those this rule may take in a search that starts now:
        the borrowed work of the queues it accepts (not judging extra pods). Neither
        grows while the search evicts (donors only shrink, and evicting borrowed work
        leaves a queue's guaranteed set as it was), so the walk is the same as over every
        victim, without turning the guaranteed ones away one by one: most victims of a
        project above its quota are guaranteed work (at 1,000 nodes, ~330 of ~360)."""
        if self.extras:
            return victims
        taken: list[Victim] = []
        for qid, ok in self.allowed().items():
            if ok:
                borrowed = self.borrowed(qid)
                taken += (v for v in victims.by_queue.get(qid, ()) if v.wl.id in borrowed)
        return Candidates.of(taken)

    def borrowed(self, queue_id: str) -> frozenset[str]:
        """The queue's running work its deserved quota does not cover in the pool."""
        deserved = self.ctx.deserved(queue_id, self.pool)
        if self.ctx.ledger.get(queue_id, self.pool) <= deserved + EPS:
            return frozenset()
        return self.guarantee.split(queue_id, self.pool, deserved)[1]


class OverQuotaRule(BorrowedRule):
    """The fallback of a reclaim: other projects' borrowed work (what their deserved
    quota does not cover, Guarantee), each queue on the victim's side keeping at least
    its deserved quota, not its fair share (a share above the deserved quota is a share
    of idle GPUs, not a guarantee). The victim's queue cannot take the GPUs back by
    reclaim (it holds its deserved quota), and the reclaimer stays within its own
    deserved quota and fair share, so this cannot flip-flop either.

    The victim's own project is the exception: there the victim being borrowed is the
    test, not what the project holds above its quota. A 2-GPU job of a project that
    deserves 1 is borrowed whole (no split of the project's work within its quota holds
    it), and counting only the 1 GPU above the quota kept an owner at 0 of its deserved
    quota waiting behind it for ever. The project keeps its guaranteed work. Below its
    deserved quota, it could take back by reclaim any of its work evicted this cycle that
    fits the room the quota leaves it, so the exception holds only while every such job
    (this victim too) is larger than that room: none can reclaim its way back, and this
    cannot flip-flop. (The cheaper searches before this one may have taken the project's
    small jobs: a 1-GPU job of a project that deserves 1, then its 4-GPU job, would leave
    it at 0 with the 1-GPU job owed back.) Its department keeps at least its deserved
    quota, as before, and so does the project when extra pods of its elastic jobs are
    taken."""

    def donors(self) -> dict[str, float]:
        return over_quota(self.ctx, self.pool)

    def victim_ok(self, victim: Victim) -> bool:
        if self.extras:  # extra pods: each queue on the side keeps its deserved quota
            return super().victim_ok(victim)
        qid = victim.wl.queue_id
        if victim.wl.id not in self.borrowed(qid):
            return False
        room = self._room(victim)
        if room > EPS and not self._none_comes_back(victim, room):
            return False
        ctx, pool = self.ctx, self.pool
        short = self._short()
        # Each department on its side keeps its deserved quota, less what its projects
        # are short of theirs by work borrowed whole and taken (this victim's project
        # once it goes: it is short of nothing yet, or it would have no borrowed work):
        # never more, and only by borrowed work.
        mine = max(room, 0.0)
        after = victim.gpus.get(pool, 0.0)
        for q in self._their_side(qid):
            if q == qid:
                continue
            keeps = ctx.deserved(q, pool) - short.get(q, 0.0) - mine
            if ctx.ledger.get(q, pool) - after < keeps - EPS:
                return False
        return True

    def _short(self) -> dict[str, float]:
        """What each project that reclaims took work borrowed whole from in the pool this
        cycle holds below its deserved quota (every job of it taken there larger than
        that room: none comes back), summed into each of its departments too; kept until
        the ledger moves."""
        ctx, pool = self.ctx, self.pool
        moved = len(ctx.ledger.moved)
        seen, found = ctx.short_memo.get(pool, (-1, {}))
        if seen == moved:
            return found
        gone: dict[str, list[float]] = {}
        for wid, record in ctx.stmt.evicted.items():
            held = ctx.victim_parts.get(wid)
            if held is not None and pool in held[0] and record.reason is EvictionReason.RECLAIM:
                gone.setdefault(record.workload.queue_id, []).append(held[0][pool])
        found = {}
        for qid, sizes in gone.items():
            room = ctx.deserved(qid, pool) - ctx.ledger.get(qid, pool)
            if room > EPS and all(gpus > room + EPS for gpus in sizes):
                for q in ctx.ledger.chain(qid):
                    found[q] = found.get(q, 0.0) + room
        ctx.short_memo[pool] = (moved, found)
        return found

    def _room(self, victim: Victim) -> float:
        """What the victim's project holds below its deserved quota in the pool once the
        victim goes (negative: still above it)."""
        qid = victim.wl.queue_id
        held = self.ctx.ledger.get(qid, self.pool) - victim.gpus.get(self.pool, 0.0)
        return self.ctx.deserved(qid, self.pool) - held

    def _none_comes_back(self, victim: Victim, room: float) -> bool:
        """Whether the project, below its deserved quota by `room` once the victim goes,
        is below it only by work larger than that room (the victim and whatever else of
        the project this cycle evicted in the pool)."""
        ctx, pool, qid = self.ctx, self.pool, victim.wl.queue_id
        # The victim itself never fits the room: borrowed, it is held above the quota.
        parts = ctx.victim_parts
        for wid, record in ctx.stmt.evicted.items():
            if record.workload.queue_id == qid:
                held = parts.get(wid)
                if held is None:
                    return False  # not a victim of this index: its GPUs unknown here
                if pool in held[0] and held[0][pool] <= room + EPS:
                    return False
        return True
