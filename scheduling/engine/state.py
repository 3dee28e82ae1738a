"""The mutable view of a snapshot one cycle works on, with indexes of free capacity.

Built once per cycle in time linear in nodes, GPUs and running pods. Every change goes
through ClusterState methods that append their inverse to an undo log, so a Statement
can roll a tentative gang placement or eviction plan back without copying the cluster.

Shares of a GPU are counted in integer units (UNITS per device) so that fractions add
up exactly and no float rounding can over-commit a device. A node's free host CPU and
memory at the start of a cycle are its allocatable amount less the exact sum of what its
pods hold (`fixed`), rounded once: the same figure whatever order the pods arrived in,
so a state kept between cycles (incremental.py) equals one rebuilt from the snapshot.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from scheduling.engine.mig import MigIndex, MigSlot, put_in_order
from scheduling.engine.types import Node, PodPlacement, PodRequest, Snapshot, Workload

UNITS = 1000  # share units per GPU


class Scratch(functools.partial):  # type: ignore[type-arg]
    """An undo log entry for what lives one cycle only (the ledger's sums, the
    statement's decisions): a discarded Statement runs it; the rollback at the end of
    a kept state's cycle (undo_all) skips it, as those objects are dropped then.
    (A partial without arguments: made and called without a Python-level frame, as
    every admission makes one.)"""

    __slots__ = ()


FIXED = 1 << 1074  # every finite float is an integer multiple of 1 / FIXED


def fixed(x: float) -> int:
    """x exactly, as an integer count of 1 / FIXED (sums of these never round)."""
    n, d = x.as_integer_ratio()
    return n * (FIXED // d)


def unfixed(total: int) -> float:
    """The float nearest to total / FIXED (int division rounds correctly)."""
    return total / FIXED


def free_of(total: float, used: int) -> float:
    """What is left of an allocatable amount (inf = not limited) with `used` held."""
    return total if math.isinf(total) else unfixed(fixed(total) - used)


def share_units(pod: PodRequest, gpu_memory_mib: int) -> int:
    """Units of one device a fractional pod needs on a device with this much memory."""
    if pod.gpu_memory_mib > 0:
        return max(1, math.ceil(pod.gpu_memory_mib * UNITS / max(gpu_memory_mib, 1)))
    return max(1, min(UNITS, round(pod.gpu_fraction * UNITS)))


def share_memory(pod: PodRequest, gpu_memory_mib: int) -> int:
    """MiB of device memory a fractional pod holds on a device with this much memory."""
    if pod.gpu_memory_mib > 0:
        return pod.gpu_memory_mib
    return int(pod.gpu_fraction * gpu_memory_mib)


@dataclass(slots=True, eq=False)
class GpuState:
    """One device: free, held whole by `owner`, or shared by `shares` (wid, units, MiB)."""

    node: NodeState
    index: int
    model: str
    memory_mib: int
    owner: str | None = None
    used_units: int = 0
    shares: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def is_free(self) -> bool:
        return self.owner is None and not self.shares


@dataclass(slots=True, eq=False)
class NodeState:
    """One node: its GPUs, free host CPU and memory, and free whole GPUs per model."""

    order: int
    id: str
    pool: str
    topology: dict[str, str]
    schedulable: bool
    cpu_free: float
    mem_free: float
    gpus: list[GpuState] = field(default_factory=list)
    free_by_model: dict[str, int] = field(default_factory=dict)
    cpu_used: int = 0  # fixed(): exact CPU and memory held by the snapshot's pods
    mem_used: int = 0

    def settle(self, cpu: float, memory: float) -> None:
        """Free CPU and memory from the allocatable amounts and the exact sums held."""
        self.cpu_free = free_of(cpu, self.cpu_used)
        self.mem_free = free_of(memory, self.mem_used)

    def fits_host(self, pod: PodRequest) -> bool:
        return pod.cpu <= self.cpu_free + 1e-9 and pod.memory_mib <= self.mem_free


@dataclass(slots=True, eq=False)
class PodSlot:
    """What one placed pod holds, so that evicting its workload frees exactly that."""

    pod: int
    node: NodeState
    gpus: tuple[GpuState, ...] = ()
    shared: GpuState | None = None
    units: int = 0
    memory: int = 0
    cpu: float = 0.0
    host_memory: float = 0.0
    mig: MigSlot | None = None  # a MIG instance (units then hold its slices as a share)


Group = tuple[str, str]  # (pool, GPU model)


def _owner_setter(gpu: GpuState, owner: str | None) -> Callable[[], None]:
    def set_owner() -> None:
        gpu.owner = owner

    return set_owner


class ClusterState:
    """Nodes, GPUs, who holds what, and indexes of free capacity; undoable mutations.

    Indexes (all insertion-ordered dicts, so iteration follows the sequence of
    operations and never hash order):
    - whole[(pool, model)][k]: schedulable nodes with exactly k free devices of model;
    - shared[(pool, model)][u]: shared devices with u free units (0 < u < UNITS);
    - domain_free[(pool, level, domain)]: free whole devices in a topology domain.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes: list[NodeState] = []
        self.by_id: dict[str, NodeState] = {}
        self.whole: dict[Group, dict[int, dict[int, NodeState]]] = {}
        self.shared: dict[Group, dict[int, dict[tuple[int, int], GpuState]]] = {}
        self.group_memory: dict[Group, int] = {}
        self.max_per_node: dict[Group, int] = {}
        self.domain_free: dict[tuple[str, str, str], int] = {}
        self.domain_nodes: dict[tuple[str, str, str], list[NodeState]] = {}
        self.pool_models: dict[str, list[str]] = {}
        self.slots: dict[str, list[PodSlot]] = {}
        self.log: list[Callable[[], None]] = []
        # Changed since the last settle(): nodes whose free CPU and memory float sums
        # drifted, and index buckets whose order may no longer be by node (see settle).
        self.touched: dict[int, NodeState] = {}
        self.dirty: dict[int, dict[object, object]] = {}
        self.mig = MigIndex(self.dirty)
        self.totals: dict[str, tuple[float, float]] = {}  # node id -> allocatable cpu, memory
        self._load_nodes(snapshot.nodes)
        self._load_running(snapshot.workloads)
        self.mig.index_all()
        for node in self.nodes:
            node.settle(*self.totals[node.id])
        self._build_indexes()
        self.dirty.clear()  # built in node order

    # -- building -------------------------------------------------------------------

    def _load_nodes(self, nodes: tuple[Node, ...]) -> None:
        for order, node in enumerate(sorted(nodes, key=lambda n: n.id)):
            state = NodeState(
                order=order,
                id=node.id,
                pool=node.pool,
                topology=dict(node.topology),
                schedulable=node.schedulable,
                cpu_free=math.inf if node.cpu is None else node.cpu,
                mem_free=math.inf if node.memory_mib is None else node.memory_mib,
            )
            for gpu in sorted(node.gpus, key=lambda g: g.index):
                if self.mig.add(state, gpu, node.mig_repartition):
                    continue
                g = GpuState(state, gpu.index, gpu.model, gpu.memory_mib, gpu.whole_by)
                for share in gpu.shares:
                    units = max(1, round(share.share * UNITS))
                    g.shares.append((share.workload_id, units, share.memory_mib))
                    g.used_units += units
                state.gpus.append(g)
            self.nodes.append(state)
            self.by_id[node.id] = state
            self.totals[node.id] = (state.cpu_free, state.mem_free)

    def _load_running(self, workloads: tuple[Workload, ...]) -> None:
        # By id, so that sums of shares come out bit-identical whatever the input order.
        for wl in sorted(workloads, key=lambda w: w.id):
            if wl.placement is None:
                continue
            slots = []
            for placed in wl.placement:
                node = self.by_id.get(placed.node_id)
                if node is None or not 0 <= placed.pod < len(wl.pods):
                    continue  # a pod on a node outside the snapshot holds nothing here
                slot = self._slot_for(wl, placed.pod, node, placed)
                if placed.mig_gpu is not None:
                    self._hold_mig(slot, self.mig.running_slot(node, placed, wl.id))
                node.cpu_used += fixed(slot.cpu)
                node.mem_used += fixed(slot.host_memory)
                slots.append(slot)
            self.slots[wl.id] = slots

    @staticmethod
    def _hold_mig(slot: PodSlot, mig: MigSlot | None) -> None:
        """A running pod's MIG instance; it counts as its slices / 7 of a GPU."""
        slot.mig = mig
        slot.units = round(mig.instance.profile.fraction * UNITS) if mig else 0

    @staticmethod
    def _slot_for(wl: Workload, pod_index: int, node: NodeState, placed: PodPlacement) -> PodSlot:
        """The slot of a running pod. The placement is authoritative: a device it names
        but that does not record the workload is marked as held by it."""
        pod = wl.pods[pod_index]
        by_index = {g.index: g for g in node.gpus}
        gpus = tuple(by_index[i] for i in placed.gpus if i in by_index)
        for gpu in gpus:
            gpu.owner = wl.id
        shared = by_index.get(placed.shared_gpu) if placed.shared_gpu is not None else None
        units, memory = 0, placed.gpu_memory_mib
        if shared is not None:
            mine = [s for s in shared.shares if s[0] == wl.id]
            if mine:
                _, units, memory = mine[0]
            else:
                units = max(1, round(placed.share * UNITS))
                shared.shares.append((wl.id, units, memory))
                shared.used_units += units
        return PodSlot(
            pod=pod_index,
            node=node,
            gpus=gpus,
            shared=shared,
            units=units,
            memory=memory,
            cpu=pod.cpu,
            host_memory=pod.memory_mib,
        )

    def _build_indexes(self) -> None:
        for node in self.nodes:
            models = sorted({g.model for g in node.gpus})
            for model in models:
                group = (node.pool, model)
                self.pool_models.setdefault(node.pool, [])
                if model not in self.pool_models[node.pool]:
                    self.pool_models[node.pool].append(model)
                count = sum(1 for g in node.gpus if g.model == model)
                self.max_per_node[group] = max(self.max_per_node.get(group, 0), count)
                memory = min(g.memory_mib for g in node.gpus if g.model == model)
                self.group_memory[group] = min(self.group_memory.get(group, memory), memory)
                node.free_by_model[model] = 0
            for level, domain in sorted(node.topology.items()):
                key = (node.pool, level, domain)
                self.domain_nodes.setdefault(key, []).append(node)
                self.domain_free.setdefault(key, 0)
            for gpu in node.gpus:
                self._index_gpu(gpu, +1)
            if node.schedulable:
                for model, free in node.free_by_model.items():
                    self.whole.setdefault((node.pool, model), {}).setdefault(free, {})
                    self.whole[(node.pool, model)][free][node.order] = node
        for models in self.pool_models.values():
            models.sort()

    # -- index maintenance ----------------------------------------------------------

    def _index_gpu(self, gpu: GpuState, sign: int) -> None:
        """Add (+1) or remove (-1) a device's contribution to the free indexes."""
        node = gpu.node
        if gpu.is_free:
            node.free_by_model[gpu.model] += sign
            if node.schedulable:
                for level, domain in node.topology.items():
                    self.domain_free[(node.pool, level, domain)] += sign
        elif gpu.owner is None and gpu.used_units < UNITS and node.schedulable:
            group = (node.pool, gpu.model)
            buckets = self.shared.setdefault(group, {})
            free = UNITS - gpu.used_units
            if sign > 0:
                put_in_order(buckets.setdefault(free, {}), (node.order, gpu.index), gpu, self.dirty)
            else:
                bucket = buckets[free]
                del bucket[(node.order, gpu.index)]
                if not bucket:
                    del buckets[free]

    def _move_node(self, node: NodeState, model: str, before: int) -> None:
        after = node.free_by_model[model]
        if before == after or not node.schedulable:
            return
        buckets = self.whole[(node.pool, model)]
        del buckets[before][node.order]
        put_in_order(buckets.setdefault(after, {}), node.order, node, self.dirty)

    def _change_gpu(self, gpu: GpuState, mutate: Callable[[], None]) -> None:
        before = gpu.node.free_by_model[gpu.model]
        self._index_gpu(gpu, -1)
        mutate()
        self._index_gpu(gpu, +1)
        self._move_node(gpu.node, gpu.model, before)

    # -- undoable mutations ---------------------------------------------------------

    def add_slot(self, wid: str, slot: PodSlot) -> None:
        """Give a pod its devices, share and host resources; logged for undo."""
        self._apply_slot(wid, slot, +1)
        self.slots.setdefault(wid, []).append(slot)

        def undo() -> None:
            self.slots[wid].pop()
            if not self.slots[wid]:
                del self.slots[wid]
            self._apply_slot(wid, slot, -1)

        self.log.append(undo)

    def remove_slot(self, wid: str, slot: PodSlot) -> None:
        """Free one pod of a workload (an elastic workload shrinking); logged for undo."""
        held = self.slots[wid]
        at = held.index(slot)
        del held[at]
        self._apply_slot(wid, slot, -1)

        def undo() -> None:
            self._apply_slot(wid, slot, +1)
            self.slots[wid].insert(at, slot)

        self.log.append(undo)

    def release(self, wid: str) -> list[PodSlot]:
        """Free everything a workload holds; logged for undo. Returns what it held."""
        slots = self.slots.pop(wid, [])
        for slot in reversed(slots):
            self._apply_slot(wid, slot, -1)

        def undo() -> None:
            for slot in slots:
                self._apply_slot(wid, slot, +1)
            self.slots[wid] = slots

        self.log.append(undo)
        return slots

    def _apply_slot(self, wid: str, slot: PodSlot, sign: int) -> None:
        node = slot.node
        self.touched[node.order] = node
        node.cpu_free -= sign * slot.cpu
        node.mem_free -= sign * slot.host_memory
        owner = wid if sign > 0 else None
        for gpu in slot.gpus:
            self._change_gpu(gpu, _owner_setter(gpu, owner))
        if slot.shared is not None:
            self._change_gpu(slot.shared, lambda: self._change_share(wid, slot, sign))
        if slot.mig is not None:
            self.mig.apply(wid, slot.mig, sign)

    @staticmethod
    def _change_share(wid: str, slot: PodSlot, sign: int) -> None:
        gpu = slot.shared
        assert gpu is not None
        gpu.used_units += sign * slot.units
        if sign > 0:
            gpu.shares.append((wid, slot.units, slot.memory))
        else:
            gpu.shares.remove((wid, slot.units, slot.memory))

    def mark(self) -> int:
        return len(self.log)

    def rollback(self, mark: int) -> None:
        while len(self.log) > mark:
            self.log.pop()()

    def undo_all(self) -> None:
        """Roll the whole log back, skipping what undoes a cycle's own bookkeeping
        (Scratch): that goes with the cycle."""
        log = self.log
        while log:
            undo = log.pop()
            if type(undo) is not Scratch:
                undo()

    def settle(self) -> None:
        """Bring what changed since the last settle to the form a fresh build has: free
        CPU and memory from the exact sums (float subtractions undone in another order
        leave other last bits), and each index bucket in node order (a node moved out
        and back sits at the end of its bucket, and placement takes the first that fits).
        Costs what changed."""
        for node in self.touched.values():
            node.settle(*self.totals[node.id])
        self.touched.clear()
        for bucket in self.dirty.values():
            keys = list(bucket)
            if any(a > b for a, b in itertools.pairwise(keys)):  # type: ignore[operator]
                items = sorted(bucket.items())  # type: ignore[type-var]
                bucket.clear()
                bucket.update(items)
        self.dirty.clear()

    # -- holdings kept between cycles (incremental.py) ------------------------------

    def running_add(
        self, wl: Workload, mig: Mapping[tuple[str, int], MigSlot | None]
    ) -> list[PodSlot]:
        """Give a running workload of a later snapshot what its placement holds, as a
        fresh build would; not logged (the state moves on to the new snapshot). `mig`: the
        instance each MIG pod holds, by (workload id, position in its placement), as the
        device made again from the snapshot gave it (MigIndex.reload)."""
        slots = []
        for at, placed in enumerate(wl.placement or ()):
            node = self.by_id.get(placed.node_id)
            if node is None or not 0 <= placed.pod < len(wl.pods):
                continue
            by_index = {g.index: g for g in node.gpus}
            gpus = tuple(by_index[i] for i in placed.gpus if i in by_index)
            shared = by_index.get(placed.shared_gpu) if placed.shared_gpu is not None else None
            units = max(1, round(placed.share * UNITS)) if shared is not None else 0
            pod = wl.pods[placed.pod]
            slot = PodSlot(
                placed.pod,
                node,
                gpus,
                shared,
                units,
                placed.gpu_memory_mib,
                pod.cpu,
                pod.memory_mib,
            )
            if placed.mig_gpu is not None:
                self._hold_mig(slot, mig.get((wl.id, at)))
            self._apply_slot(wl.id, slot, +1)
            node.cpu_used += fixed(slot.cpu)
            node.mem_used += fixed(slot.host_memory)
            slots.append(slot)
        self.slots[wl.id] = slots
        return slots

    def running_remove(self, wid: str) -> list[PodSlot]:
        """Free what a workload that left the running set held; not logged."""
        slots = self.slots.pop(wid, [])
        for slot in reversed(slots):
            self._apply_slot(wid, slot, -1)
            slot.node.cpu_used -= fixed(slot.cpu)
            slot.node.mem_used -= fixed(slot.host_memory)
        return slots

    def hold(self, gpu: GpuState, wid: str, units: int, memory: int, sign: int) -> None:
        """Add (+1) or take away (-1) a holding by a workload the engine does not manage
        (units 0: the whole device); not logged."""
        self.touched[gpu.node.order] = gpu.node
        if units == 0:
            self._change_gpu(gpu, _owner_setter(gpu, wid if sign > 0 else None))
            return
        slot = PodSlot(0, gpu.node, shared=gpu, units=units, memory=memory)
        self._change_gpu(gpu, lambda: self._change_share(wid, slot, sign))

    # -- queries --------------------------------------------------------------------

    def models_for(self, pool: str, wanted: tuple[str, ...]) -> list[str]:
        models = self.pool_models.get(pool, [])
        return [m for m in models if not wanted or m in wanted]

    def free_whole(self, pool: str, models: list[str]) -> int:
        total = 0
        for model in models:
            for k, bucket in self.whole.get((pool, model), {}).items():
                total += k * len(bucket)
        return total

    def largest_block(self, pool: str, models: list[str]) -> int:
        best = 0
        for model in models:
            for k, bucket in self.whole.get((pool, model), {}).items():
                if bucket and k > best:
                    best = k
        return best

    def nodes_with_free(
        self, group: Group, need: int, descending: bool
    ) -> Iterator[tuple[int, NodeState]]:
        """Nodes with at least `need` free devices of the group, fullest first (binpack)."""
        buckets = self.whole.get(group)
        if not buckets:
            return
        for k in sorted((k for k in buckets if k >= need), reverse=descending):
            for node in list(buckets[k].values()):
                yield k, node
