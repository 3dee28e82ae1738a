"""The cycle skips consolidation, reclaim and preemption whole when no running workload
may be evicted (issue 17): the decisions stay the same, and the searches do not run."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from scheduling.engine import cycle
from scheduling.engine.actions import consolidate as consolidate_module
from scheduling.engine.types import SchedulerConfig, Snapshot
from tests.engine.builders import job, nodes, project, run, running, snapshot
from tests.engine.test_properties import FAST, NOW, random_snapshot, seeds


def _nothing_preemptible(snap: Snapshot, seed: int) -> Snapshot:
    """The same snapshot with its running work non-preemptible, or (odd seeds) still in
    its minimum runtime."""
    if seed % 2:
        started = [replace(w, priority_class="long", started_at=NOW - 1) for w in snap.workloads]
        return replace(snap, workloads=tuple(started))
    fixed = [replace(w, preemptible=False) if w.placement else w for w in snap.workloads]
    return replace(snap, workloads=tuple(fixed))


CONFIG = SchedulerConfig(min_runtime_s={"long": 3600.0})


@FAST
@given(seeds)
def test_skipping_the_eviction_actions_changes_no_decision(seed: int) -> None:
    snap = _nothing_preemptible(random_snapshot(seed), seed)
    skipped = run(snap, CONFIG, NOW)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle, "can_evict", lambda ctx: True)
        full = run(snap, CONFIG, NOW)
    assert skipped == full


def test_the_searches_are_skipped_when_nothing_is_preemptible(monkeypatch):
    # Two half-full nodes and a pending 8-GPU job: it fits in the pool's free GPUs in
    # total but on no node, so consolidation would try to make room (and find no victim).
    base = [running(job(f"r{i}", "a", gpus=4), f"n{i}", range(4)) for i in range(2)]
    big = job("big", "a", gpus=8, t=5)
    calls: list[str] = []
    real = consolidate_module.make_room

    def spy(ctx, wl, *args, **kw):
        calls.append(wl.id)
        return real(ctx, wl, *args, **kw)

    monkeypatch.setattr(consolidate_module, "make_room", spy)
    for preemptible, searched in ((True, ["big"]), (False, [])):
        work = [replace(w, preemptible=preemptible) for w in base]
        snap = snapshot(nodes(2), [project("a", dept=None, deserved=16)], [*work, big])
        calls.clear()
        result = run(snap)
        assert calls == searched
        if preemptible:  # the plan moves one 4-GPU job next to the other
            assert "big" in {a.workload_id for a in result.admissions}
        else:
            assert "big" in result.pending_reasons
