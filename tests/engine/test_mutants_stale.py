"""Stale gangs: rules that mutation testing found unguarded (docs/engine.md, "Mutation
testing")."""

from __future__ import annotations

import pytest

from scheduling.engine.types import (
    EvictionReason,
    PodPlacement,
    PodRequest,
    SchedulerConfig,
    Workload,
)
from tests.engine.builders import dept, nodes, project, run, snapshot

NOW = 1000.0
GRACE = SchedulerConfig(stale_gang_grace_s=300)


def _short_gang(degraded: float | None, started: float | None, gpus: int = 1) -> Workload:
    """A gang of 4 pods with 3 running on n0, each pod on `gpus` devices."""
    pods = (PodRequest(gpus=gpus),) * 4
    placement = tuple(
        PodPlacement(i, "n0", gpus=tuple(range(i * gpus, (i + 1) * gpus))) for i in range(3)
    )
    return Workload(
        "gang", "p1", pods, placement=placement, started_at=started, degraded_since=degraded
    )


def _evictions(gang: Workload) -> list[tuple[str, EvictionReason, str]]:
    snap = snapshot(nodes(1, gpus=8), [dept(), project("p1", deserved=8)], [gang])
    result = run(snap, GRACE, now=NOW)
    return [(e.workload_id, e.reason, e.detail) for e in result.evictions]


def test_a_gang_short_for_exactly_the_grace_period_is_evicted() -> None:
    # "for the grace period or more": the boundary itself is stale.
    assert [e[:2] for e in _evictions(_short_gang(NOW - 300, 0.0))] == [
        ("gang", EvictionReason.STALE_GANG)
    ]
    assert _evictions(_short_gang(NOW - 299, 0.0)) == []


@pytest.mark.parametrize(("started", "stale"), [(NOW - 300, True), (NOW - 299, False)])
def test_without_a_degraded_time_the_gang_is_timed_from_its_start(
    started: float, stale: bool
) -> None:
    # A gang that never ran whole (degraded_since unset) is short since it started.
    assert bool(_evictions(_short_gang(None, started))) is stale


def test_the_degraded_time_wins_over_an_old_start() -> None:
    # Started long ago, short only since 100 s: still within the grace period.
    assert _evictions(_short_gang(NOW - 100, 0.0)) == []


def test_a_short_gang_with_no_time_at_all_is_evicted() -> None:
    # Nothing says since when it is short: it cannot be shown to be within the grace.
    assert [e[:2] for e in _evictions(_short_gang(None, None))] == [
        ("gang", EvictionReason.STALE_GANG)
    ]


def test_the_detail_counts_pods_not_devices() -> None:
    # Three pods of two GPUs each hold six devices: "3 of 4 pods".
    ((_, _, detail),) = _evictions(_short_gang(NOW - 400, 0.0, gpus=2))
    assert detail == "3 of 4 pods running for 300 s or more"
