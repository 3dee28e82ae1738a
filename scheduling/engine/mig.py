"""Dynamic MIG: a MIG-enabled GPU is a row of slots that instances are cut from on demand.

A MIG pod asks for a profile ("3g.40gb") or for memory ("auto": the smallest profile of the
device's model that holds `gpu_memory_mib`). Where it may go (scheduling/engine/mig_profiles.py
has the rules): a profile takes `size` memory slices from one of its legal starts, and no two
instances overlap. Choosing, in order:

1. an idle instance of the same profile (an instance outlives its workload, so the next
   workload of that shape reuses it and the node does nothing);
2. free slices: a legal start overlapping no instance, on the fullest device (binpack) or the
   emptiest (spread), at the start that keeps most placements open for later;
3. repartition, only where the node's pool allows it: a legal start whose overlapping
   instances are all idle; those are destroyed, the fewest slices first. An instance that
   holds a workload is never destroyed.

A MIG slice counts in quotas and fair share as the part of the GPU's compute it takes
(slices / 7: a 3g.40gb is 3/7 of a GPU). Indexes keep each choice independent of the
cluster's size: idle instances by profile, and devices by their used-slice mask (256 masks).
"""

from __future__ import annotations

import bisect
import functools
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduling.engine.mig_profiles import COMPUTE_SLICES, FAMILIES, MEMORY_SLICES, PROFILES
from scheduling.engine.types import Gpu, MigInstance, PodPlacement, PodRequest

if TYPE_CHECKING:
    from scheduling.engine.state import NodeState

AUTO = "auto"  # mig_profile of a pod that asks by memory
_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_SLICES = re.compile(r"^([1-7])g\.")


@dataclass(frozen=True, slots=True)
class Profile:
    """A GPU instance profile of one model: compute slices, memory slices it occupies."""

    name: str
    slices: int
    size: int
    memory_mib: int
    starts: tuple[int, ...]

    @property
    def fraction(self) -> float:
        return self.slices / COMPUTE_SLICES

    def mask(self, start: int) -> int:
        return ((1 << self.size) - 1) << start


@functools.cache
def table(canonical: str) -> dict[str, Profile]:
    """The profiles of a model of the data table, smallest first."""
    return {row[0]: Profile(*row) for row in PROFILES.get(canonical, ())}


@functools.cache
def canonical_model(name: str, memory_mib: int = 0) -> str | None:
    """The table's name for a device ("NVIDIA H100 80GB HBM3" -> "H100-80GB"), or None when
    the model has no MIG. The memory class is the one named, else nearest the memory."""
    upper = name.upper()
    for family, classes in FAMILIES.items():
        if family not in upper:
            continue
        named = _GB.search(upper)
        gb = int(named.group(1)) if named else memory_mib / 1024
        return min(classes, key=lambda c: abs(c[0] - gb))[1]
    return None


def profiles_for(model: str, memory_mib: int = 0) -> dict[str, Profile]:
    canonical = canonical_model(model, memory_mib)
    return table(canonical) if canonical else {}


def profile_for(pod: PodRequest, profiles: dict[str, Profile]) -> Profile | None:
    """The profile a MIG pod takes on a device with these profiles."""
    if pod.mig_profile != AUTO:
        return profiles.get(pod.mig_profile)
    fitting = [p for p in profiles.values() if p.memory_mib >= pod.gpu_memory_mib]
    return min(fitting, key=lambda p: (p.slices, p.size, p.memory_mib), default=None)


def known_profile(name: str, memory_mib: int = 0) -> bool:
    """A profile of some model of the table, or "auto" with memory asked."""
    if name == AUTO:
        return memory_mib > 0
    return any(name in table(model) for model in PROFILES)


def pod_fraction(pod: PodRequest) -> float:
    """The GPUs a MIG pod counts against quota before it is placed (slices / 7); once placed
    its instance's profile counts. "auto" counts the smallest profile of any model that holds
    it."""
    return _fraction(pod.mig_profile, pod.gpu_memory_mib)


@functools.cache
def _fraction(name: str, memory_mib: int) -> float:
    found = _SLICES.match(name)
    if found:
        return int(found.group(1)) / COMPUTE_SLICES
    pod = PodRequest(mig_profile=name, gpu_memory_mib=memory_mib)
    fits = [profile_for(pod, table(m)) for m in PROFILES]
    return min((p.fraction for p in fits if p is not None), default=1.0)


@functools.cache
def best_start(canonical: str, used: int, name: str) -> int | None:
    """The legal free start for a profile on a device whose used slices are `used`: the one
    that leaves the most (profile, start) placements open, lowest start on ties."""
    profiles = table(canonical)
    profile = profiles[name]
    best: tuple[int, int] | None = None
    for start in profile.starts:
        if profile.mask(start) & used:
            continue
        after = used | profile.mask(start)
        room = sum(1 for p in profiles.values() for s in p.starts if not p.mask(s) & after)
        if best is None or room > best[0]:
            best = (room, start)
    return None if best is None else best[1]


# A device's idle profiles, used mask and held mask (-1 without idle instances: then
# repartitioning it frees nothing, and _repartition only runs once free slices failed)
Keys = tuple[tuple[str, ...], int, int]


@functools.cache
def best_starts(canonical: str, name: str) -> tuple[int | None, ...]:
    """best_start of the profile for every used mask, by mask (looked up per device
    bucket while choosing)."""
    return tuple(best_start(canonical, used, name) for used in range(1 << MEMORY_SLICES))


_NOWHERE: Keys = ((), -1, -1)  # in no bucket


@dataclass(slots=True, eq=False)
class Instance:
    profile: Profile
    start: int
    holder: str | None = None
    mask: int = field(init=False)  # the memory slices it occupies

    def __post_init__(self) -> None:
        self.mask = self.profile.mask(self.start)


@dataclass(slots=True, eq=False)
class MigGpu:
    """A MIG-enabled device: its instances (by start) and whether idle ones may go."""

    node: NodeState
    index: int
    model: str
    canonical: str
    repartition: bool
    instances: list[Instance] = field(default_factory=list)
    keys: Keys = _NOWHERE  # where the index holds it (MigIndex._move)

    @property
    def profiles(self) -> dict[str, Profile]:
        return table(self.canonical)

    @property
    def used(self) -> int:
        mask = 0
        for inst in self.instances:
            mask |= inst.mask
        return mask

    @property
    def held(self) -> int:
        mask = 0
        for inst in self.instances:
            if inst.holder is not None:
                mask |= inst.mask
        return mask


@dataclass(slots=True, eq=False)
class MigSlot:
    """What a MIG pod holds: its instance, and whether placing it made that instance and
    destroyed idle ones (undone exactly when the placement is)."""

    gpu: MigGpu
    instance: Instance
    created: bool = False
    destroyed: tuple[Instance, ...] = ()


Key = tuple[int, int]  # (node order, device index)
_NONE: dict[Any, Any] = {}  # an index's missing bucket, read only
Group = tuple[str, str]  # (pool, model)


class MigIndex:
    """The MIG devices of a cluster state, indexed by idle profile and by used/held mask."""

    def __init__(self, dirty: dict[int, dict[object, object]] | None = None) -> None:
        self.by_key: dict[Key, MigGpu] = {}
        # Buckets a device entered since the last settle: ClusterState.settle puts them back
        # in node order (a device moved out and back sits at the end; choosing takes the first).
        self.dirty: dict[int, dict[object, object]] = {} if dirty is None else dirty
        # The masks of a group's used or held buckets, emptiest first (by id of the group's
        # buckets): _candidates walks it forward to spread, backward to pack; a mask that
        # appears or goes is put in or taken out (_remask), not the whole list sorted again.
        self._orders: dict[int, list[int]] = {}
        # (profile asked, memory, pool, models accepted) -> the profile each model's table
        # gives it
        self._wanted: dict[tuple[str, int, str, tuple[str, ...]], list[tuple[Group, Profile]]] = {}
        self.tables: dict[Group, str] = {}  # the profile table of each group
        self.pool_models: dict[str, list[str]] = {}
        self.idle: dict[Group, dict[str, dict[Key, MigGpu]]] = {}
        self.used: dict[Group, dict[int, dict[Key, MigGpu]]] = {}
        # Only devices with an idle instance: _repartition runs after free slices failed
        # everywhere, so a device without one could not serve it
        self.held: dict[Group, dict[int, dict[Key, MigGpu]]] = {}

    # -- building -------------------------------------------------------------------

    def add(self, node: NodeState, gpu: Gpu, repartition: bool) -> bool:
        """Take a snapshot device in; False when it is not MIG (or its model has no
        table: it then holds nothing anyone can use, and is left out)."""
        if not gpu.mig:
            return False
        state = _device(node, gpu, repartition)
        if state is None:
            return True
        self.by_key[(node.order, gpu.index)] = state
        self.tables[(node.pool, gpu.model)] = state.canonical
        models = self.pool_models.setdefault(node.pool, [])
        if gpu.model not in models:
            models.append(gpu.model)
            models.sort()
        return True

    def index_all(self) -> None:
        """Index every device once the snapshot's running pods hold their instances, in
        node order (as settle() keeps the buckets)."""
        for gpu in self.by_key.values():
            self._index(gpu, +1)

    def running_slot(self, node: NodeState, placed: PodPlacement, wid: str) -> MigSlot | None:
        """The slot of a running MIG pod while the state is built (before index_all); the
        placement is authoritative (an instance it names but the device lacks is added as
        held by it)."""
        gpu = self.by_key.get((node.order, placed.mig_gpu or 0))
        if gpu is None or placed.mig_gpu is None:
            return None
        return _claim(gpu, placed, wid)

    def reload(
        self, node: NodeState, gpu: Gpu, repartition: bool, holders: list[tuple[str, PodPlacement]]
    ) -> list[MigSlot | None]:
        """A kept device brought to what a fresh build makes of the snapshot's device and the
        running pods placed on it (`holders`: workload id and pod placement, in workload id
        order). Returns each holder's new slot, for the
        caller to check and take (incremental.py)."""
        key = (node.order, gpu.index)
        old = self.by_key.get(key)
        if old is None:
            return [None] * len(holders)
        self._index(old, -1)
        new = _device(node, gpu, repartition)
        assert new is not None  # the same model as the kept device: it has a table
        self.by_key[key] = new
        slots = [_claim(new, placed, wid) for wid, placed in holders]
        self._index(new, +1)
        return slots

    # -- indexes --------------------------------------------------------------------

    def _index(self, gpu: MigGpu, sign: int) -> None:
        """Add (+1) or remove (-1) a device from every bucket it belongs in."""
        if not gpu.node.schedulable:
            return
        if sign > 0:
            self._move(gpu, _NOWHERE, _keys(gpu))
        else:
            self._move(gpu, gpu.keys, _NOWHERE)

    def _move(self, gpu: MigGpu, before: Keys, after: Keys) -> None:
        """Move a device between the buckets whose keys changed (-1: in none); a device
        that stays in a bucket keeps its place there."""
        if before == after:
            return
        gpu.keys = after
        group = (gpu.node.pool, gpu.model)
        key = (gpu.node.order, gpu.index)
        idle_before, used_before, held_before = before
        idle_after, used_after, held_after = after
        if idle_before != idle_after:
            for name in idle_before:
                if name not in idle_after:
                    _bucket(self.idle, group, name, key, gpu, -1, self.dirty)
            for name in idle_after:
                if name not in idle_before:
                    _bucket(self.idle, group, name, key, gpu, +1, self.dirty)
        if used_before != used_after:
            self._remask(self.used, group, key, gpu, used_before, used_after)
        if held_before != held_after and gpu.repartition:
            self._remask(self.held, group, key, gpu, held_before, held_after)

    def _remask(
        self,
        index: dict[Group, dict[int, dict[Key, MigGpu]]],
        group: Group,
        key: Key,
        gpu: MigGpu,
        before: int,
        after: int,
    ) -> None:
        """Move a device from one mask's bucket to another's (-1: in none)."""
        gone = before >= 0 and _bucket(index, group, before, key, gpu, -1, self.dirty)
        made = after >= 0 and _bucket(index, group, after, key, gpu, +1, self.dirty)
        if gone or made:  # a mask went or appeared: the group's mask order follows
            order = self._orders.get(id(index[group]))
            if order is not None:
                if gone:
                    order.remove(before)
                if made:
                    bisect.insort(order, after, key=_RANK.__getitem__)

    def apply(self, wid: str, slot: MigSlot, sign: int) -> None:
        """Give (+1) or take back (-1) a pod's instance. Taking back a running pod's
        instance leaves it idle; taking back one placed in this cycle undoes it whole."""
        gpu, inst = slot.gpu, slot.instance
        instances = gpu.instances
        if sign > 0:
            for gone in slot.destroyed:
                instances.remove(gone)
            if slot.created:
                bisect.insort(instances, inst, key=_START)
            inst.holder = wid
        else:
            inst.holder = None
            if slot.created:
                instances.remove(inst)
            for gone in slot.destroyed:
                bisect.insort(instances, gone, key=_START)
        if gpu.node.schedulable:
            self._move(gpu, gpu.keys, _keys(gpu))

    # -- choosing -------------------------------------------------------------------

    def models_for(self, pool: str, wanted: tuple[str, ...]) -> list[str]:
        return [m for m in self.pool_models.get(pool, []) if not wanted or m in wanted]

    def choose(
        self,
        pod: PodRequest,
        pool: str,
        models: tuple[str, ...],
        allowed: frozenset[int] | None,
        spread: bool,
    ) -> MigSlot | None:
        """Reuse, then free slices, then repartition (module docstring); None if none.
        `models`: the GPU models the workload accepts (any when empty)."""
        asked = (pod.mig_profile, pod.gpu_memory_mib, pool, models)
        wanted = self._wanted.get(asked)
        if wanted is None:
            wanted = self._wanted[asked] = []
            for model in self.models_for(pool, models):
                profile = profile_for(pod, table(self.tables[(pool, model)]))
                if profile is not None:
                    wanted.append(((pool, model), profile))
        for step in (self._reuse, self._free, self._repartition):
            for group, profile in wanted:
                slot = step(pod, profile, group, allowed, spread)
                if slot is not None:
                    return slot
        return None

    def _first(
        self,
        buckets: dict[int, dict[Key, MigGpu]],
        canonical: str,
        profile: Profile,
        allowed: frozenset[int] | None,
        pod: PodRequest,
        spread: bool,
    ) -> tuple[int, MigGpu] | None:
        """The first (start, device) on a device whose mask leaves the profile a legal start:
        fullest mask first (emptiest with spread), then by node order. Whole buckets are
        skipped by mask, so the cost follows the masks present (at most 256), not the
        devices."""
        order = self._orders.get(id(buckets))
        if order is None:
            order = self._orders[id(buckets)] = sorted(buckets, key=_RANK.__getitem__)
        starts = best_starts(canonical, profile.name)
        for mask in order if spread else reversed(order):
            start = starts[mask]
            if start is not None:
                gpu = _first_usable(buckets[mask], allowed, pod)
                if gpu is not None:
                    return start, gpu
        return None

    def _reuse(
        self,
        pod: PodRequest,
        profile: Profile,
        group: Group,
        allowed: frozenset[int] | None,
        spread: bool,
    ) -> MigSlot | None:
        gpu = _first_usable(self.idle.get(group, _NONE).get(profile.name, _NONE), allowed, pod)
        if gpu is None:
            return None
        inst = next(i for i in gpu.instances if i.holder is None and i.profile.name == profile.name)
        return MigSlot(gpu, inst)

    def _free(
        self,
        pod: PodRequest,
        profile: Profile,
        group: Group,
        allowed: frozenset[int] | None,
        spread: bool,
    ) -> MigSlot | None:
        buckets = self.used.setdefault(group, {})  # kept: _first caches its order by its id
        found = self._first(buckets, self.tables[group], profile, allowed, pod, spread)
        if found is None:
            return None
        return MigSlot(found[1], Instance(profile, found[0]), created=True)

    def _repartition(
        self,
        pod: PodRequest,
        profile: Profile,
        group: Group,
        allowed: frozenset[int] | None,
        spread: bool,
    ) -> MigSlot | None:
        """Free slices first failed: the device where the profile fits beside the held
        instances, destroying the fewest idle slices."""
        buckets = self.held.setdefault(group, {})
        found = self._first(buckets, self.tables[group], profile, allowed, pod, spread)
        if found is None:
            return None
        gpu = found[1]
        held = gpu.held
        options = []
        for start in profile.starts:
            mask = profile.mask(start)
            if not mask & held:
                gone = tuple(i for i in gpu.instances if i.mask & mask)
                options.append((sum(i.profile.size for i in gone), start, gone))
        _, start, gone = min(options, key=lambda o: o[:2])
        return MigSlot(gpu, Instance(profile, start), created=True, destroyed=gone)


def _first_usable(
    bucket: dict[Key, MigGpu], allowed: frozenset[int] | None, pod: PodRequest
) -> MigGpu | None:
    """The bucket's first device, in its order, on an allowed node whose host has room for
    the pod (allowed None: any node)."""
    for (order, _), gpu in bucket.items():
        if (allowed is None or order in allowed) and gpu.node.fits_host(pod):
            return gpu
    return None


def _device(node: NodeState, gpu: Gpu, repartition: bool) -> MigGpu | None:
    """A snapshot device's state with its legal instances (None: its model has no table)."""
    canonical = canonical_model(gpu.model, gpu.memory_mib)
    if canonical is None:
        return None
    state = MigGpu(node, gpu.index, gpu.model, canonical, repartition)
    profiles = state.profiles
    for inst in sorted(gpu.mig_instances, key=lambda i: i.start):
        profile = profiles.get(inst.profile)
        if profile is not None and inst.start in profile.starts:
            state.instances.append(Instance(profile, inst.start, inst.workload_id))
    return state


def _claim(gpu: MigGpu, placed: PodPlacement, wid: str) -> MigSlot | None:
    """A running pod takes the instance at its placement's start (one is added when the
    device lacks it and the profile may start there); None when it holds nothing."""
    inst = next((i for i in gpu.instances if i.start == placed.mig_start), None)
    profile = gpu.profiles.get(placed.mig_profile)
    if inst is None and profile is not None and placed.mig_start in profile.starts:
        inst = Instance(profile, placed.mig_start)
        gpu.instances = sorted([*gpu.instances, inst], key=lambda i: i.start)
    if inst is None:
        return None
    inst.holder = wid
    return MigSlot(gpu, inst)


# Masks from the emptiest (fewest slices used) to the fullest, then by value, as one int
# per mask of the placement grid
_RANK = [(mask.bit_count() << MEMORY_SLICES) | mask for mask in range(1 << MEMORY_SLICES)]


_START = operator.attrgetter("start")  # instances are kept by start


def _keys(gpu: MigGpu) -> Keys:
    """The index keys of a device: the profiles it has idle, its used and held slices
    (held: -1 without an idle instance, Keys)."""
    idle: list[str] = []
    used = held = 0
    for inst in gpu.instances:
        mask = inst.mask
        used |= mask
        if inst.holder is None:
            if inst.profile.name not in idle:
                idle.append(inst.profile.name)
        else:
            held |= mask
    return tuple(sorted(idle)), used, (held if idle else -1)


def put_in_order(bucket: dict, key: Any, value: object, dirty: dict[int, dict]) -> None:  # type: ignore[type-arg]
    """Put an entry in an index bucket kept in node order; the bucket goes to `dirty`
    (put back in order by ClusterState.settle) only when the key does not come after its
    last one: a bucket outside `dirty` is in order, and appending in order keeps it so."""
    if bucket and next(reversed(bucket)) >= key:
        dirty[id(bucket)] = bucket
    bucket[key] = value


def _bucket(
    index: dict[Group, dict],  # type: ignore[type-arg]  # keyed by profile name or mask
    group: Group,
    key: object,
    dev: Key,
    gpu: MigGpu,
    sign: int,
    dirty: dict[int, dict[object, object]],
) -> bool:
    """Put a device in (+1) or take it out of (-1) a bucket; True when that made or
    emptied the bucket (the group's keys changed)."""
    buckets = index.get(group)
    if buckets is None:
        buckets = index[group] = {}
    if sign > 0:
        made = key not in buckets
        put_in_order(buckets.setdefault(key, {}), dev, gpu, dirty)
        return made
    bucket = buckets[key]
    bucket.pop(dev, None)
    if not bucket:
        del buckets[key]
        return True
    return False


def mig_reason(index: MigIndex, pod: PodRequest, pool: str, wanted: tuple[str, ...]) -> str:
    """Why a MIG pod fits nowhere in a pool, in a researcher's words."""
    models = index.models_for(pool, wanted)
    asked = pod.mig_profile if pod.mig_profile != AUTO else f"{pod.gpu_memory_mib} MiB of MIG"
    if not models:
        return f"pool {pool} has no MIG-enabled GPU" + (
            f" of {' or '.join(wanted)}" if wanted else ""
        )
    tables = [table(index.tables[(pool, m)]) for m in models]
    if all(profile_for(pod, t) is None for t in tables):
        return f"no MIG-enabled GPU in pool {pool} offers {asked} ({', '.join(models)})"
    return (
        f"needs a {asked} MIG instance in pool {pool}; no MIG-enabled GPU has room for it"
        " beside the instances in use"
    )


def next_instances(
    gpu: Gpu, placed: list[tuple[str, PodPlacement]], known: set[str]
) -> tuple[MigInstance, ...]:
    """A device's instances after a cycle (for the simulator and bench): the instances of
    the pods placed on it, and the others kept idle unless a new one overlaps them."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    new = []
    mask = 0
    for wid, p in placed:
        profile = profiles.get(p.mig_profile)
        if profile is not None:
            new.append(MigInstance(p.mig_profile, p.mig_start, wid))
            mask |= profile.mask(p.mig_start)
    kept = []
    for inst in gpu.mig_instances:
        profile = profiles.get(inst.profile)
        if profile is None or profile.mask(inst.start) & mask:
            continue
        holder = inst.workload_id if inst.workload_id not in known else None
        kept.append(MigInstance(inst.profile, inst.start, holder))
    return tuple(sorted([*kept, *new], key=lambda i: i.start))


def all_legal(model: str) -> Iterator[tuple[str, int]]:
    """Every (profile, start) a model allows; for tests and pages."""
    for profile in profiles_for(model).values():
        for start in profile.starts:
            yield profile.name, start
