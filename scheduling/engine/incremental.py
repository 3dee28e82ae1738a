"""The engine's state kept between cycles: each cycle pays for what changed.

A fresh build reads every node, GPU and running pod of the snapshot (time linear in the
cluster). `EngineState` is built once and then brought to the next snapshot by a diff:

- workloads are matched by id; an entry that is the same object (or an equal one) costs
  nothing; one that started, stopped, left or was changed has its old holdings freed
  and its new placement applied; a pending one moves in the allocation order;
- nodes are matched by position and id; a node whose object changed gets its holdings
  by workloads outside the snapshot (`foreign`: pods going away, pods the engine does
  not manage) brought up to date; any other field that differs (its pool, devices,
  capacity, or a field this module does not know) makes the update give up;
- queues: new quotas are taken as they are; a changed tree rebuilds;
- MIG devices: an instance outlives its workload, is cut or repartitioned by a placement
  and may be made or destroyed by the node side, so a MIG device of a node whose MIG pods
  changed, or whose devices differ from the last snapshot's, is made again from the
  snapshot and the running pods on it, exactly as a fresh build makes it (a handful of
  instances per device; the cost follows what changed).

After applying, every node the update touched is checked against the snapshot: the
devices hold exactly what the snapshot says. Anything the diff cannot explain (a
snapshot whose node rows and placements disagree, a pool or node added, a kind of entry
it does not know) makes `update` return False, and the caller rebuilds from scratch:
the rebuild is always correct, the diff only fast.

A cycle works on the state through the undo log; `settle` rolls it back to the
snapshot's state and puts the few things that depend on history (float sums, bucket
order, MIG buckets included) in the form a fresh build gives them, so incremental and
rebuilt states decide alike (tests/engine/test_incremental.py checks it over long random
sequences, with MIG devices among them).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Container, Iterable

from scheduling.engine.context import (
    Context,
    pending_key,
    pools_for,
    waiting_sizes,
    workload_need,
)
from scheduling.engine.fairshare import Key
from scheduling.engine.fragmentation import ShapeTally, cluster_memory, cycle_shapes
from scheduling.engine.mig import MigSlot
from scheduling.engine.placement import Placer, ShapeKey
from scheduling.engine.resizes import fixed_slots
from scheduling.engine.state import UNITS, ClusterState, PodSlot, fixed, unfixed
from scheduling.engine.statement import Ledger, Statement, slot_amounts
from scheduling.engine.types import (
    RESOURCES,
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)

Holding = tuple[int, str, int, int]  # (device index, workload id, units (0 = whole), MiB)
MigClaims = dict[tuple[str, int], MigSlot | None]  # (workload id, placement position) -> slot
MigHolder = tuple[str, int, PodPlacement, PodSlot | None]  # the same, and a kept pod's slot
_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(Node) if f.name != "gpus")
# Who holds a device (MIG instances included: they come and go with workloads) is applied.
_HELD = ("whole_by", "shares", "mig_instances")
_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(Gpu) if f.name not in _HELD)
# Fields whose change alters what a running workload holds; any other is read per cycle.
_HOLDING_FIELDS = ("placement", "pods", "queue_id", "preemptible")


class Rebuild(Exception):
    """The diff met something it cannot apply (caught in update(), never escapes it)."""


class Sums:
    """Allocation per key as exact sums (state.fixed), with the float view a cycle reads.

    A key exists while some running pod counts towards it, as in a fresh build; the
    float is the exact sum rounded once, whatever order the pods came and went in."""

    def __init__(self) -> None:
        self.exact: dict[Key, list[int]] = {}  # key -> [pods counted, exact sum]
        self.view: dict[Key, float] = {}
        self._changed: set[Key] = set()
        self._keys_changed = False

    def add(self, key: Key, amount: float, sign: int) -> None:
        entry = self.exact.get(key)
        if entry is None:
            entry = self.exact[key] = [0, 0]
            self._keys_changed = True
        entry[0] += sign
        entry[1] += sign * fixed(amount)
        if entry[0] == 0:
            del self.exact[key]
            self._keys_changed = True
        self._changed.add(key)

    def refresh(self) -> None:
        """Bring the float view up to date (sorted by key, as a fresh build is)."""
        if self._keys_changed:
            self.view = {k: unfixed(self.exact[k][1]) for k in sorted(self.exact)}
        else:
            for key in self._changed:
                self.view[key] = unfixed(self.exact[key][1])
        self._changed.clear()
        self._keys_changed = False


class EngineState:
    """Cluster state, ledger base and per-snapshot indexes, kept between cycles."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.state = ClusterState(snapshot)
        self.workloads: dict[str, Workload] = {wl.id: wl for wl in snapshot.workloads}
        self.running: dict[str, Workload] = {
            wid: wl for wid, wl in self.workloads.items() if wl.placement is not None
        }
        self.waiting: list[tuple[tuple[int, float, str], Workload]] = sorted(
            (pending_key(wl), wl) for wl in self.workloads.values() if wl.placement is None
        )
        self.alloc, self.fixed, self.demand = Sums(), Sums(), Sums()
        self.shared_pods: dict[PodRequest, int] = {}  # fractional requests waiting, counted
        self.preemptible = 0  # running preemptible workloads
        self.shapes: dict[str, int] = {}  # Context.shape_of, kept while a workload is
        self.shape_ids: dict[ShapeKey, int] = {}
        self.victim_parts: dict[str, tuple[dict[str, float], tuple[int, ...]]] = {}
        self.tally = ShapeTally(snapshot.workloads, cluster_memory(self.state.group_memory))
        self.short: set[str] = set()  # running gangs below their minimum pods
        self.nodes = snapshot.nodes
        self.node_index = {node.id: i for i, node in enumerate(snapshot.nodes)}
        self._set_queues(snapshot.queues)
        self.capacity = _capacity(snapshot.nodes)
        self.pools = sorted(set(snapshot.pools) | {n.pool for n in snapshot.nodes})
        self.foreign = {node.id: _foreign(node, self.running) for node in snapshot.nodes}
        self.mig_users: dict[str, set[str]] = {}  # node id -> running workloads with MIG pods
        self.mig_touched: set[str] = set()  # nodes whose MIG pods changed in this update
        for wl in self.running.values():
            self._mig_use(wl, +1)
        self.mig_touched.clear()
        for wid in sorted(self.state.slots):
            self._account(self.workloads[wid], self.state.slots[wid], +1)
        for _, wl in self.waiting:
            self._ask(wl, +1)
        self._refresh()

    def _refresh(self) -> None:
        for sums in (self.alloc, self.fixed, self.demand):
            sums.refresh()

    # -- a cycle's working set ------------------------------------------------------

    def context(self, config: SchedulerConfig, now: float) -> Context:
        """A Context over the kept state; the cycle's changes go to the undo log."""
        state = self.state
        ledger = Ledger(state, self.snapshot.queues, self.chains)
        ledger.alloc = dict(self.alloc.view)
        ledger.fixed = dict(self.fixed.view)
        waiting = [wl for _, wl in self.waiting]
        strategies = {pool: config.strategy_for(pool) for pool in self.pools}
        shapes = cycle_shapes(self.tally, config, now)
        placer = Placer(
            state,
            strategies,
            waiting_sizes(state, self.shared_pods),
            shapes,
            config.fragmentation_candidates,
        )
        return Context(
            self.snapshot,
            config,
            now,
            state,
            ledger,
            Statement(state, ledger),
            placer,
            self.queues,
            self.workloads,
            self.pools,
            queue_ids=self.queue_ids,
            waiting=waiting,
            parents=self.parents,
            capped=self.capped,
            preemptible_running=self.preemptible,
            short_gangs=sorted(self.short),
            capacity=self.capacity,
            pending_demand=self.demand.view,
            shapes=self.shapes,
            shape_ids=self.shape_ids,
            victim_parts=self.victim_parts,
        )

    def settle(self) -> None:
        """Undo what a cycle tried and put the state in its fresh-build form."""
        self.state.undo_all()
        self.state.settle()

    # -- moving to the next snapshot ------------------------------------------------

    def update(self, snapshot: Snapshot) -> bool:
        """Apply what changed since the last snapshot; False when only a rebuild can
        give the state a fresh build would (the state is then unusable)."""
        if snapshot is self.snapshot:
            return True
        try:
            self._update(snapshot)
        except Rebuild:
            return False
        self.snapshot = snapshot
        return True

    def _update(self, snapshot: Snapshot) -> None:
        """1. pools and queues; 2. which nodes and workloads changed; 3. free what left or
        changed; 4. foreign holdings of changed nodes; 5. MIG devices of nodes whose
        instances or MIG pods changed made again as a fresh build makes them; 6. place what
        started; 7. check every touched node against the snapshot; 8. the float views and
        the order."""
        if snapshot.pools != self.snapshot.pools:
            raise Rebuild
        if snapshot.queues is not self.snapshot.queues:
            self._queues_changed(snapshot.queues)
        nodes = self._nodes_changed(snapshot.nodes)
        changes = self._workloads_changed(snapshot.workloads)
        running = set(self.running)
        for old, new in changes:
            if old is not None:
                running.discard(old.id)
            if new is not None and new.placement is not None:
                running.add(new.id)
        check = set(nodes)
        for old, new in changes:
            if old is not None and old.placement is not None and _holds_differently(old, new):
                self._stop(old, check)
        foreign = [(node_id, self._drop_foreign(snapshot, node_id, running)) for node_id in nodes]
        for node_id, holdings in foreign:
            if holdings is not None:
                self._add_foreign(node_id, holdings)
        placing = {new.id: new for old, new in changes if _starts_holding(old, new)}
        claims = self._reload_mig(snapshot, nodes, placing)
        for old, new in changes:
            self._move(old, new, check, claims)
        self.nodes = snapshot.nodes
        for node_id in sorted(check):
            _verify(self.state, snapshot.nodes[self.node_index[node_id]])
        self.state.log.clear()
        self.state.settle()
        self._refresh()

    def _queues_changed(self, queues: tuple[Queue, ...]) -> None:
        old = {q.id: q.parent_id for q in self.snapshot.queues}
        if {q.id: q.parent_id for q in queues} != old:
            raise Rebuild  # the tree changed: every ledger key may move
        self._set_queues(queues)

    def _set_queues(self, queues: tuple[Queue, ...]) -> None:
        self.queues = {q.id: q for q in queues}
        self.queue_ids = sorted(self.queues)
        self.parents = {q.parent_id for q in queues if q.parent_id is not None}
        self.chains = Ledger.chains_of(queues)
        self.capped: dict[tuple[str, str], list[tuple[Resource, Quota]]] = {}
        for q in queues:
            for (pool, resource), quota in sorted(q.quotas.items()):
                if quota.limit is not None or not quota.over_quota_allowed:
                    self.capped.setdefault((q.id, pool), []).append((resource, quota))

    def _nodes_changed(self, nodes: tuple[Node, ...]) -> list[str]:
        """Ids of nodes whose object changed; Rebuild when one changed in more than who
        holds its devices."""
        if nodes is self.nodes:
            return []
        if len(nodes) != len(self.nodes):
            raise Rebuild
        changed = []
        for old, new in zip(self.nodes, nodes, strict=True):
            if old is new:
                continue
            if old.id != new.id or not _same_hardware(old, new):
                raise Rebuild
            changed.append(new.id)
        return changed

    def _workloads_changed(
        self, workloads: tuple[Workload, ...]
    ) -> list[tuple[Workload | None, Workload | None]]:
        """(old, new) for every workload added, removed or changed, by id."""
        known = self.workloads
        changes: list[tuple[Workload | None, Workload | None]] = []
        seen = 0
        for wl in workloads:
            old = known.get(wl.id)
            if old is not wl:
                if old is not None and old == wl:
                    known[wl.id] = wl  # an equal copy (a new read): nothing to do
                    if wl.placement is not None:
                        self.running[wl.id] = wl
                    else:
                        self._replace_waiting(old, wl)
                else:
                    changes.append((old, wl))
            if old is not None:
                seen += 1
        if seen != len(known):
            ids = {wl.id for wl in workloads}
            if len(ids) != len(workloads):
                raise Rebuild  # duplicate ids: the fresh build decides which counts
            changes.extend((known[wid], None) for wid in sorted(set(known) - ids))
        return changes

    def _replace_waiting(self, old: Workload, new: Workload) -> None:
        i = bisect.bisect_left(self.waiting, (pending_key(old),))
        self.waiting[i] = (pending_key(new), new)

    def _ask(self, wl: Workload, sign: int) -> None:
        """Count a pending workload's request as demand in each pool it may use, and its
        fractional pods among the sizes placement keeps room for."""
        for pod in set(wl.pods):
            if pod.is_shared:
                count = self.shared_pods.get(pod, 0) + sign
                if count:
                    self.shared_pods[pod] = count
                else:
                    del self.shared_pods[pod]
        for pool in pools_for(self.state, self.pools, wl):
            _, need = workload_need(self.state, wl, pool)
            for resource, amount in zip(RESOURCES, need, strict=True):
                self.demand.add((wl.queue_id, pool, resource), amount, sign)

    def _stop(self, old: Workload, check: set[str]) -> None:
        self.victim_parts.pop(old.id, None)
        self._mig_use(old, -1)
        slots = self.state.running_remove(old.id)
        self._account(old, slots, -1)
        check.update(slot.node.id for slot in slots)
        del self.running[old.id]

    def _move(
        self, old: Workload | None, new: Workload | None, check: set[str], mig: MigClaims
    ) -> None:
        """Bring one workload's entry from old to new (its holdings are freed already;
        `mig`: the instances its MIG pods hold, from _reload_mig)."""
        self.tally.change(old, new)
        if old is not None:
            self.shapes.pop(old.id, None)
            if new is None or new.placement is None:
                self.victim_parts.pop(old.id, None)
            if old.placement is None:
                i = bisect.bisect_left(self.waiting, (pending_key(old),))
                del self.waiting[i]
                self._ask(old, -1)
            elif old.id in self.running:  # running before and after, holding the same
                self.running.pop(old.id)
                self._count(old, -1)
            del self.workloads[old.id]
        if new is None:
            return
        self.workloads[new.id] = new
        if new.placement is None:
            bisect.insort(self.waiting, (pending_key(new), new))
            self._ask(new, +1)
            return
        if _starts_holding(old, new):
            slots = self.state.running_add(new, mig)
            self._account(new, slots, +1, count=False)
            check.update(slot.node.id for slot in slots)
        self.running[new.id] = new
        self._count(new, +1)

    def _account(self, wl: Workload, slots: list[PodSlot], sign: int, count: bool = True) -> None:
        """Count a running workload's slots in the ledger sums and the per-run figures."""
        chain = self.chains.get(wl.queue_id, (wl.queue_id,))
        held_fixed = fixed_slots(wl, slots)  # an elastic workload's extras may borrow
        for slot in slots:
            amounts = slot_amounts(slot)
            pool = slot.node.pool
            for qid in chain:
                for resource, amount in zip(RESOURCES, amounts, strict=True):
                    self.alloc.add((qid, pool, resource), amount, sign)
            if held_fixed and slot in held_fixed:
                for resource, amount in zip(RESOURCES, amounts, strict=True):
                    self.fixed.add((wl.queue_id, pool, resource), amount, sign)
        if count:
            self._count(wl, sign, slots)

    def _count(self, wl: Workload, sign: int, slots: list[PodSlot] | None = None) -> None:
        if wl.preemptible:
            self.preemptible += sign
        if sign < 0:
            self.short.discard(wl.id)
            return
        held = self.state.slots.get(wl.id, []) if slots is None else slots
        if len({s.pod for s in held}) < wl.gang_min:
            self.short.add(wl.id)

    def _mig_use(self, wl: Workload, sign: int) -> None:
        """Count (+1) or forget (-1) a running workload's MIG pods on their nodes."""
        for placed in wl.placement or ():
            if placed.mig_gpu is None:
                continue
            users = self.mig_users.setdefault(placed.node_id, set())
            if sign > 0:
                users.add(wl.id)
            else:
                users.discard(wl.id)
            self.mig_touched.add(placed.node_id)

    def _reload_mig(
        self, snapshot: Snapshot, changed: list[str], placing: dict[str, Workload]
    ) -> MigClaims:
        """Each MIG device of a node whose MIG pods changed (left, or start holding:
        `placing`), or whose devices differ from the last snapshot's, made again from the
        snapshot and the running pods on it (a few instances each). Returns the instances
        of the pods that start holding. A pod kept running whose instance now counts
        otherwise (another profile, or none) is beyond the diff: Rebuild."""
        for wl in placing.values():
            self._mig_use(wl, +1)
        touched, self.mig_touched = self.mig_touched, set()
        for node_id in changed:
            i = self.node_index[node_id]
            if self.nodes[i].gpus != snapshot.nodes[i].gpus:
                touched.add(node_id)
        claims: MigClaims = {}
        for node_id in sorted(touched):
            i = self.node_index.get(node_id)
            if i is None:
                continue  # a pod on a node outside the snapshot holds nothing here
            node = snapshot.nodes[i]
            held = self._mig_holders(node_id, placing)
            for gpu in node.gpus:
                if gpu.mig:
                    self._reload_gpu(node, gpu, held, claims)
        return claims

    def _mig_holders(self, node_id: str, placing: dict[str, Workload]) -> list[MigHolder]:
        """The node's running MIG pods in the order a fresh build claims their instances:
        by workload id, then placement; with the slot of each pod kept running."""
        found = []
        for wid in sorted(self.mig_users.get(node_id, ())):
            new = placing.get(wid)
            wl = new or self.running[wid]
            slots = iter(() if new else self.state.slots.get(wid, []))
            for at, placed in enumerate(wl.placement or ()):
                if placed.node_id not in self.node_index or not 0 <= placed.pod < len(wl.pods):
                    continue  # holds nothing, in a fresh build as here
                slot = next(slots, None)
                if placed.node_id == node_id and placed.mig_gpu is not None:
                    found.append((wid, at, placed, slot))
        return found

    def _reload_gpu(self, node: Node, gpu: Gpu, held: list[MigHolder], claims: MigClaims) -> None:
        mine = [h for h in held if h[2].mig_gpu == gpu.index]
        state = self.state.by_id[node.id]
        found = self.state.mig.reload(
            state, gpu, node.mig_repartition, [(wid, placed) for wid, _, placed, _ in mine]
        )
        taken = [id(mig.instance) for mig in found if mig is not None]
        if len(set(taken)) != len(taken):
            raise Rebuild  # two pods name one instance: the fresh build decides who holds it
        for (wid, at, _, slot), mig in zip(mine, found, strict=True):
            if slot is None:
                claims[(wid, at)] = mig
                continue
            units = round(mig.instance.profile.fraction * UNITS) if mig else 0
            if (mig is None) != (slot.mig is None) or units != slot.units:
                raise Rebuild
            slot.mig = mig

    def _drop_foreign(
        self, snapshot: Snapshot, node_id: str, running: set[str]
    ) -> tuple[Holding, ...] | None:
        """Take away a changed node's foreign holdings when the snapshot reports others;
        the new ones (to add once every removal is done), or None when they are equal."""
        now = _foreign(snapshot.nodes[self.node_index[node_id]], running)
        before = self.foreign.get(node_id, ())
        if now == before:
            return None
        gpus = {g.index: g for g in self.state.by_id[node_id].gpus}
        for index, wid, units, memory in before:
            self.state.hold(gpus[index], wid, units, memory, -1)
        return now

    def _add_foreign(self, node_id: str, holdings: tuple[Holding, ...]) -> None:
        gpus = {g.index: g for g in self.state.by_id[node_id].gpus}
        for index, wid, units, memory in holdings:
            if index not in gpus:
                raise Rebuild
            self.state.hold(gpus[index], wid, units, memory, +1)
        self.foreign[node_id] = holdings


def _starts_holding(old: Workload | None, new: Workload | None) -> bool:
    """The new entry runs and holds other than the old one did (or the old did not run)."""
    if new is None or new.placement is None:
        return False
    return old is None or old.placement is None or _holds_differently(old, new)


def _holds_differently(old: Workload, new: Workload | None) -> bool:
    return new is None or any(getattr(old, f) != getattr(new, f) for f in _HOLDING_FIELDS)


def _same_hardware(old: Node, new: Node) -> bool:
    """Equal in everything but who holds the devices (unknown fields included)."""
    if any(getattr(old, f) != getattr(new, f) for f in _NODE_FIELDS):
        return False
    if len(old.gpus) != len(new.gpus):
        return False
    return all(
        getattr(a, f) == getattr(b, f)
        for a, b in zip(old.gpus, new.gpus, strict=True)
        for f in _GPU_FIELDS
    )


def _foreign(node: Node, running: Container[str]) -> tuple[Holding, ...]:
    """The node's device holdings by workloads that are not running in the snapshot."""
    found: list[Holding] = []
    for gpu in node.gpus:
        if gpu.whole_by is not None and gpu.whole_by not in running:
            found.append((gpu.index, gpu.whole_by, 0, 0))
        for share in gpu.shares:
            if share.workload_id not in running:
                units = max(1, round(share.share * UNITS))
                found.append((gpu.index, share.workload_id, units, share.memory_mib))
    return tuple(found)


def _verify(state: ClusterState, node: Node) -> None:
    """The kept node holds what the snapshot's node says; Rebuild otherwise."""
    kept = {g.index: g for g in state.by_id[node.id].gpus}
    for gpu in node.gpus:
        if gpu.mig:
            continue  # made again from the snapshot (EngineState._reload_mig)
        mine = kept[gpu.index]
        if mine.owner != gpu.whole_by:
            raise Rebuild
        theirs = sorted((s.workload_id, max(1, round(s.share * UNITS))) for s in gpu.shares)
        if sorted((wid, units) for wid, units, _ in mine.shares) != theirs:
            raise Rebuild


def _capacity(nodes: Iterable[Node]) -> dict[tuple[str, Resource], float]:
    """Schedulable GPUs, CPU and memory per pool (CPU or memory unstated: unlimited)."""
    capacity: dict[tuple[str, Resource], float] = {}
    for node in nodes:
        if not node.schedulable:
            continue
        cpu = math.inf if node.cpu is None else node.cpu
        memory = math.inf if node.memory_mib is None else float(node.memory_mib)
        for resource, amount in zip(RESOURCES, (len(node.gpus), cpu, memory), strict=True):
            capacity[(node.pool, resource)] = capacity.get((node.pool, resource), 0.0) + amount
    return capacity
