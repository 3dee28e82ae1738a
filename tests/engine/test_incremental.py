"""The state kept between cycles decides exactly as one rebuilt from each snapshot (issue 17).

A long random sequence of changes (the cycle's own decisions applied, departures,
arrivals, pending work changed, quota changes, holdings by pods the engine does not
manage, a node cordoned, copies of equal rows as a new database read gives) is fed to an
Engine that keeps its state, and each snapshot also to the pure schedule(): every
result must be equal, whole (admissions, evictions, reasons, shares, allocations).
"""

from __future__ import annotations

import gc
import random
from dataclasses import replace

import pytest
from hypothesis import given

from scheduling.engine import cycle as cycle_module
from scheduling.engine.apply import apply_result, remove_workloads
from scheduling.engine.cycle import Engine, schedule
from scheduling.engine.types import Gpu, GpuShare, SchedulerConfig, Snapshot
from tests.engine.builders import job, nodes, project, running, snapshot
from tests.engine.test_properties import FAST, NOW, _workload, random_snapshot, seeds

CONFIGS = (
    SchedulerConfig(),
    SchedulerConfig(min_runtime_s={"": 120.0}, max_victim_searches=3),
    SchedulerConfig(fairness_half_life_s=None, consolidate=False),
)


def _leaves(snap: Snapshot) -> list[str]:
    parents = {q.parent_id for q in snap.queues}
    return [q.id for q in snap.queues if q.id not in parents] or ["orphan"]


def _arrive(rng: random.Random, snap: Snapshot, serial: int) -> Snapshot:
    new = [_workload(rng, 1000 + serial * 10 + i, _leaves(snap), False) for i in range(3)]
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


def _reread(snap: Snapshot) -> Snapshot:
    """Equal rows in new objects, as every database read gives."""
    return replace(
        snap,
        nodes=tuple(replace(n) for n in snap.nodes),
        queues=tuple(replace(q) for q in snap.queues),
        workloads=tuple(replace(w) for w in snap.workloads),
    )


STEPS = (
    (0.25, _arrive),
    (0.4, lambda rng, snap, serial: _depart(rng, snap)),
    (0.5, lambda rng, snap, serial: _touch_pending(rng, snap)),
    (0.6, lambda rng, snap, serial: _requota(rng, snap)),
    (0.72, _foreign),
    (0.77, lambda rng, snap, serial: _cordon(rng, snap)),
    (0.82, lambda rng, snap, serial: _degrade(rng, snap)),
    (0.9, lambda rng, snap, serial: _reread(snap)),
    (1.0, lambda rng, snap, serial: snap),  # nothing changed
)


def _next(rng: random.Random, snap: Snapshot, serial: int) -> Snapshot:
    roll = rng.random()
    step = next(step for upto, step in STEPS if roll < upto)
    return step(rng, snap, serial)


def _replay(seed: int, steps: int) -> Engine:
    rng = random.Random(seed)
    snap = random_snapshot(seed)
    config = CONFIGS[seed % len(CONFIGS)]
    engine = Engine()
    now = NOW
    for serial in range(steps):
        kept = engine.schedule(snap, config, now)
        rebuilt = schedule(snap, config, now)
        assert kept == rebuilt, f"step {serial}"
        if rng.random() < 0.8:
            snap = apply_result(snap, kept, now)
        snap = _next(rng, snap, serial)
        now += rng.choice((0.0, 30.0, 600.0))
    return engine


@FAST
@given(seeds)
def test_kept_and_rebuilt_state_decide_alike_over_long_random_sequences(seed: int) -> None:
    _replay(seed, steps=40)


def test_most_cycles_of_a_long_sequence_update_the_kept_state_instead_of_rebuilding() -> None:
    engines = [_replay(seed, steps=60) for seed in range(6)]
    updates = sum(e.updates for e in engines)
    builds = sum(e.builds for e in engines)
    assert updates > 4 * builds, (updates, builds)


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
