"""Elastic workloads: started at their minimum, grown with idle GPUs, shrunk first.

An elastic workload (Workload.elastic) asks for len(pods) pods but runs with any number
from min_pods up. The rules:
- admission: a pending elastic workload is, to allocate, reclaim, preempt and
  consolidate, a gang of its first min_pods pods (`start_view`), so it starts as soon
  as its minimum fits within quota, like any other job;
- growth (`grow`, after every other action): idle GPUs go to elastic workloads one pod
  at a time, most starved queue first (the allocation order), within quota limits, so
  a queue may go over its quota by borrowing exactly as a pending job would. Its pods
  beyond min_pods ("extras") count as demand in the fair share, so the over-quota split
  divides idle GPUs among elastic jobs by over-quota weight;
- shrink (`shrink_for`, called by reclaim before it evicts whole workloads): extras of
  the victim queues' elastic workloads are taken back, newest first (last resized
  workload first, highest pod index first), under the same rule as whole victims (a
  victim queue keeps its fair share rounded down). Never below min_pods: only extras
  are candidates; below that reclaim evicts the workload whole, as for any other.
  Preemption (`shrink_in_queue`) first takes extras of the waiting job's own project
  of at most its priority, and consolidation (`shrink_to_defragment`) extras of its own
  project or of projects above their fair share, before either touches a whole
  workload. Fractional extras count too: a shared device is freed once all its shares
  are taken, and a fractional job needs only room on one device;
- a pending elastic workload carries `grows_to` (its maximum), so that a required
  topology domain with room for it all is preferred (placement.py): a GPU range
  (one-GPU pods on one node, scheduling/gpu_range.py) starts where it can grow;
- extras are never "fixed" (non-preemptible) work, even for a non-preemptible
  workload: taking them back does not stop the service, so they may borrow.

Why growth cannot flip-flop with reclaim: growth uses only GPUs still idle after
allocation and reclaim, never evicts, and skips workloads shrunk in the same cycle; a
shrink happens only for a pending workload that reclaim (or preemption, or
consolidation: each discards its shrinks when it admits nothing) then admits on the
freed GPUs, so the same GPUs are not idle for growth in the next cycle while that workload runs.
Reclaim's own argument (actions/reclaim.py) holds unchanged for the extras: they are
taken only from queues above their fair share.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, replace

from scheduling.engine.actions.allocate import starvation_key
from scheduling.engine.actions.victims import Rule, Victim
from scheduling.engine.context import Context, pending_key
from scheduling.engine.fairshare import EPS, Key
from scheduling.engine.resizes import Book, Change
from scheduling.engine.state import UNITS, PodSlot, share_units
from scheduling.engine.statement import slot_amounts, slot_placement
from scheduling.engine.types import (
    RESOURCES,
    PodRequest,
    Resize,
    Snapshot,
    TopologyMode,
    Workload,
)

MAX_SHRINKS = 64  # extra pods one reclaim may take back, like reclaim's MAX_VICTIMS


def elastic_view(snapshot: Snapshot) -> tuple[Snapshot, Book]:
    """The snapshot the cycle works on, and its elastic workloads as submitted: a pending
    elastic workload is, to every action but growth, a gang of its first min_pods pods.
    Without elastic workloads the snapshot itself (the incremental state's diff stays
    empty)."""
    book = Book()
    workloads = []
    for wl in snapshot.workloads:
        if wl.elastic:
            book.originals[wl.id] = wl
            if wl.placement is None and wl.gang_min < len(wl.pods):
                cut = wl.pods[: wl.gang_min]
                wl = replace(wl, pods=cut, min_pods=None, grows_to=len(wl.pods))  # noqa: PLW2901
        workloads.append(wl)
    if not book.originals:
        return snapshot, book
    return replace(snapshot, workloads=tuple(workloads)), book


def extra_slots(wl: Workload, slots: list[PodSlot]) -> list[PodSlot]:
    """A running elastic workload's pods beyond its minimum, oldest first."""
    return sorted(slots, key=_pod)[wl.gang_min :] if wl.elastic else []


def extra_demand(ctx: Context, demand: dict[Key, float]) -> None:
    """Add what elastic workloads could still grow by to the fair-share demand: the pods
    they do not hold, in their own pool when running, in every allowed pool when not."""
    for wid, wl in ctx.book.originals.items():
        held = len(ctx.state.slots.get(wid, ())) if wl.placement is not None else wl.gang_min
        missing = wl.pods[held:]
        if not missing:
            continue
        running = ctx.state.slots.get(wid)
        pools = [running[0].node.pool] if running else ctx.pools_for(wl)
        view = replace(wl, id=f"{wid}#extra", pods=missing, min_pods=None)
        for pool in pools:
            for resource, amount in zip(RESOURCES, ctx.need(view, pool), strict=True):
                key = (wl.queue_id, pool, resource)
                demand[key] = demand.get(key, 0.0) + amount


def has_extras(ctx: Context, queue_id: str | None = None) -> bool:
    """Whether any running elastic workload (of the queue, if given) holds pods beyond
    its minimum."""
    return any(
        extra_slots(wl, ctx.state.slots.get(wid, []))
        for wid, wl in ctx.book.originals.items()
        if wl.placement is not None and queue_id in (None, wl.queue_id)
    )


# -- growth ---------------------------------------------------------------------------


def grow(ctx: Context) -> None:
    """Give idle GPUs to elastic workloads, one pod at a time.

    1. take the elastic workloads running (or admitted this cycle) below their maximum
       and not shrunk this cycle, grouped by queue in pending order (priority, age);
    2. pop the most starved queue (allocation ÷ fair share, as allocate orders them) and
       try one more pod of its first workload, in the pool and domain it runs in;
    3. a workload that cannot take a pod is done for the cycle; the queue goes back on
       the heap with its new key while it has workloads left.
    """
    by_queue: dict[str, list[Workload]] = {}
    for wid in sorted(ctx.book.originals):
        wl = ctx.book.originals[wid]
        change = ctx.book.changes.get(wid)
        if (change is not None and change.removed) or wid in ctx.stmt.evicted:
            continue
        held = ctx.state.slots.get(wid)
        if held and len(held) < len(wl.pods):
            by_queue.setdefault(wl.queue_id, []).append(wl)
    heap = []
    for qid, waiting in by_queue.items():
        waiting.sort(key=pending_key, reverse=True)  # pop() gives the first
        heap.append((starvation_key(ctx, qid), qid))
    heapq.heapify(heap)
    while heap:
        _, qid = heapq.heappop(heap)
        waiting = by_queue[qid]
        if not _grow_one(ctx, waiting[-1]):
            waiting.pop()
        if waiting:
            heapq.heappush(heap, (starvation_key(ctx, qid), qid))


def _grow_one(ctx: Context, wl: Workload) -> bool:
    """Place one more pod of a running elastic workload; False when it cannot grow."""
    held = ctx.state.slots[wl.id]
    placed = {s.pod for s in held}
    index = next((i for i in range(len(wl.pods)) if i not in placed), None)
    if index is None:
        return False
    pool = held[0].node.pool
    # One pod as a preemptible workload of its own: the quota limits apply to it, the
    # non-preemptible rule does not (extras may always be taken back).
    view = replace(wl, id=f"{wl.id}#pod", pods=(wl.pods[index],), min_pods=None, preemptible=True)
    if ctx.quota_block(view, pool) or ctx.share_block(view, pool):
        return False
    slot = None
    models = ctx.state.models_for(pool, wl.gpu_models)
    for scope in _scopes(ctx, wl, held[0]):
        slot = ctx.placer.place_pod(
            wl.id, index, wl.pods[index], pool, models, scope, wl.gpu_models
        )
        if slot is not None:
            break
    if slot is None:
        return False
    ctx.ledger.add(wl.queue_id, [slot], +1)
    admitted = ctx.stmt.admitted.get(wl.id)
    added = admitted if admitted is not None else _change(ctx, wl.id).added
    added.append(slot)

    def undo() -> None:
        added.pop()

    ctx.state.log.append(undo)
    return True


def _scopes(ctx: Context, wl: Workload, first: PodSlot) -> list[object]:
    """Where a new pod may go: the running pods' topology domain when the workload asks
    for one (only there when required), else anywhere in the pool."""
    topo = wl.topology
    domain = first.node.topology.get(topo.level) if topo is not None else None
    if topo is None or domain is None:
        return [None]
    scope = ctx.placer.scope((first.node.pool, topo.level, domain))
    return [scope] if topo.mode is TopologyMode.REQUIRED else [scope, None]


# -- shrink ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Extra:
    """One extra pod that reclaim could take back, as a victim its rule can judge."""

    wl: Workload
    slot: PodSlot
    victim: Victim


def shrink_for(
    ctx: Context,
    wl: Workload,
    pool: str,
    rule: Rule,
    owners: Callable[[Workload], bool] | None = None,
    ready: Callable[[], bool] = lambda: True,
) -> list[PodSlot] | None:
    """Take extra pods of elastic workloads, newest first, node by node, while that helps
    wl fit in pool; return wl's slots (placed, not yet recorded) once it fits.

    owners picks whose extras are candidates (default: other queues', as reclaim takes);
    `ready` is asked before each placement try (a quota check shrinks may turn true).
    What was taken stays taken when wl still does not fit: the caller evicts whole
    workloads on top of it (extras go before any whole workload) or discards it all.
    Each round takes the newest extras whose release leaves one node with a block big
    enough for wl's largest pod (or, for one fractional pod, a shared device with room
    for it), then tries the placement again.
    """
    if owners is None:
        owners = _other_queue(wl)
    extras = _extras(ctx, pool, owners)
    if not extras:
        return None
    need = max((max(p.gpus, 1 if p.is_shared else 0) for p in wl.pods), default=0)
    share = wl.pods[0] if len(wl.pods) == 1 and wl.pods[0].is_shared else None
    models = ctx.state.models_for(pool, wl.gpu_models)
    taken = 0
    while taken < MAX_SHRINKS:
        batch = _batch(ctx, extras, (need, share), models, rule)
        if not batch:
            return None
        for extra in batch:
            if not (rule.queue_ok(extra.wl.queue_id) and rule.victim_ok(extra.victim)):
                break  # earlier shrinks of this batch changed the queue's standing
            shrink_pod(ctx, extra.wl, extra.slot, wl.id)
            extras.remove(extra)
            taken += 1
        slots = ctx.placer.place(wl, pool) if ready() else None
        if slots is not None:
            return slots
    return None


def shrink_in_queue(
    ctx: Context, wl: Workload, pool: str, eligible: Callable[[Workload], bool]
) -> list[PodSlot] | None:
    """Preemption's and consolidation's first resort: take extra pods of `eligible`
    elastic workloads (wl's own project's, for preemption), newest first, until wl fits
    in pool within its quota. Returns wl's slots (placed, not recorded), or None with
    what it took still taken: the caller evicts whole workloads on top of it or
    discards the statement (ctx.stmt.mark() before calling)."""
    if not ctx.book.originals:
        return None
    return shrink_for(
        ctx, wl, pool, Rule(), eligible, ready=lambda: ctx.quota_block(wl, pool) is None
    )


def shrink_to_defragment(ctx: Context, wl: Workload, pool: str) -> list[PodSlot] | None:
    """Consolidation's first resort: take extra pods, newest first, of wl's own project
    or of projects above their fair share in the pool (whom reclaim could take them
    from), until wl fits within its quota; wl's slots, or None with nothing taken.
    Cheaper than moving whole workloads: an extra pod loses no minimum, and growth
    places it again on idle GPUs in a later cycle."""
    if not ctx.book.originals:
        return None
    mark = ctx.stmt.mark()
    slots = shrink_for(
        ctx,
        wl,
        pool,
        _OverShare(ctx, wl, pool),
        lambda owner: owner.id != wl.id,
        ready=lambda: ctx.quota_block(wl, pool) is None,
    )
    if slots is None:
        ctx.stmt.discard(mark)
    return slots


class _OverShare(Rule):
    """Extras of wl's own project, or of a project above its fair share in the pool
    that stays at or above it without them."""

    def __init__(self, ctx: Context, wl: Workload, pool: str) -> None:
        self.ctx, self.wl, self.pool = ctx, wl, pool

    def queue_ok(self, queue_id: str) -> bool:
        return queue_id == self.wl.queue_id or queue_id in self.ctx.donors(self.pool)

    def victim_ok(self, victim: Victim) -> bool:
        qid = victim.wl.queue_id
        freed = victim.gpus.get(self.pool, 0.0) - EPS
        return qid == self.wl.queue_id or self.ctx.donors(self.pool).get(qid, 0.0) >= freed


def shrink_pod(ctx: Context, wl: Workload, slot: PodSlot, beneficiary: str | None) -> None:
    """Take one pod of a running elastic workload back (undoable)."""
    ctx.state.remove_slot(wl.id, slot)
    ctx.ledger.add(wl.queue_id, [slot], -1)
    _victim_holds_less(ctx, wl, slot)
    change = _change(ctx, wl.id)
    change.removed.append(slot)
    before = change.beneficiary
    change.beneficiary = change.beneficiary or beneficiary

    def undo() -> None:
        change.removed.pop()
        change.beneficiary = before

    ctx.state.log.append(undo)


def _victim_holds_less(ctx: Context, wl: Workload, slot: PodSlot) -> None:
    """Keep the victim index true to what a shrunk workload still holds, so that evicting
    it whole later in the cycle is judged on what that frees (undoable)."""
    index = ctx.victim_index
    victims = index.by_queue.get(wl.queue_id, ()) if index is not None else ()
    pool, gpus = slot.node.pool, slot_amounts(slot)[0]
    for victim in victims:
        if victim.wl.id == wl.id:
            before = victim.gpus  # shared with the kept victim_parts: replaced, not changed
            victim.gpus = {**before, pool: before.get(pool, 0.0) - gpus}

            def undo(victim: Victim = victim, before: dict[str, float] = before) -> None:
                victim.gpus = before

            ctx.state.log.append(undo)


def _extras(ctx: Context, pool: str, owners: Callable[[Workload], bool]) -> list[Extra]:
    """Extra pods (whole or fractional) held in the pool by `owners`, newest first."""
    found = []
    for wid, wl in ctx.book.originals.items():
        slots = ctx.state.slots.get(wid)
        if wl.placement is None or not slots or not owners(wl):
            continue
        for slot in extra_slots(wl, slots):
            if slot.node.pool == pool and (slot.gpus or slot.shared is not None):
                gpus = slot_amounts(slot)[0]
                victim = Victim(wl, (0.0, 0, 0.0, wid), {pool: gpus}, (slot.node.order,))
                found.append(Extra(wl, slot, victim))
    found.sort(key=_newest_first)
    return found


def _other_queue(beneficiary: Workload) -> Callable[[Workload], bool]:
    return lambda wl: wl.queue_id != beneficiary.queue_id


def _newest_first(extra: Extra) -> tuple[float, int, str]:
    wl = extra.wl
    when = wl.resized_at if wl.resized_at is not None else wl.started_at or 0.0
    return (-when, -extra.slot.pod, wl.id)


def _batch(
    ctx: Context,
    extras: list[Extra],
    want: tuple[int, PodRequest | None],
    models: list[str],
    rule: Rule,
) -> list[Extra]:
    """The newest extras on one node whose release leaves `need` free devices of an
    allowed model there, or a shared device with room for the fractional pod `share`:
    walk extras newest first, crediting devices (and a shared device's units) to their
    node. A shared device counts as freed once every unit on it is credited."""
    need, share = want
    chosen: dict[int, list[Extra]] = {}
    freed: dict[tuple[int, str], int] = {}
    units: dict[int, int] = {}  # id(shared device) -> units credited
    for extra in extras:
        if not (rule.queue_ok(extra.wl.queue_id) and rule.victim_ok(extra.victim)):
            continue
        slot, node = extra.slot, extra.slot.node
        devices = [g for g in slot.gpus if g.model in models]
        gpu = slot.shared if slot.shared is not None and slot.shared.model in models else None
        if not devices and gpu is None:
            continue
        chosen.setdefault(node.order, []).append(extra)
        for device in devices:
            freed[(node.order, device.model)] = freed.get((node.order, device.model), 0) + 1
        if gpu is not None:
            done = units[id(gpu)] = units.get(id(gpu), 0) + slot.units
            if done >= gpu.used_units:
                freed[(node.order, gpu.model)] = freed.get((node.order, gpu.model), 0) + 1
            room = UNITS - gpu.used_units + done
            if share is not None and room >= share_units(share, gpu.memory_mib):
                return chosen[node.order]
        if any(
            node.free_by_model.get(m, 0) + freed.get((node.order, m), 0) >= need for m in models
        ):
            return chosen[node.order]
    return []


# -- result ---------------------------------------------------------------------------


def resizes(ctx: Context) -> tuple[Resize, ...]:
    """The size changes of workloads still running after the cycle, by workload id."""
    found = []
    for wid in sorted(ctx.book.changes):
        change = ctx.book.changes[wid]
        if wid in ctx.stmt.evicted or not (change.added or change.removed):
            continue
        added = tuple(slot_placement(s) for s in sorted(change.added, key=_pod))
        removed = tuple(sorted(s.pod for s in change.removed))
        found.append(Resize(wid, added, removed, change.beneficiary))
    return tuple(found)


def _change(ctx: Context, wid: str) -> Change:
    return ctx.book.changes.setdefault(wid, Change())


def _pod(slot: PodSlot) -> int:
    return slot.pod
