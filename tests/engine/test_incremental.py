"""The state kept between cycles decides exactly as one rebuilt from each snapshot (issue 17).

A long random sequence of changes (the cycle's own decisions applied, departures,
arrivals, pending work changed, quota changes, holdings by pods the engine does not
manage, a node cordoned, copies of equal rows as a new database read gives) is fed to an
Engine that keeps its state, and each snapshot also to the pure schedule(): every
result must be equal, whole (admissions, evictions, reasons, shares, allocations).

With MIG (issue 14) the sequences also hold MIG-enabled devices, pods asking a profile or
memory (mapped to a profile), the instances the cycle cuts, reuses and repartitions, and
what the node side reports besides: idle instances destroyed or made, instances held by
pods outside the snapshot, a device's MIG mode switched.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given

from scheduling.engine import cycle as cycle_module
from scheduling.engine.apply import apply_result, remove_workloads
from scheduling.engine.cycle import Engine, schedule
from scheduling.engine.incremental import EngineState
from scheduling.engine.mig import _RANK, MigIndex, _keys, all_legal, profiles_for
from scheduling.engine.types import Gpu, GpuShare, MigInstance, SchedulerConfig, Snapshot
from tests.engine.builders import job, nodes, project, running, snapshot
from tests.engine.test_mig import mig_job, mig_node, queues
from tests.engine.test_properties import FAST, NOW, _workload, random_snapshot, seeds

CONFIGS = (
    SchedulerConfig(),
    SchedulerConfig(min_runtime_s={"": 120.0}, max_victim_searches=3),
    SchedulerConfig(fairness_half_life_s=None, consolidate=False),
)


def _leaves(snap: Snapshot) -> list[str]:
    parents = {q.parent_id for q in snap.queues}
    return [q.id for q in snap.queues if q.id not in parents] or ["orphan"]


Step = Callable[[random.Random, Snapshot, int], Snapshot]


def _has_mig(snap: Snapshot) -> bool:
    return any(g.mig for n in snap.nodes for g in n.gpus)


def _arrive(rng: random.Random, snap: Snapshot, serial: int) -> Snapshot:
    mig = _has_mig(snap)
    new = [_workload(rng, 1000 + serial * 10 + i, _leaves(snap), False, mig) for i in range(3)]
    return replace(snap, workloads=snap.workloads + tuple(new[: rng.randint(1, 3)]))


def _depart(rng: random.Random, snap: Snapshot) -> Snapshot:
    ids = [wl.id for wl in snap.workloads if rng.random() < 0.15]
    return remove_workloads(snap, set(ids))


def _touch_pending(rng: random.Random, snap: Snapshot) -> Snapshot:
    workloads = tuple(
        replace(wl, priority=rng.choice((0, 5, 10, 20)))
        if wl.placement is None and rng.random() < 0.3
        else wl
        for wl in snap.workloads
    )
    return replace(snap, workloads=workloads)


def _requota(rng: random.Random, snap: Snapshot) -> Snapshot:
    queues = []
    for q in snap.queues:
        quotas = {
            key: replace(quota, deserved=rng.randint(0, 6), limit=rng.choice((None, 8, 3)))
            if rng.random() < 0.5
            else quota
            for key, quota in q.quotas.items()
        }
        queues.append(replace(q, quotas=quotas, nonpreemptible_over_quota=rng.random() < 0.3))
    return replace(snap, queues=tuple(queues))


def _foreign(rng: random.Random, snap: Snapshot, serial: int) -> Snapshot:
    """A free device taken, or a foreign holding let go, by pods outside the snapshot."""
    out = []
    for node in snap.nodes:
        gpus = tuple(_ghost(gpu, rng.random(), serial) for gpu in node.gpus)
        out.append(replace(node, gpus=gpus))
    return replace(snap, nodes=tuple(out))


def _ghost(gpu: Gpu, roll: float, serial: int) -> Gpu:
    if gpu.mig:
        return gpu  # MIG devices are held through instances (_node_side)
    free = gpu.whole_by is None and not gpu.shares
    if free and roll < 0.05:
        return replace(gpu, whole_by=f"ghost-{serial}")
    if free and roll < 0.08:
        return replace(gpu, shares=(GpuShare(f"ghost-s{serial}", 0.4),))
    return _without_ghosts(gpu) if roll < 0.3 else gpu


def _without_ghosts(gpu: Gpu) -> Gpu:
    owner = gpu.whole_by if not (gpu.whole_by or "").startswith("ghost") else None
    shares = tuple(s for s in gpu.shares if not s.workload_id.startswith("ghost"))
    return replace(gpu, whole_by=owner, shares=shares)


def _cordon(rng: random.Random, snap: Snapshot) -> Snapshot:
    if not snap.nodes:
        return snap
    i = rng.randrange(len(snap.nodes))
    nodes_ = list(snap.nodes)
    nodes_[i] = replace(nodes_[i], schedulable=not nodes_[i].schedulable)
    return replace(snap, nodes=tuple(nodes_))


def _degrade(rng: random.Random, snap: Snapshot) -> Snapshot:
    """A running gang loses a pod (its node went away, say): below its minimum, it is
    evicted once the grace period has passed."""
    gangs = [wl for wl in snap.workloads if wl.placement and len(wl.placement) > 1]
    if not gangs:
        return snap
    hit = rng.choice(gangs)
    assert hit.placement is not None
    short = replace(hit, placement=hit.placement[:-1], degraded_since=NOW - rng.choice((0, 900)))
    workloads = tuple(short if wl.id == hit.id else wl for wl in snap.workloads)
    return remove_workloads(replace(snap, workloads=workloads), set())  # nodes follow


def _node_side(rng: random.Random, snap: Snapshot, serial: int) -> Snapshot:
    """What a node reports of one MIG device besides the cycle's own doing: its idle
    instances destroyed (an admin's clean-up), an idle instance made at a free legal start,
    one held by a pod outside the snapshot, or such a holding gone."""
    devices = [(i, g) for i, n in enumerate(snap.nodes) for g in n.gpus if g.mig]
    if not devices:
        return snap
    at, gpu = rng.choice(devices)
    roll = rng.random()
    instances = gpu.mig_instances
    if roll < 0.3:
        instances = tuple(i for i in instances if i.workload_id is not None)
    elif roll < 0.8:
        holder = f"ghost-m{serial}" if roll < 0.55 else None
        instances = _cut(rng, gpu, holder)
    else:
        instances = tuple(i for i in instances if not (i.workload_id or "").startswith("ghost"))
    return _with_gpu(snap, at, gpu, replace(gpu, mig_instances=instances))


def _cut(rng: random.Random, gpu: Gpu, holder: str | None) -> tuple[MigInstance, ...]:
    """The device's instances and one more at a random legal start overlapping none."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    used = 0
    for inst in gpu.mig_instances:
        used |= profiles[inst.profile].mask(inst.start)
    free = [(n, s) for n, s in all_legal(gpu.model) if not profiles[n].mask(s) & used]
    if not free:
        return gpu.mig_instances
    name, start = rng.choice(free)
    return tuple(
        sorted((*gpu.mig_instances, MigInstance(name, start, holder)), key=lambda i: i.start)
    )


def _mig_mode(rng: random.Random, snap: Snapshot) -> Snapshot:
    """A free device switched into or out of MIG mode (an admin, with the GPU reset)."""
    free = [
        (i, g)
        for i, n in enumerate(snap.nodes)
        for g in n.gpus
        if g.whole_by is None and not g.shares and not g.mig_instances
    ]
    if not free:
        return snap
    at, gpu = rng.choice(free)
    return _with_gpu(snap, at, gpu, replace(gpu, mig=not gpu.mig))


def _with_gpu(snap: Snapshot, at: int, old: Gpu, new: Gpu) -> Snapshot:
    """The snapshot with one device of its node at position `at` replaced."""
    node = snap.nodes[at]
    nodes_ = list(snap.nodes)
    nodes_[at] = replace(node, gpus=tuple(new if g is old else g for g in node.gpus))
    return replace(snap, nodes=tuple(nodes_))


def _reread(snap: Snapshot) -> Snapshot:
    """Equal rows in new objects, as every database read gives."""
    return replace(
        snap,
        nodes=tuple(replace(n) for n in snap.nodes),
        queues=tuple(replace(q) for q in snap.queues),
        workloads=tuple(replace(w) for w in snap.workloads),
    )


def _steps(devices: tuple[tuple[float, Step], ...]) -> tuple[tuple[float, Step], ...]:
    """Each step with the roll it is taken below; `devices`: what happens to devices."""
    return (
        (0.25, _arrive),
        (0.4, lambda rng, snap, serial: _depart(rng, snap)),
        (0.5, lambda rng, snap, serial: _touch_pending(rng, snap)),
        (0.6, lambda rng, snap, serial: _requota(rng, snap)),
        *devices,
        (0.77, lambda rng, snap, serial: _cordon(rng, snap)),
        (0.82, lambda rng, snap, serial: _degrade(rng, snap)),
        (0.9, lambda rng, snap, serial: _reread(snap)),
        (1.0, lambda rng, snap, serial: snap),  # nothing changed
    )


STEPS = _steps(((0.72, _foreign),))
MIG_STEPS = _steps(((0.72, _node_side), (0.74, lambda rng, snap, serial: _mig_mode(rng, snap))))


def _next(rng: random.Random, snap: Snapshot, serial: int, mig: bool = False) -> Snapshot:
    roll = rng.random()
    step = next(step for upto, step in (MIG_STEPS if mig else STEPS) if roll < upto)
    return step(rng, snap, serial)


def _replay(seed: int, steps: int, mig: bool = False) -> Engine:
    rng = random.Random(seed)
    snap = random_snapshot(seed, mig=mig)
    config = CONFIGS[seed % len(CONFIGS)]
    engine = Engine()
    now = NOW
    for serial in range(steps):
        kept = engine.schedule(snap, config, now)
        rebuilt = schedule(snap, config, now)
        assert kept == rebuilt, f"step {serial}"
        if mig:
            assert engine.state is not None
            fresh = EngineState(engine.state.snapshot).state.mig
            assert _mig_view(engine.state.state.mig) == _mig_view(fresh), f"step {serial}"
        if rng.random() < 0.8:
            snap = apply_result(snap, kept, now)
        snap = _next(rng, snap, serial, mig)
        now += rng.choice((0.0, 30.0, 600.0))
    return engine


def _mig_view(index: MigIndex) -> tuple[object, ...]:
    """What a MIG index holds, to compare a kept one with a fresh build: each device's
    instances and index keys, and every bucket's devices in order. A group's mask order,
    where one is kept (MigIndex._orders), must be its masks emptiest first."""
    devices = {}
    for key, gpu in sorted(index.by_key.items()):
        assert gpu.keys in (_keys(gpu), ((), -1, -1)), key  # kept in step with its instances
        devices[key] = (gpu.keys, [(i.profile.name, i.start, i.holder) for i in gpu.instances])
    buckets = {}
    for name, by_group in (("idle", index.idle), ("used", index.used), ("held", index.held)):
        for group, by_mask in by_group.items():
            order = index._orders.get(id(by_mask))
            if order is not None:
                assert order == sorted(by_mask, key=_RANK.__getitem__), (name, group)
            for mask, bucket in by_mask.items():
                assert bucket, (name, group, mask)  # an emptied bucket goes
                buckets[(name, group, mask)] = list(bucket)
    return devices, dict(sorted(buckets.items()))


@FAST
@given(seeds)
def test_kept_and_rebuilt_state_decide_alike_over_long_random_sequences(seed: int) -> None:
    _replay(seed, steps=40)


@FAST
@given(seeds)
def test_kept_and_rebuilt_state_decide_alike_over_long_random_sequences_with_mig(seed: int) -> None:
    _replay(seed, steps=40, mig=True)


@pytest.mark.parametrize("mig", [False, True])
def test_most_cycles_of_a_long_sequence_update_the_kept_state_instead_of_rebuilding(
    mig: bool,
) -> None:
    engines = [_replay(seed, steps=60, mig=mig) for seed in range(6)]
    updates = sum(e.updates for e in engines)
    builds = sum(e.builds for e in engines)
    assert updates > 4 * builds, (updates, builds)


def test_mig_cycles_cut_reuse_and_repartition_on_the_kept_state_without_rebuilding() -> None:
    """A cluster of MIG devices only: every kind of instance change goes through update()."""
    snap = snapshot([mig_node("n0", 2), mig_node("n1", 1, repartition=False)], queues(16), [])
    engine = Engine()
    now = NOW
    shapes = ("1g.10gb", "3g.40gb", "4g.40gb", "7g.80gb", "2g.20gb")
    for step in range(30):
        arrivals = [mig_job(f"w{step}-{i}", shapes[(step + i) % 5], t=now) for i in range(2)]
        snap = replace(snap, workloads=snap.workloads + tuple(arrivals))
        kept = engine.schedule(snap, SchedulerConfig(), now)
        assert kept == schedule(snap, SchedulerConfig(), now), f"step {step}"
        snap = apply_result(snap, kept, now)
        running = [w.id for w in snap.workloads if w.placement is not None]
        snap = remove_workloads(snap, set(running[: step % 3]))
        now += 60
    assert (engine.builds, engine.updates) == (1, 29)


def test_a_snapshot_whose_nodes_and_placements_disagree_is_rebuilt_and_decides_alike() -> None:
    base = snapshot(nodes(2), [project("a", dept=None, deserved=16)], [job("p", "a", gpus=2)])
    engine = Engine()
    engine.schedule(base, SchedulerConfig(), NOW)
    # The job now runs on n0 devices 0-1, but the node rows still say they are free: the
    # fresh build trusts the placement, and the kept state must not guess otherwise.
    moved = replace(base, workloads=(running(job("p", "a", gpus=2), "n0", range(2)),))
    moved = replace(moved, workloads=(*moved.workloads, job("q", "a", gpus=8, t=1)))
    kept = engine.schedule(moved, SchedulerConfig(), NOW + 60)
    assert kept == schedule(moved, SchedulerConfig(), NOW + 60)
    assert (engine.builds, engine.updates) == (2, 0)


def test_an_unchanged_snapshot_costs_no_rebuild_and_gives_the_same_result_again() -> None:
    snap = random_snapshot(3)
    engine = Engine()
    first = engine.schedule(snap, SchedulerConfig(), NOW)
    again = engine.schedule(snap, SchedulerConfig(), NOW)
    assert first == again == schedule(snap, SchedulerConfig(), NOW)
    assert (engine.builds, engine.updates) == (1, 1)


def test_a_cycle_pauses_the_cycle_collector_and_leaves_it_as_it_found_it() -> None:
    snap = random_snapshot(7)
    seen: list[bool] = []
    real = cycle_module.allocate

    def spy(ctx: object) -> None:
        seen.append(gc.isenabled())
        real(ctx)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module, "allocate", spy)
        schedule(snap, SchedulerConfig(), NOW)
        assert gc.isenabled()
        gc.disable()
        try:
            Engine().schedule(snap, SchedulerConfig(), NOW)
            assert not gc.isenabled()
        finally:
            gc.enable()
    assert seen and not any(seen)


@pytest.mark.parametrize("seed", [7, 11, 2014])
def test_a_cycle_leaves_no_reference_cycles_for_the_collector(seed: int) -> None:
    """What a kept state's cycle builds (context, victim index, fair-share walk,
    statement, undo log) is freed by reference counting when it ends: with the collector
    paused during the cycle, a reference cycle there would keep all of it (tens of
    thousands of objects at `scale`) for the collection after the cycle, which costs the
    portal's cycle its time (a fifth of the bench's cost at `scale`). The pure schedule()
    drops a whole state, whose nodes and devices refer to each other: not checked."""
    snap = random_snapshot(seed)
    engine = Engine()
    engine.schedule(snap, SchedulerConfig(), NOW)  # the kept state is built once
    evicting = SchedulerConfig(min_runtime_s={"": 0.0})
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            result = engine.schedule(snap, evicting, NOW)
        assert result.admissions and gc.collect() == 0
    finally:
        gc.enable()
