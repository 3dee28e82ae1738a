"""GPU fragmentation of a node against a distribution of pod shapes (Weng et al., ATC'23).

A node's fragmentation for one pod shape is the free GPU capacity that a pod of that shape
could not use there (the paper's three cases):
1. the pod does not fit the node at all (CPU, memory or GPUs short): every free unit;
2. it fits and asks for GPU: the free units of devices too small for it (a device with
   less free than its fraction, or a partly used device when it wants whole devices);
3. it asks for no GPU: every free unit (a CPU-only pod cannot use GPU capacity).
Against a histogram of shapes it is the popularity-weighted sum: the expected GPU capacity
the typical workload cannot use. Fragmentation gradient descent places each pod where that
figure grows least.

Capacity is in share units (state.UNITS per device) so that scores are integers times
weights and two equal node states always score the same. A node state is its free CPU,
free memory and the sorted free units of its devices; equal states share one cached score,
and the cache is dropped whenever the histogram publishes a new distribution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduling.engine.types import PodRequest, SchedulerConfig, Workload

UNITS = 1000  # share units per GPU, as in state.UNITS (kept here so the module stands alone)

# (free CPU cores, free host memory MiB, free units of each device, ascending)
NodeKey = tuple[float, float, tuple[int, ...]]


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """What one pod asks for: whole devices, or `units` of one shared device, or neither."""

    gpus: int = 0
    units: int = 0  # share units of one device, 0 < units < UNITS for a fractional pod
    cpu: float = 0.0
    memory_mib: float = 0.0

    def fits(self, key: NodeKey) -> bool:
        cpu, memory, frees = key
        if self.cpu > cpu + 1e-9 or self.memory_mib > memory:
            return False
        if self.gpus > 0:
            return sum(1 for f in frees if f >= UNITS) >= self.gpus
        if self.units > 0:
            return bool(frees) and frees[-1] >= self.units
        return True

    def fragment(self, key: NodeKey) -> int:
        """Free units of the node a pod of this shape cannot use (the three cases)."""
        frees = key[2]
        if not self.fits(key) or (self.gpus == 0 and self.units == 0):
            return sum(frees)
        need = UNITS if self.gpus > 0 else self.units
        return sum(f for f in frees if f < need)


class ShapeHistogram:
    """Exponentially decayed popularity of recent pod shapes, over a prior of typical ones.

    observe() adds a shape with weight 1 at time t; older observations count 2^(-age /
    half_life). The prior keeps `prior_weight` observations' worth of the typical mix so a
    cold start or a lull is not judged by a handful of pods. The distribution that scores
    use is republished only when it has moved by more than `republish` (L1 distance), so the
    per-state cache survives the steady state of one arrival per cycle.
    """

    def __init__(
        self,
        prior: dict[Shape, float] | None = None,
        half_life: float = 500.0,
        prior_weight: float = 50.0,
        republish: float = 0.05,
        repeat: bool = True,
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        total = sum((prior or {}).values())
        self.prior = {s: w / total for s, w in sorted((prior or {}).items())} if total else {}
        self.half_life = half_life
        self.prior_weight = prior_weight if self.prior else 0.0
        self.republish = republish
        self.repeat = repeat
        self._recent: dict[Shape, float] = {}  # weight scaled by 2^(t0 / half_life)
        self._t0 = 0.0
        self._scale = 1.0  # 2^((now - t0) / half_life): the weight one observation gets now
        self.version = 0
        self.shapes: tuple[tuple[Shape, float], ...] = ()
        self._classes: list[_DemandClass] = []
        self._cache: dict[NodeKey, float] = {}
        self._publish(dict(self.prior))

    def observe(self, shape: Shape, t: float, weight: float = 1.0) -> None:
        """Count one pod of this shape seen at time t (t never goes back)."""
        exponent = (t - self._t0) / self.half_life
        if exponent > 60:  # rebase before the scaled weights overflow
            factor = 2.0**-exponent
            self._recent = {s: w * factor for s, w in self._recent.items() if w * factor > 1e-9}
            self._t0, exponent = t, 0.0
        self._scale = 2.0**exponent
        self._recent[shape] = self._recent.get(shape, 0.0) + weight * self._scale
        self._maybe_publish()

    def distribution(self) -> dict[Shape, float]:
        """Current popularity of each shape, summing to 1 (empty when nothing is known)."""
        recent = {s: w / self._scale for s, w in self._recent.items()}
        total = self.prior_weight + sum(recent.values())
        if total <= 0:
            return {}
        mix = {s: self.prior_weight * p for s, p in self.prior.items()}
        for s, w in recent.items():
            mix[s] = mix.get(s, 0.0) + w
        return {s: w / total for s, w in sorted(mix.items()) if w / total > 1e-6}

    def _maybe_publish(self) -> None:
        new = self.distribution()
        old = dict(self.shapes)
        moved = sum(abs(new.get(s, 0.0) - old.get(s, 0.0)) for s in set(new) | set(old))
        if moved > self.republish or not self.shapes:
            self._publish(new)

    def _publish(self, distribution: dict[Shape, float]) -> None:
        self.shapes = tuple(distribution.items())
        classes: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
        for shape, w in self.shapes:
            classes.setdefault((shape.gpus, shape.units), []).append(
                (shape.cpu, shape.memory_mib, w)
            )
        self._classes = [
            _DemandClass(gpus, units, tuple(hosts), sum(w for _, _, w in hosts), self.repeat)
            for (gpus, units), hosts in sorted(classes.items())
        ]
        self.version += 1
        self._cache.clear()

    def score(self, key: NodeKey) -> float:
        """Expected free units the typical pod cannot use on a node in this state.

        The same as sum(w * shape.fragment(key)), grouped by GPU demand so that the device
        test runs once per demand rather than once per shape."""
        cached = self._cache.get(key)
        if cached is None:
            cached = sum(c.fragment(key) for c in self._classes)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = cached
        return cached

    def delta(self, before: NodeKey, after: NodeKey) -> float:
        """How much a placement that turns `before` into `after` adds to fragmentation."""
        return self.score(after) - self.score(before)


@dataclass(frozen=True, slots=True)
class _DemandClass:
    """The shapes that ask for the same GPU: their (cpu, memory, weight) and total weight."""

    gpus: int
    units: int
    hosts: tuple[tuple[float, float, float], ...]
    weight: float
    repeat: bool = False

    def fragment(self, key: NodeKey) -> float:
        if self.repeat:
            return self.unfilled(key)
        cpu, memory, frees = key
        total = sum(frees)
        if self.gpus > 0:
            fits_gpu = sum(1 for f in frees if f >= UNITS) >= self.gpus
            usable_below = UNITS
        elif self.units > 0:
            fits_gpu = bool(frees) and frees[-1] >= self.units
            usable_below = self.units
        else:
            return self.weight * total  # a CPU-only pod can use no GPU capacity
        if not fits_gpu:
            return self.weight * total
        fit = sum(w for c, m, w in self.hosts if c <= cpu + 1e-9 and m <= memory)
        stranded = sum(f for f in frees if f < usable_below)
        return fit * stranded + (self.weight - fit) * total

    def unfilled(self, key: NodeKey) -> float:
        """Free units that pods of this demand, repeated while the node's devices, CPU
        and memory last, would leave unused: FGD's measure with the host resources of
        every pod that could follow, not only the next one."""
        cpu, memory, frees = key
        total = sum(frees)
        if self.gpus > 0:
            per_pod = self.gpus * UNITS
            by_gpu = sum(1 for f in frees if f >= UNITS) // self.gpus
        elif self.units > 0:
            per_pod = self.units
            by_gpu = sum(f // self.units for f in frees)
        else:
            return self.weight * total
        if by_gpu == 0:
            return self.weight * total
        cpu_known, memory_known = math.isfinite(cpu), math.isfinite(memory)
        cpu += 1e-9
        placed = 0.0  # the weighted count of pods that fit
        for c, m, w in self.hosts:
            pods = by_gpu
            if c > 0 and cpu_known:
                pods = min(pods, int(cpu // c))
            if m > 0 and memory_known:
                pods = min(pods, int(memory // m))
            placed += w * pods
        return self.weight * total - per_pod * placed


def node_key(cpu_free: float, mem_free: float, frees: list[int]) -> NodeKey:
    """The cache key of a node state; unlimited CPU or memory stays unlimited."""
    return (cpu_free, mem_free if math.isfinite(mem_free) else math.inf, tuple(sorted(frees)))


def after_key(key: NodeKey, cpu: float, memory: float, take: list[tuple[int, int]]) -> NodeKey:
    """The state after taking `cpu`, `memory` and, for each (free, units) in `take`, units
    from one device that had `free` units free."""
    frees = list(key[2])
    for free, units in take:
        frees.remove(free)
        frees.append(free - units)
    return (key[0] - cpu, key[1] - memory, tuple(sorted(frees)))


def pod_shape(pod: PodRequest, gpu_memory_mib: int) -> Shape:
    """The shape of one pod; a share by memory counts as its part of such a device."""
    units = 0
    if pod.gpu_memory_mib > 0:
        units = min(
            UNITS - 1, max(1, math.ceil(pod.gpu_memory_mib * UNITS / max(gpu_memory_mib, 1)))
        )
    elif pod.gpu_fraction > 0:
        units = max(1, min(UNITS - 1, round(pod.gpu_fraction * UNITS)))
    return Shape(pod.gpus, units, pod.cpu, float(pod.memory_mib))


BUCKET_S = 60.0  # submission times are counted per minute: exact integer tallies
QUANTUM = 512  # a cycle's distribution is rounded to 1/QUANTUM (smaller weights dropped)


class ShapeTally:
    """How many pods of each shape the snapshot holds, per minute of submission.

    Integer counts, changed as workloads come and go (incremental.EngineState), so a kept
    tally and one built afresh are equal and give the same histogram. The shapes of a
    share by memory count against `gpu_memory_mib` (the cluster's smallest device)."""

    def __init__(self, workloads: Iterable[Workload], gpu_memory_mib: int) -> None:
        self.gpu_memory_mib = gpu_memory_mib
        self.counts: dict[Shape, dict[int, int]] = {}
        for wl in workloads:
            self.change(None, wl)

    def change(self, old: Workload | None, new: Workload | None) -> None:
        """One workload replaced by another (None: absent)."""
        if old is not None:
            self._count(old, -1)
        if new is not None:
            self._count(new, +1)

    def _count(self, wl: Workload, sign: int) -> None:
        bucket = math.floor(wl.submit_time / BUCKET_S)
        for pod in wl.pods:
            by_time = self.counts.setdefault(pod_shape(pod, self.gpu_memory_mib), {})
            count = by_time.get(bucket, 0) + sign
            if count:
                by_time[bucket] = count
            else:
                del by_time[bucket]

    def histogram(self, now: float, half_life_s: float) -> ShapeHistogram:
        """Each pod weighted by 2^(-age / half_life) of its submission minute, recent
        arrivals counting most and what has run long still saying what is typical; rounded
        to 1/QUANTUM so that consecutive cycles share one histogram and its score cache."""
        decay: dict[int, float] = {}  # each minute's weight, computed once
        weights: dict[Shape, float] = {}
        for shape, by_time in self.counts.items():
            for bucket in by_time:
                if bucket not in decay:
                    age = max(0.0, now - (bucket + 0.5) * BUCKET_S)
                    decay[bucket] = 2.0 ** (-age / half_life_s)
            # fsum is exactly rounded: the same total whatever order the minutes come in
            total = math.fsum(count * decay[bucket] for bucket, count in by_time.items())
            if total > 0:
                weights[shape] = total
        return quantized_histogram(weights)


def quantized_histogram(weights: dict[Shape, float]) -> ShapeHistogram:
    """The histogram of these popularity weights rounded to 1/QUANTUM; equal roundings
    share one (cached) histogram."""
    total = sum(weights.values())
    if total <= 0:
        return _histogram(())
    rounded = ((s, round(w * QUANTUM / total)) for s, w in sorted(weights.items()))
    return _histogram(tuple((s, q) for s, q in rounded if q > 0))


_HISTOGRAMS: dict[tuple[tuple[Shape, int], ...], ShapeHistogram] = {}


def _histogram(mix: tuple[tuple[Shape, int], ...]) -> ShapeHistogram:
    found = _HISTOGRAMS.get(mix)
    if found is None:
        if len(_HISTOGRAMS) >= 4:  # the last few roundings, each with its score cache
            _HISTOGRAMS.pop(next(iter(_HISTOGRAMS)))
        found = ShapeHistogram({s: float(q) for s, q in mix}, prior_weight=1.0)
        _HISTOGRAMS[mix] = found
    return found


def workload_shapes(
    workloads: Iterable[Workload], now: float, half_life_s: float, gpu_memory_mib: int
) -> ShapeHistogram:
    """The histogram of these workloads' pods at `now` (ShapeTally.histogram)."""
    return ShapeTally(workloads, gpu_memory_mib).histogram(now, half_life_s)


def cluster_memory(group_memory: dict[Any, int]) -> int:
    """A share by memory counts against the smallest device memory of the cluster."""
    return min(group_memory.values(), default=0)


def cycle_shapes(tally: ShapeTally, config: SchedulerConfig, now: float) -> ShapeHistogram | None:
    """The histogram a cycle packs against, or None when the config packs by best fit."""
    half_life = config.fragmentation_half_life_s
    if not half_life:
        return None
    return tally.histogram(now, half_life)
