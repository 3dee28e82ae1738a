"""Choosing running workloads to evict so that a pending one fits, cheapest first.

A victim's cost is the work it loses: GPU-seconds since its last checkpoint (or its
start) plus `restart_cost_s` for each earlier restart beyond the first, then its
priority, then the fewest GPUs (between victims that lose the same work, often none just
after their checkpoints, the smaller one is taken: a newcomer that needs one GPU does not
stop an 8-GPU job when a 1-GPU job loses no more; issue 24), then the most recently
started goes first.

Why restarts count: a workload that has just resumed from its checkpoint has almost no
unsaved work, so by unsaved work alone it is always the cheapest victim, and the same
job is evicted again and again (the 64-node Philly replay evicted some jobs 10-13
times). So each restart a workload has had beyond its first adds `restart_cost_s`
seconds of its GPUs' work to its cost: the greedy choice then minimises lost work plus
(restart_cost_s / 2) x the sum over jobs of (restarts - 1)+ squared, a convex penalty
that spreads evictions over jobs instead of piling them onto one (as convex costs
spread load in balancing). The first restart is free because being sent back once is
the ordinary price of borrowing idle GPUs; charging it too made the replay evict jobs
with more unsaved work in place of just-resumed ones, losing more work for fewer
evictions. The default, 600 s, is of the order of what a restart really costs a
training job (queueing again, pulling its image, loading its checkpoint, warming up);
docs/simulator.md has the measurements. It changes only the order among the victims the
rules allow, never who may be a victim, so the reclaim rules (and why they cannot
flip-flop) are untouched.

Room is made
node by node: each round picks the node where the cheapest eligible victims free a
block big enough for the largest pod, evicts them, and tries the placement again. This
evicts far fewer workloads than taking victims in global cost order, which scatters the
freed GPUs over many nodes.

The search walks victims in cost order and looks only at the nodes they hold; once the
next victim alone costs more than the best plan found, no unseen node can do better
(each of its victims costs at least as much), so the search stops there.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain

from scheduling.engine.context import Context
from scheduling.engine.state import UNITS, GpuState, NodeState, PodSlot, share_units
from scheduling.engine.statement import slot_amounts
from scheduling.engine.types import EvictionReason, PodRequest, Workload

# Usable victims one search looks at before giving up: keeps a cycle's time bounded
# when no node can be freed; a later cycle (or a smaller request) tries again.
MAX_WALK = 512


def victim_cost(
    wl: Workload, gpus: float, now: float, restart_cost_s: float = 0.0
) -> tuple[float, int, float, float, str]:
    """Sort key of a victim: least work lost (unsaved work plus a charge per earlier
    restart beyond the first), lowest priority, fewest GPUs, most recently started.
    VictimIndex raises the work lost to its queue's lower-priority victims' (_outranked_first)."""
    started = now if wl.started_at is None else wl.started_at
    since = started
    if wl.last_checkpoint_time is not None:
        since = max(started, wl.last_checkpoint_time)
    lost = max(now - since, 0.0) + max(wl.restarts - 1, 0) * restart_cost_s
    return (gpus * lost, wl.priority, gpus, -started, wl.id)


@dataclass(slots=True, eq=False)
class Victim:
    """A running workload that could be evicted: its cost and GPUs held per pool."""

    wl: Workload
    cost: tuple[float, int, float, float, str]
    gpus: dict[str, float]
    nodes: tuple[int, ...]
    due: bool = False  # its checkpoint is due soon (checkpoint_due)


class Rule:
    """Who may be evicted in one search. queue_ok is a coarse test of a whole queue,
    asked once per search (nothing is evicted while searching); victim_ok tests one
    victim of an accepted queue just before it is used. A victim whose checkpoint is
    due soon is passed over unless the rule says work within its guarantee needs the
    room (wait_for_checkpoints False)."""

    wait_for_checkpoints = True

    def queue_ok(self, queue_id: str) -> bool:
        return True

    def victim_ok(self, victim: Victim) -> bool:
        return True

    def allowed(self) -> dict[str, bool] | None:
        """queue_ok for all queues at once (absent = not ok), or None when every queue is
        acceptable and only victim_ok decides."""
        return None


class VictimRule(Rule):
    """A rule from a victim test alone."""

    def __init__(self, test: Callable[[Victim], bool], wait: bool = True) -> None:
        self.test = test
        self.wait_for_checkpoints = wait

    def victim_ok(self, victim: Victim) -> bool:
        return self.test(victim)


@dataclass(slots=True, eq=False)
class Candidates:
    """Victims of one search, in cost order per queue and per node."""

    ordered: list[Victim] = field(default_factory=list)
    by_queue: dict[str, list[Victim]] = field(default_factory=dict)
    per_node: dict[int, list[Victim]] = field(default_factory=dict)
    # id of a Rule.allowed() answer -> (that answer, its accepted queues' victims merged
    # so far, the merge's rest): a rule that keeps its answer while nothing changes
    # (ReclaimRule) walks what was merged for it before again as a plain list
    accepted: dict[int, tuple[dict[str, bool], list[Victim], Iterator[Victim]]] = field(
        default_factory=dict
    )

    def accepted_by(self, ok: dict[str, bool]) -> Iterator[Victim]:
        """The victims of the queues ok accepts, in cost order (the lists do not change
        during a phase, so the merge is the same each time)."""
        kept = self.accepted.get(id(ok))
        if kept is None or kept[0] is not ok:
            by_queue = self.by_queue
            streams = [by_queue[q] for q in sorted(ok) if ok[q] and q in by_queue]
            kept = self.accepted[id(ok)] = (ok, [], heapq.merge(*streams, key=_cost))
        merged, rest = kept[1], kept[2]
        return chain(merged, _noted(rest, merged))

    @staticmethod
    def of(victims: Iterable[Victim]) -> Candidates:
        found = Candidates(sorted(victims, key=_cost))
        for victim in found.ordered:
            found.by_queue.setdefault(victim.wl.queue_id, []).append(victim)
            for order in victim.nodes:
                found.per_node.setdefault(order, []).append(victim)
        return found


def _cost(victim: Victim) -> tuple[float, int, float, float, str]:
    return victim.cost


def _noted(victims: Iterator[Victim], into: list[Victim]) -> Iterator[Victim]:
    """victims, each appended to `into` as it is taken."""
    for victim in victims:
        into.append(victim)
        yield victim


def _holdings(slots: list[PodSlot]) -> tuple[dict[str, float], tuple[int, ...]]:
    """GPUs a running workload holds per pool, and the orders of its nodes."""
    gpus: dict[str, float] = {}
    for slot in slots:
        gpus[slot.node.pool] = gpus.get(slot.node.pool, 0.0) + slot_amounts(slot)[0]
    return gpus, tuple(sorted({s.node.order for s in slots}))


class VictimIndex:
    """Running workloads that could be evicted, per queue and per pool, cheapest first."""

    def __init__(self, ctx: Context, admissible: Callable[[Workload], bool]) -> None:
        # The statement's evictions, not the context: the context holds the index, and a
        # reference back would keep the cycle's garbage for the collector (cycle.paused_gc)
        self.evicted = ctx.stmt.evicted
        self.ledger = ctx.ledger  # its version moves with every eviction and its undoing
        self.by_queue: dict[str, list[Victim]] = {}
        self._pools: dict[str, Candidates] = {}
        self._live: dict[tuple[str, str], tuple[int, list[Victim]]] = {}
        self._below: dict[tuple[str, str, int], tuple[list[Victim], list[Victim]]] = {}
        workloads = ctx.workloads
        kept = [
            wid
            for wid in ctx.state.slots
            if (wl := workloads.get(wid)) is not None
            and wl.placement is not None
            and admissible(wl)
        ]
        parts = ctx.victim_parts  # kept between cycles while a workload holds the same
        for wid in sorted(kept):  # filter first: often few running workloads qualify
            wl = workloads[wid]
            found = parts.get(wid)
            if found is None:
                found = parts[wid] = _holdings(ctx.state.slots[wid])
            gpus, nodes = found
            cost = victim_cost(wl, sum(gpus.values()), ctx.now, ctx.config.restart_cost_s)
            due = checkpoint_due(wl, ctx.now)
            self.by_queue.setdefault(wl.queue_id, []).append(Victim(wl, cost, gpus, nodes, due))
        for victims in self.by_queue.values():
            _outranked_first(victims)
            victims.sort(key=lambda v: v.cost)

    def live(self, queue_id: str, pool: str) -> list[Victim]:
        """The queue's victims holding GPUs in the pool and not evicted yet (kept while
        the ledger stands still: asked for each of the queue's waiting workloads; the
        caller must not change the list)."""
        version = self.ledger.version
        kept = self._live.get((queue_id, pool))
        if kept is not None and kept[0] == version:
            return kept[1]
        evicted = self.evicted
        found = [
            v for v in self.by_queue.get(queue_id, ()) if pool in v.gpus and v.wl.id not in evicted
        ]
        self._live[(queue_id, pool)] = (version, found)
        return found

    def outranked(self, queue_id: str, pool: str, priority: int) -> list[Victim]:
        """live() of a priority below `priority` (kept with live()'s list; the caller
        must not change it)."""
        live = self.live(queue_id, pool)
        kept = self._below.get((queue_id, pool, priority))
        if kept is None or kept[0] is not live:
            below = [v for v in live if v.wl.priority < priority]
            kept = self._below[(queue_id, pool, priority)] = (live, below)
        return kept[1]

    def pool(self, pool: str) -> Candidates:
        """Every victim holding GPUs in the pool (built once per phase)."""
        if pool not in self._pools:
            self._pools[pool] = Candidates.of(
                v for victims in self.by_queue.values() for v in victims if pool in v.gpus
            )
        return self._pools[pool]


def _outranked_first(victims: list[Victim]) -> None:
    """Within one queue and pool, a victim loses no less than the cheapest of the
    queue's victims of lower priority there. Evicted, it would come back and preempt
    that one (priority decides inside a project), so taking it costs that one's work
    too, and a second eviction; with equal costs the lower priority goes first. (A
    just-admitted urgent job used to be reclaimed for losing nothing, then preempted its
    own project's older work on its return, and was reclaimed again.)"""
    floors: dict[int, float] = {}  # id(victim) -> the least its eviction costs
    for pool in {pool for victim in victims for pool in victim.gpus}:
        cheapest, below, level = math.inf, math.inf, None
        there = [v for v in victims if pool in v.gpus]
        for victim in sorted(there, key=lambda v: v.wl.priority):
            if victim.wl.priority != level:
                below, level = cheapest, victim.wl.priority
            if below < math.inf:
                floors[id(victim)] = max(floors.get(id(victim), 0.0), below)
            cheapest = min(cheapest, victim.cost[0])
    for victim in victims:
        floor = floors.get(id(victim), 0.0)
        if victim.cost[0] < floor:
            victim.cost = (floor, *victim.cost[1:])


def checkpoint_due(wl: Workload, now: float) -> bool:
    """Whether the running workload's next checkpoint is due within half its interval:
    evicting it now would lose more than half an interval of its work, and waiting
    for the checkpoint costs whoever needs its GPUs less than that (the victim keeps
    them busy meanwhile). Such a workload is no victim until it has saved; a workload
    that declares no interval, or whose checkpoint is overdue, is not held back."""
    interval = wl.checkpoint_interval_s
    if not interval or wl.started_at is None:
        return False
    since = wl.started_at
    if wl.last_checkpoint_time is not None:
        since = max(since, wl.last_checkpoint_time)
    return interval / 2 <= now - since < interval


def preemptible(ctx: Context) -> VictimIndex:
    """Preemptible running work past its minimum runtime, indexed once per cycle."""
    if ctx.victim_index is None:
        ctx.victim_index = VictimIndex(
            ctx, lambda wl: wl.preemptible and ctx.min_runtime_passed(wl)
        )
    return ctx.victim_index


def can_evict(ctx: Context) -> bool:
    """Whether any running workload may be evicted this cycle (preemptible and past its
    minimum runtime). When none may, consolidation, reclaim and preemption cannot change
    anything, and the cycle skips them whole: consolidation would otherwise try up to
    MAX_ATTEMPTS placements of workloads that already failed, each a search over a pool.
    A stale gang is evicted by its own rule before this is asked. The count of running
    preemptible work is kept between cycles, so a cluster of non-preemptible work pays
    nothing here."""
    return ctx.preemptible_running > 0 and bool(preemptible(ctx).by_queue)


# Why a victim is evicted: its reason and a detail in words (names and numbers).
Cause = Callable[[Workload], tuple[EvictionReason, str]]


def _same(reason: EvictionReason) -> Cause:
    return lambda _victim: (reason, "")


def make_room(
    ctx: Context,
    wl: Workload,
    pool: str,
    candidates: Candidates,
    rule: Rule,
    reason: EvictionReason | Cause,
    max_victims: int,
    ready: Callable[[], bool] = lambda: True,
) -> tuple[list[Workload], list[PodSlot]] | None:
    """Evict the cheapest eligible victims until wl fits in pool, and place it.

    Returns the victims and wl's slots (applied, not yet recorded as an admission), or
    None with everything undone. `ready` is asked before each placement try (a quota
    check that evictions may turn true). `reason` is one for all victims, or a Cause
    that tells each victim's reason and the detail its eviction carries.
    """
    cause = reason if callable(reason) else _same(reason)
    if ctx.searches_left <= 0:
        return None
    ctx.searches_left -= 1
    mark = ctx.stmt.mark()
    models = ctx.state.models_for(pool, wl.gpu_models)
    need = max((max(p.gpus, 1 if p.is_shared else 0) for p in wl.pods), default=0)
    # A single fractional pod needs only room on one device, not a whole free one: so
    # that the search does not evict every sharer of a device where one would do.
    share = wl.pods[0] if len(wl.pods) == 1 and wl.pods[0].is_shared else None
    evicted: list[Workload] = []
    while len(evicted) <= max_victims:
        allowed = ready()
        if allowed:
            slots = ctx.placer.place(wl, pool)
            if slots is not None:
                if len(evicted) > 1:
                    return _only_those_needed(ctx, wl, pool, mark, evicted, cause, ready)
                return evicted, slots
        batch = _cheapest_batch(ctx, wl, pool, models, need, candidates, rule, share)
        if not batch and not allowed and _has_room(ctx, wl, pool):
            # The room is there; wl's quota is what the victims taken so far leave short
            # (a project at its limit whose newcomer outranks several of its small jobs):
            # the cheapest victim frees quota, wherever it runs in the pool.
            batch = next(_usable(ctx, wl, candidates, rule), None)
            batch = [] if batch is None else [batch]
        if not batch or len(evicted) + len(batch) > max_victims:
            break
        for victim in batch:
            if not (rule.queue_ok(victim.wl.queue_id) and rule.victim_ok(victim)):
                break  # earlier evictions of this batch changed the victim's standing
            why, detail = cause(victim.wl)
            ctx.stmt.evict(victim.wl, why, wl.id, detail)
            evicted.append(victim.wl)
    ctx.stmt.discard(mark)
    return None


def _only_those_needed(
    ctx: Context,
    wl: Workload,
    pool: str,
    mark: int,
    evicted: list[Workload],
    cause: Cause,
    ready: Callable[[], bool],
) -> tuple[list[Workload], list[PodSlot]]:
    """Room is made in cost order, cheapest victims first (and for a gang one pod's worth
    at a time), so a later victim may free what an earlier one was taken for: each
    victim, the dearest first, keeps running when wl still fits without evicting it
    (issue 24: one gang reclaim in seven took a job it did not need, which came back the
    next cycle; a 4-GPU pod took three 1-GPU jobs beside the 4-GPU job it needed)."""
    needed = list(evicted)
    for victim in reversed(evicted):
        trial = [v for v in needed if v is not victim]
        if _evict_and_place(ctx, wl, pool, mark, trial, cause, ready) is not None:
            needed = trial
    slots = _evict_and_place(ctx, wl, pool, mark, needed, cause, ready)
    if slots is None:  # cannot happen: the same evictions placed it before
        raise AssertionError(f"{wl.id} no longer fits after the evictions that made room")
    return needed, slots


def _evict_and_place(
    ctx: Context,
    wl: Workload,
    pool: str,
    mark: int,
    victims: list[Workload],
    cause: Cause,
    ready: Callable[[], bool],
) -> list[PodSlot] | None:
    """From the search's start (`mark`): evict `victims`, then try to place wl."""
    ctx.stmt.discard(mark)
    for victim in victims:
        why, detail = cause(victim)
        ctx.stmt.evict(victim, why, wl.id, detail)
    return ctx.placer.place(wl, pool) if ready() else None


def _cheapest_batch(
    ctx: Context,
    wl: Workload,
    pool: str,
    models: list[str],
    need: int,
    candidates: Candidates,
    rule: Rule,
    share: PodRequest | None = None,
) -> list[Victim]:
    """Victims on one node whose eviction leaves room for one pod of wl more there
    (`need` free devices, a multiple of it for a gang; for a fractional pod `share`, one
    device with room for it).

    Walks usable victims in cost order, crediting the devices each would free to its
    nodes; the first node to reach its target gives the batch. No other plan uses only
    cheaper victims, and the walk stops as soon as one plan exists. A victim whose
    checkpoint is due soon is skipped while the rule waits for checkpoints and wl has
    waited less than that victim's checkpoint interval (the bound: cycles that always
    land just before its checkpoints cannot keep wl waiting for ever).
    """
    progress: dict[int, _NodePlan | None] = {}
    pods = len(wl.pods)
    # The host room one pod of wl needs (the largest asks of its pods)
    pod = PodRequest(cpu=max(p.cpu for p in wl.pods), memory_mib=max(p.memory_mib for p in wl.pods))
    for victim in _usable(ctx, wl, candidates, rule):
        for order in victim.nodes:
            if order not in progress:
                node = ctx.state.nodes[order]
                progress[order] = _NodePlan.start(node, pool, models, need, share, pods, pod)
            plan = progress[order]
            if plan is not None and plan.add(ctx, victim):
                return plan.chosen
    return []


def _usable(ctx: Context, wl: Workload, candidates: Candidates, rule: Rule) -> Iterator[Victim]:
    """The victims wl may take, in cost order: not evicted yet, freeing devices, allowed
    by the rule, and not due for a checkpoint the rule waits for (noted for wl's pending
    reason); at most MAX_WALK of them."""
    evicted = ctx.stmt.evicted
    ok = rule.allowed()
    stream: Iterable[Victim] = candidates.ordered
    if ok is not None:
        # Walk only the accepted queues' victims, merged in cost order: most queues are
        # turned away, and skipping their victims one by one would dominate the search.
        stream = candidates.accepted_by(ok)
    budget = MAX_WALK
    slots = ctx.state.slots
    waited = ctx.now - wl.submit_time
    wait = rule.wait_for_checkpoints
    for victim in stream:
        if victim.wl.id in evicted or not _frees_devices(slots.get(victim.wl.id, ())):
            continue
        if wait and victim.due and waited < (victim.wl.checkpoint_interval_s or 0.0):
            _note_checkpoint_wait(ctx, wl, victim.wl, waited)
            continue
        if not rule.victim_ok(victim):
            continue
        budget -= 1
        if budget < 0:
            return
        yield victim


def _has_room(ctx: Context, wl: Workload, pool: str) -> bool:
    """Whether wl's pods would be placed in the pool now (tried, then undone)."""
    mark = ctx.state.mark()
    slots = ctx.placer.place(wl, pool)
    ctx.state.rollback(mark)
    return slots is not None


def _note_checkpoint_wait(ctx: Context, wl: Workload, victim: Workload, waited: float) -> None:
    """Keep, for wl's pending reason, the soonest that a checkpoint wait for this victim
    ends: at its checkpoint, or once wl has waited one interval (whichever is first)."""
    interval = victim.checkpoint_interval_s or 0.0
    since = max(victim.started_at or 0.0, victim.last_checkpoint_time or 0.0)
    left = max(min(since + interval - ctx.now, interval - waited), 0.0)
    kept = ctx.checkpoint_waits.get(wl.id)
    if kept is None or left < kept[0]:
        ctx.checkpoint_waits[wl.id] = (left, victim.name or victim.id)


@dataclass(slots=True, eq=False)
class _NodePlan:
    """Victims credited to one node so far and the devices, CPU and memory they would
    free there."""

    node: NodeState
    free: dict[str, int]
    target: dict[str, int]  # free devices per model that give room for one pod more
    share: PodRequest | None = None
    host: tuple[float, float] = (0.0, 0.0)  # CPU and memory the node must have free
    devices_done: bool = False  # the devices have room for the pod already
    freed: list[float] = field(default_factory=lambda: [0.0, 0.0])  # CPU, memory
    chosen: list[Victim] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)

    @staticmethod
    def start(
        node: NodeState,
        pool: str,
        models: list[str],
        need: int,
        share: PodRequest | None,
        pods: int = 1,
        pod: PodRequest | None = None,
    ) -> _NodePlan | None:
        """A plan for one more pod's room on the node, or None where none is wanted.

        A single pod that does not fit where a node has room already, on its devices
        and its host, is blocked by something else than this node. Where the devices
        have room but the host's CPU or memory does not (borrowed work holding the
        cores next to free GPUs), the plan frees host room only: counting devices
        alone, the search never evicted on such a node and the owner waited for ever.
        A gang of several pods may need room for more than one on a node: its plan
        frees room for one pod more than the node holds now (the search that stopped at
        the first free device of every node left gangs of one-GPU pods waiting for ever
        behind borrowed work; issue 24), with host room for as many pods."""
        if node.pool != pool or not node.schedulable or need == 0:
            return None
        free = {m: node.free_by_model.get(m, 0) for m in models}
        if not free:
            return None
        fits = max(c // need for c in free.values())  # pods of wl the devices hold now
        target = {m: need * (count // need + 1) for m, count in free.items()}
        plan = _NodePlan(node, free, target, share)
        if pods == 1:
            plan.devices_done = fits >= 1 or (
                share is not None and any(plan.has_room(gpu) for gpu in node.gpus)
            )
            room_for = 1
        else:
            plan.devices_done = fits >= pods  # room for the whole gang here already
            room_for = pods if plan.devices_done else fits + 1
        if pod is not None:
            plan.host = (pod.cpu * room_for, pod.memory_mib * room_for)
        if plan.devices_done and plan.host_done():
            return None  # room is there already; what blocks is not this node
        return plan

    def host_done(self) -> bool:
        """Whether the node, without the victims credited so far, has the host room."""
        node, (cpu, memory) = self.node, self.host
        return (
            cpu <= node.cpu_free + self.freed[0] + 1e-9
            and memory <= node.mem_free + self.freed[1] + 1e-9
        )

    def add(self, ctx: Context, victim: Victim) -> bool:
        """Credit a victim; True once the node would have the target's free devices, or
        a device with room for the fractional pod, and the host room."""
        self.chosen.append(victim)
        self.gone.add(victim.wl.id)
        free, share, target = self.free, self.share, self.target
        done = self.devices_done
        for slot in ctx.state.slots.get(victim.wl.id, ()):
            if slot.node is self.node:
                self.freed[0] += slot.cpu
                self.freed[1] += slot.host_memory
        for gpu in _devices_on(ctx, victim.wl.id, self.node):
            if gpu.model in free and _all_holders_gone(gpu, self.gone):
                free[gpu.model] += 1
                done = done or free[gpu.model] >= target[gpu.model]
            done = done or (share is not None and self.has_room(gpu))
        self.devices_done = done
        return done and self.host_done()

    def has_room(self, gpu: GpuState) -> bool:
        """Whether a shared device, without the workloads credited so far, would have
        the share units the fractional pod asks for (as the placer counts them)."""
        if self.share is None or gpu.model not in self.free or gpu.owner is not None:
            return False
        used = sum(units for wid, units, _ in gpu.shares if wid not in self.gone)
        return used + share_units(self.share, gpu.memory_mib) <= UNITS


def _frees_devices(slots: Iterable[PodSlot]) -> bool:
    """Whether evicting a workload frees whole or shared devices: one holding only MIG
    instances frees slices of MIG devices, which no plan here counts, so it is neither
    walked nor chosen (its eviction would gain the beneficiary nothing)."""
    # A plain loop, not any() over a generator (twice as slow): asked of every victim walked
    for slot in slots:  # noqa: SIM110
        if slot.gpus or slot.shared is not None:
            return True
    return False


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
    if not gpu.shares:
        return False
    for wid, _, _ in gpu.shares:  # noqa: SIM110  # a plain loop, as in _frees_devices
        if wid not in gone:
            return False
    return True
