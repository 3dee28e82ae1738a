"""The scheduling cycle: one pure function from a snapshot to decisions."""

from __future__ import annotations

import contextlib
import gc
import math
import threading
from collections.abc import Iterator

from scheduling.engine.actions.allocate import allocate
from scheduling.engine.actions.consolidate import consolidate
from scheduling.engine.actions.elastic import elastic_view, extra_demand, grow, has_extras, resizes
from scheduling.engine.actions.preempt import preempt
from scheduling.engine.actions.reclaim import reclaim
from scheduling.engine.actions.stale import evict_stale_gangs
from scheduling.engine.actions.victims import can_evict
from scheduling.engine.context import Context
from scheduling.engine.fairshare import (
    FairShareInput,
    Key,
    decayed_usage,
    fair_shares,
    rollup_usage,
)
from scheduling.engine.incremental import EngineState
from scheduling.engine.resizes import Book
from scheduling.engine.state import PodSlot
from scheduling.engine.statement import slot_placement
from scheduling.engine.types import (
    Admission,
    CycleResult,
    Eviction,
    Resource,
    SchedulerConfig,
    Snapshot,
)


def schedule(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """Run one scheduling cycle over `snapshot` at time `now` and return its decisions.

    Builds the cluster state from scratch; Engine.schedule keeps it between cycles and
    gives the same decisions at the cost of what changed. Pure and deterministic: the
    same snapshot, config and now give the same result. The snapshot is never mutated;
    apply the result with scheduling.engine.apply.apply_result.
    """
    snapshot, book = elastic_view(snapshot)
    with paused_gc():
        return run_cycle(EngineState(snapshot), config, now, keep=False, book=book)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cycle collector off for the duration (and back on after, if it was on).

    A cycle allocates many short-lived containers, so the collector would run several
    full passes over everything alive, the kept state's hundreds of thousands of objects
    included: a fifth of `scale`'s cycle. Reference counting frees the cycle's garbage as
    it goes; what forms reference cycles (the undo log's closures) waits for the next
    collection after the cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Engine:
    """A scheduler that keeps its state between cycles (incremental.EngineState).

    Each cycle applies what changed since the last snapshot; a snapshot the diff cannot
    explain, or a cycle that failed, makes the next one rebuild from scratch (`rebuild`
    forces that). `builds` and `updates` count how each cycle's state was obtained."""

    def __init__(self) -> None:
        self.state: EngineState | None = None
        self.builds = 0
        self.updates = 0
        self._lock = threading.Lock()

    def rebuild(self) -> None:
        """Drop the kept state: the next cycle builds it from its snapshot."""
        with self._lock:
            self.state = None

    def schedule(self, snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        """One cycle over `snapshot`, deciding exactly as schedule() would.

        The state is taken out while the cycle runs: a cycle started meanwhile (another
        thread) builds its own, and one that fails leaves none behind (its update or
        undo may have stopped half-way)."""
        with self._lock:
            kept, self.state = self.state, None
        snapshot, book = elastic_view(snapshot)
        with paused_gc():
            if kept is not None and kept.update(snapshot):
                self.updates += 1
            else:
                kept = EngineState(snapshot)
                self.builds += 1
            result = run_cycle(kept, config, now, keep=True, book=book)
        with self._lock:
            self.state = kept
        return result


def run_cycle(
    es: EngineState, config: SchedulerConfig, now: float, keep: bool, book: Book | None = None
) -> CycleResult:
    """One cycle over a built or updated state; with `keep`, undo its changes after.

    Steps, in order:
    1. evict running gangs that stayed below their minimum pods past the grace period;
    2. compute each queue's fair share per pool and resource (hierarchical water-filling);
    3. allocate pending workloads, most starved queue first, gangs all-or-nothing;
    4. consolidate: move preemptible work to free a whole slot when fragmentation blocks;
    5. reclaim: under-quota queues evict preemptible work of queues above fair share;
    6. preempt: inside a project, higher priority evicts lower-priority preemptible work;
    (4-6 are skipped whole when no running workload may be evicted: they could not act);
    7. allocate what evictions freed beyond their beneficiaries' needs;
    8. grow elastic workloads toward their maximum with GPUs still idle;
    9. give every workload still pending a readable reason.
    (`book`: the elastic workloads as submitted, elastic_view; a pending one is a gang of
    its minimum to every other action, and reclaim takes extra pods before whole
    workloads: actions/elastic.py.)
    """
    ctx = es.context(config, now)
    if book is not None:
        ctx.book = book
    evict_stale_gangs(ctx)
    inp = _fair_share_input(ctx)
    ctx.fair = fair_shares(inp)
    ctx.scarce = {
        r: [p for p in ctx.pools if 0 < inp.capacity[(p, r)] < math.inf] for r in Resource
    }
    ctx.scarce[Resource.GPU] = ctx.pools
    allocate(ctx)
    # Nothing preemptible and no extra pods: no eviction search can find a victim.
    if can_evict(ctx) or (ctx.book.originals and has_extras(ctx)):
        consolidate(ctx)
        reclaim(ctx)
        preempt(ctx)
    _reallocate(ctx)
    if ctx.book.originals:
        grow(ctx)
    result = _result(ctx)
    if keep:
        es.settle()
    return result


def _reallocate(ctx: Context) -> None:
    """Evictions can free more than their beneficiaries took: hand what is left to the
    most starved queues, as the first pass would have."""
    if ctx.stmt.evicted:
        ctx.shape_failures.clear()
        allocate(ctx)


def build_context(snapshot: Snapshot, config: SchedulerConfig, now: float) -> Context:
    """The cycle's working set, built from scratch: state with indexes, ledger, placer."""
    return EngineState(snapshot).context(config, now)


def _fair_share_input(ctx: Context) -> FairShareInput:
    capacity = dict(ctx.capacity)
    for pool in ctx.pools:
        for resource in Resource:
            capacity.setdefault((pool, resource), 0.0)
    demand: dict[Key, float] = {k: v for k, v in ctx.ledger.alloc.items() if k[0] in ctx.queues}
    for key, amount in ctx.pending_demand.items():  # kept between cycles: no pass over them
        demand[key] = demand.get(key, 0.0) + amount
    if ctx.book.originals:
        extra_demand(ctx, demand)
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
        if wl.id in ctx.checkpoint_waits:
            left, victim = ctx.checkpoint_waits[wl.id]
            reasons[wl.id] += (
                f"; waiting about {left:.0f} s for {victim}'s checkpoint before preempting it"
            )
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
        resizes=resizes(ctx) if ctx.book.changes else (),
    )


def _pod(slot: PodSlot) -> int:
    return slot.pod
