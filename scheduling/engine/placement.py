"""Fitting a workload's pods onto nodes and GPUs of one pool, and saying why not.

Whole-GPU pods take free devices of one model on one node: bin packing picks the node
with the fewest free devices that still fit (filling partly used nodes), spread the one
with the most. Fractional pods go onto already shared devices first, choosing the one
whose leftover stays most useful for the fraction sizes waiting (fragmentation-aware,
after "fragmentation gradient descent", ATC'23), and only then open a free device.
Whole and shared use never mix on one device.

Given a histogram of typical pod shapes (fragmentation.ShapeHistogram; the cycle's default),
bin packing is fragmentation gradient descent instead: every pod (whole, fractional or
host-only) goes to the node and device where the expected GPU capacity the typical pod
cannot use grows least, ties broken as plain bin packing would (fill shared devices before
opening one, fewest free first, node order). Only a bounded set of candidate nodes is
scored (the first few where the pod fits from each free-capacity bucket), so a placement
costs about the same on 100 nodes or 10,000. Pods of two or more whole GPUs (gang and
training pods, whose fit is their devices), pods held to a topology domain and pools that
spread keep plain bin packing; so does a pod that fits none of the candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.engine.fragmentation import NodeKey, ShapeHistogram, after_key, node_key
from scheduling.engine.state import (
    UNITS,
    ClusterState,
    GpuState,
    Group,
    NodeState,
    PodSlot,
    share_memory,
    share_units,
)
from scheduling.engine.types import PlacementStrategy, PodRequest, TopologyMode, Workload


def fill_table(sizes: Iterable[int]) -> list[int]:
    """fill[v]: the most of v free units that pods of the waiting sizes could use."""
    sizes = sorted(set(sizes))
    fill = [0] * (UNITS + 1)
    for v in range(1, UNITS + 1):
        best = fill[v - 1]
        for s in sizes:
            if s > v:
                break
            best = max(best, fill[v - s] + s)
        fill[v] = best
    return fill


@dataclass(frozen=True, slots=True)
class ShapeKey:
    """Workloads with the same key fit or fail alike on the same free capacity."""

    pods: tuple[PodRequest, ...]
    count: int  # pods holds one pod repeated `count` times, or all pods with count 0
    gang_min: int
    models: tuple[str, ...]
    topology: object

    @staticmethod
    def of(wl: Workload) -> ShapeKey:
        pods = wl.pods
        # A gang is usually one pod repeated: hash it once instead of once per pod.
        if pods and all(pod is pods[0] for pod in pods):
            return ShapeKey(pods[:1], len(pods), wl.gang_min, wl.gpu_models, wl.topology)
        return ShapeKey(pods, 0, wl.gang_min, wl.gpu_models, wl.topology)


@dataclass(slots=True, eq=False)
class Scope:
    """The nodes of one topology domain, with its key in the free-capacity index."""

    key: tuple[str, str, str]
    nodes: list[NodeState]
    orders: frozenset[int]


class Placer:
    """Places workloads into a ClusterState (undoably) and explains failures."""

    def __init__(
        self,
        state: ClusterState,
        strategies: dict[str, PlacementStrategy],
        waiting_sizes: dict[Group, set[int]],
        shapes: ShapeHistogram | None = None,
        candidates: int = 2,
    ) -> None:
        self.state = state
        self.shapes = shapes
        self.candidates = max(1, candidates)
        self._gpuless: dict[str, list[NodeState]] = {}
        self.strategies = strategies
        self.waiting_sizes = waiting_sizes
        self._fill: dict[Group, list[int]] = {}
        self._scopes: dict[tuple[str, str, str], Scope] = {}

    def scope(self, key: tuple[str, str, str]) -> Scope:
        if key not in self._scopes:
            nodes = self.state.domain_nodes[key]
            self._scopes[key] = Scope(key, nodes, frozenset(n.order for n in nodes))
        return self._scopes[key]

    # -- workloads ------------------------------------------------------------------

    def cannot_fit(self, wl: Workload, pool: str) -> bool:
        """A quick test on the free-capacity indexes: True when the pool surely lacks the
        devices, so the full placement need not be tried."""
        if wl.pods and wl.pods[0].mig_profile and all(_mig_only(p) for p in wl.pods):
            return False  # no free-device index speaks for MIG pods: mig.choose() decides
        models = self.state.models_for(pool, wl.gpu_models)
        if not models:
            return any(p.gpus > 0 or p.is_shared for p in wl.pods)
        pods = _gang_pods(wl)
        whole = [p.gpus for p in pods if p.gpus > 0]
        if whole:
            if max(whole) > self.state.largest_block(pool, models):
                return True
            if sum(whole) > self.state.free_whole(pool, models):
                return True
        shared = [p for p in pods if p.is_shared]
        if shared and self.state.free_whole(pool, models) == 0:
            least = min(
                share_units(p, self.state.group_memory[(pool, m)]) for p in shared for m in models
            )
            return least > self._roomiest_share(pool, models)
        return False

    def _roomiest_share(self, pool: str, models: list[str]) -> int:
        return max(
            (free for m in models for free, b in self.state.shared.get((pool, m), {}).items() if b),
            default=0,
        )

    def place(self, wl: Workload, pool: str) -> list[PodSlot] | None:
        """Place the workload's pods in `pool`: at least gang_min of them or none.

        Returns the slots (already applied to the state) or None with the state as it was.
        """
        pods = wl.pods
        if len(pods) == wl.gang_min == 1 and wl.topology is None and _mig_only(pods[0]):
            # One MIG pod (most MIG work): what _place_pods would do, without its walk
            pod = pods[0]
            slot = self._mig_slot(0, pod, pool, None, wl.gpu_models)
            if slot is None:
                return None
            self.state.add_slot(wl.id, slot)
            return [slot]
        models = self.state.models_for(pool, wl.gpu_models)
        needs_gpu = any(p.gpus > 0 or p.is_shared for p in wl.pods)
        if needs_gpu and not models:
            return None
        mark = self.state.mark()
        topo = wl.topology
        if topo is None:
            slots = self._place_pods(wl, pool, models, [None])
        elif topo.mode is TopologyMode.REQUIRED:
            slots = self._place_in_one_domain(wl, pool, models, topo.level)
        else:
            domains = self._domains(pool, topo.level, descending=True)
            slots = self._place_pods(wl, pool, models, [*domains, None])
        if slots is None:
            self.state.rollback(mark)
        return slots

    def _domains(self, pool: str, level: str, descending: bool) -> list[Scope]:
        keys = [k for k in self.state.domain_nodes if k[0] == pool and k[1] == level]
        keys.sort(
            key=lambda k: (
                -self.state.domain_free[k] if descending else self.state.domain_free[k],
                k[2],
            )
        )
        return [self.scope(k) for k in keys]

    def _place_in_one_domain(
        self, wl: Workload, pool: str, models: list[str], level: str
    ) -> list[PodSlot] | None:
        need = sum(p.gpus for p in _gang_pods(wl))
        # An elastic workload admitted at its minimum grows only inside this domain: one
        # with room for its maximum goes first (best fit among those, then the rest).
        room = need + max(wl.grows_to - len(wl.pods), 0) * (wl.pods[-1].gpus if wl.pods else 0)
        free = self.state.domain_free
        for key in sorted(
            (k for k in self.state.domain_nodes if k[0] == pool and k[1] == level),
            key=lambda k: (free[k] < room, free[k], k[2]),
        ):
            if self.state.domain_free[key] < need:
                continue
            mark = self.state.mark()
            slots = self._place_pods(wl, pool, models, [self.scope(key)])
            if slots is not None:
                return slots
            self.state.rollback(mark)
        return None

    def _place_pods(
        self,
        wl: Workload,
        pool: str,
        models: list[str],
        scopes: list[Scope | None],
    ) -> list[PodSlot] | None:
        """Place pods largest first, each in the first scope (a topology domain, None =
        the whole pool) where it fits; fail when fewer than gang_min pods fit."""
        order = sorted(range(len(wl.pods)), key=lambda i: _pod_size_key(wl.pods[i], i))
        slots: list[PodSlot] = []
        missing = 0
        for index in order:
            slot = None
            pod = wl.pods[index]
            for scope in scopes:
                if scope is not None and pod.gpus > self.state.domain_free[scope.key]:
                    continue  # cannot fit whole devices there: skip the node scan
                slot = self.place_pod(wl.id, index, pod, pool, models, scope, wl.gpu_models)
                if slot is not None:
                    break
            if slot is None:
                missing += 1
                if len(wl.pods) - missing < wl.gang_min:
                    return None
                continue
            slots.append(slot)
        return slots if slots and len(slots) >= wl.gang_min else None

    # -- pods -----------------------------------------------------------------------

    def place_pod(
        self,
        wid: str,
        index: int,
        pod: PodRequest,
        pool: str,
        models: list[str],
        scope: Scope | None,
        wanted: tuple[str, ...] = (),
    ) -> PodSlot | None:
        """Place one pod and apply it to the state; None when it fits nowhere. MIG pods go
        to the MIG devices of the `wanted` models (any when empty)."""
        if pod.mig_profile:
            slot = self._mig_slot(index, pod, pool, scope, wanted)
        elif self.shapes is not None and scope is None and pod.gpus <= 1 and not self._spread(pool):
            slot = self._least_fragmenting_slot(index, pod, pool, models, self.shapes)
        else:
            slot = self._best_fit_slot(index, pod, pool, models, scope)
        if slot is not None:
            self.state.add_slot(wid, slot)
        return slot

    def _best_fit_slot(
        self, index: int, pod: PodRequest, pool: str, models: list[str], scope: Scope | None
    ) -> PodSlot | None:
        if pod.is_shared:
            return self._fraction_slot(index, pod, pool, models, scope)
        if pod.gpus > 0:
            return self._whole_slot(index, pod, pool, models, scope)
        return self._host_slot(index, pod, pool, scope)

    def _mig_slot(
        self, index: int, pod: PodRequest, pool: str, scope: Scope | None, wanted: tuple[str, ...]
    ) -> PodSlot | None:
        """A MIG instance (scheduling/engine/mig.py); it counts as slices / 7 of a GPU."""
        allowed = None if scope is None else scope.orders
        found = self.state.mig.choose(pod, pool, wanted, allowed, self._spread(pool))
        if found is None:
            return None
        units = round(found.instance.profile.fraction * UNITS)
        node = found.gpu.node
        return PodSlot(index, node, units=units, cpu=pod.cpu, host_memory=pod.memory_mib, mig=found)

    def _spread(self, pool: str) -> bool:
        return self.strategies.get(pool) is PlacementStrategy.SPREAD

    def _whole_slot(
        self,
        index: int,
        pod: PodRequest,
        pool: str,
        models: list[str],
        scope: Scope | None,
    ) -> PodSlot | None:
        found = self._node_with_free(pod, pool, models, pod.gpus, scope)
        if found is None:
            return None
        node, model = found
        gpus = tuple(g for g in node.gpus if g.model == model and g.is_free)[: pod.gpus]
        return PodSlot(index, node, gpus=gpus, cpu=pod.cpu, host_memory=pod.memory_mib)

    def _node_with_free(
        self,
        pod: PodRequest,
        pool: str,
        models: list[str],
        need: int,
        scope: Scope | None,
    ) -> tuple[NodeState, str] | None:
        """The node to take `need` free devices from: fewest free first, or most when the
        pool spreads; ties by node order."""
        spread = self._spread(pool)
        if scope is not None:
            best = None
            for node in scope.nodes:
                if not node.schedulable or not node.fits_host(pod):
                    continue
                for model in models:
                    free = node.free_by_model.get(model, 0)
                    if free >= need:
                        key = (-free if spread else free, node.order, model)
                        if best is None or key < best[0]:
                            best = (key, node, model)
            return None if best is None else (best[1], best[2])
        sizes: set[int] = set()
        for model in models:
            sizes.update(k for k in self.state.whole.get((pool, model), {}) if k >= need)
        for k in sorted(sizes, reverse=spread):
            for model in models:
                bucket = self.state.whole.get((pool, model), {}).get(k)
                for node in bucket.values() if bucket else ():
                    if node.fits_host(pod):
                        return node, model
        return None

    def _host_slot(
        self, index: int, pod: PodRequest, pool: str, scope: Scope | None
    ) -> PodSlot | None:
        nodes = scope.nodes if scope is not None else self.state.nodes
        for node in nodes:
            if node.pool == pool and node.schedulable and node.fits_host(pod):
                return PodSlot(index, node, cpu=pod.cpu, host_memory=pod.memory_mib)
        return None

    def _fraction_slot(
        self,
        index: int,
        pod: PodRequest,
        pool: str,
        models: list[str],
        scope: Scope | None,
    ) -> PodSlot | None:
        gpu = self._shared_gpu(pod, pool, models, scope)
        if gpu is None:
            found = self._node_with_free(pod, pool, models, 1, scope)
            if found is None:
                return None
            node, model = found
            gpu = next(g for g in node.gpus if g.model == model and g.is_free)
        units = share_units(pod, gpu.memory_mib)
        return PodSlot(
            index,
            gpu.node,
            shared=gpu,
            units=units,
            memory=share_memory(pod, gpu.memory_mib),
            cpu=pod.cpu,
            host_memory=pod.memory_mib,
        )

    def _shared_gpu(
        self, pod: PodRequest, pool: str, models: list[str], scope: Scope | None
    ) -> GpuState | None:
        """The shared device whose leftover wastes least for the waiting fraction sizes."""
        allowed = None if scope is None else scope.orders
        spread = self._spread(pool)
        candidates = []
        for model in models:
            group = (pool, model)
            units = share_units(pod, self.state.group_memory[group])
            fill = self._fill_for(group)
            for free, bucket in self.state.shared.get(group, {}).items():
                if free >= units and bucket:
                    left = free - units
                    gradient = (left - fill[left]) - (free - fill[free])
                    candidates.append((gradient, -free if spread else free, model, free))
        for _, _, model, free in sorted(candidates):
            for (order, _), gpu in self.state.shared[(pool, model)][free].items():
                in_scope = allowed is None or order in allowed
                fits = share_units(pod, gpu.memory_mib) <= free and gpu.node.fits_host(pod)
                if in_scope and fits:
                    return gpu
        return None

    def _least_fragmenting_slot(
        self,
        index: int,
        pod: PodRequest,
        pool: str,
        models: list[str],
        shapes: ShapeHistogram,
    ) -> PodSlot | None:
        """Fragmentation gradient descent: the node and device where the placement adds
        least to the node's fragmentation against the shape histogram, among a bounded set
        of candidate nodes (_candidates); when none of them fits, the plain best fit."""
        best: tuple[tuple[float, bool, int, int], NodeState, str | None, int] | None = None
        seen: set[object] = set()
        for node in self._candidates(pod, pool, models):
            frees = [_free_units(g) for g in node.gpus]
            key = node_key(node.cpu_free, node.mem_free, frees)
            kind = (
                key
                if len(node.free_by_model) < 2
                else (key, *zip([g.model for g in node.gpus], frees, strict=True))
            )
            if kind in seen:
                continue  # a node in the same state earlier in order wins every tie
            seen.add(kind)
            for rank, model, free in self._options(pod, node, key, models, shapes):
                if best is None or rank < best[0]:
                    best = (rank, node, model, free)
        if best is None:
            return self._best_fit_slot(index, pod, pool, models, None)
        _, node, model, free = best
        host = {"cpu": pod.cpu, "host_memory": pod.memory_mib}
        if model is None:
            return PodSlot(index, node, **host)
        if pod.gpus > 0:
            gpus = tuple(g for g in node.gpus if g.model == model and g.is_free)[: pod.gpus]
            return PodSlot(index, node, gpus=gpus, **host)
        gpu = next(g for g in node.gpus if g.model == model and _free_units(g) == free)
        units = share_units(pod, gpu.memory_mib)
        memory = share_memory(pod, gpu.memory_mib)
        return PodSlot(index, node, shared=gpu, units=units, memory=memory, **host)

    def _candidates(self, pod: PodRequest, pool: str, models: list[str]) -> list[NodeState]:
        """The nodes to score, in node order: the first `candidates` nodes where the pod
        fits from each bucket of the free-capacity indexes (nodes with k free devices, for
        every k that fits; for a fractional pod also shared devices with u free units, the
        SHARED_BUCKETS least roomy that fit); a host-only pod also sees the pool's GPU-less
        nodes. Bounded whatever the cluster's size."""
        per_bucket = self.candidates
        found: dict[int, NodeState] = {}

        def take(nodes: Iterable[NodeState]) -> None:
            added = 0
            for node in nodes:
                if added >= per_bucket:
                    return
                if node.order not in found and node.fits_host(pod):
                    found[node.order] = node
                    added += 1

        if pod.gpus == 0 and not pod.is_shared:
            take(self._hostonly(pool))
        elif pod.is_shared:
            for model in models:
                buckets = self.state.shared.get((pool, model), {})
                units = share_units(pod, self.state.group_memory[(pool, model)])
                for free in sorted(b for b in buckets if b >= units)[:SHARED_BUCKETS]:
                    take(g.node for g in buckets[free].values())
        need = pod.gpus if pod.gpus > 0 else int(pod.is_shared)
        for model in models:
            buckets = self.state.whole.get((pool, model), {})
            for free in sorted(b for b in buckets if b >= need):
                take(buckets[free].values())
        return sorted(found.values(), key=lambda n: n.order)

    def _hostonly(self, pool: str) -> list[NodeState]:
        if pool not in self._gpuless:
            self._gpuless[pool] = [
                n for n in self.state.nodes if n.pool == pool and n.schedulable and not n.gpus
            ]
        return self._gpuless[pool]

    def _options(
        self,
        pod: PodRequest,
        node: NodeState,
        key: NodeKey,
        models: list[str],
        shapes: ShapeHistogram,
    ) -> Iterable[tuple[tuple[float, bool, int, int], str | None, int]]:
        """(rank, model, free units of the device to share) for each way the pod fits."""
        cpu, memory = pod.cpu, float(pod.memory_mib)
        if pod.gpus == 0 and not pod.is_shared:
            after = after_key(key, cpu, memory, [])
            yield (shapes.delta(key, after), False, 0, node.order), None, 0
            return
        for model in models:
            if pod.gpus > 0:
                free = node.free_by_model.get(model, 0)
                if free >= pod.gpus:
                    after = after_key(key, cpu, memory, [(UNITS, UNITS)] * pod.gpus)
                    yield (shapes.delta(key, after), False, free, node.order), model, UNITS
                continue
            seen: set[int] = set()
            for gpu in node.gpus:
                free = _free_units(gpu)
                if gpu.model != model or free in seen or free == 0:
                    continue
                seen.add(free)
                units = share_units(pod, gpu.memory_mib)
                if units <= free:
                    after = after_key(key, cpu, memory, [(free, units)])
                    rank = (shapes.delta(key, after), free == UNITS, free, node.order)
                    yield rank, model, free

    def _fill_for(self, group: Group) -> list[int]:
        if group not in self._fill:
            self._fill[group] = fill_table(self.waiting_sizes.get(group, ()))
        return self._fill[group]


SHARED_BUCKETS = 8  # shared-device buckets a fractional pod's candidates come from


def _free_units(gpu: GpuState) -> int:
    """Units of the device nobody holds (0 when it is held whole)."""
    return 0 if gpu.owner is not None else UNITS - gpu.used_units


def _mig_only(pod: PodRequest) -> bool:
    """A pod that asks a MIG instance and no whole device."""
    return bool(pod.mig_profile) and not pod.gpus


def _gang_pods(wl: Workload) -> list[PodRequest]:
    """The gang_min largest pods: what must fit for the workload to start."""
    return sorted(wl.pods, key=lambda p: (-p.gpus,))[: wl.gang_min]


def _pod_size_key(pod: PodRequest, index: int) -> tuple[int, float, int]:
    return (-pod.gpus, -pod.gpu_fraction - pod.gpu_memory_mib, index)
