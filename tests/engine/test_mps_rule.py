"""The engine's side of MPS (docs/gpu-sharing.md): whole-GPU work never lands on a GPU
that MPS sharers hold, and a GPU stops being shared only once its last sharer is gone.

The node side runs a GPU's MPS daemon while any allocation shares it; these properties are
what makes that safe: a whole-GPU pod is admitted onto a device only when no sharer holds
it after the cycle's evictions, so it never runs beside an MPS server's clients."""

from __future__ import annotations

from hypothesis import given

from scheduling.engine import schedule
from scheduling.engine.apply import apply_result
from scheduling.engine.types import SchedulerConfig, Snapshot
from tests.engine.test_properties import FAST, NOW, random_snapshot, seeds


def _sharers(snap: Snapshot) -> dict[tuple[str, int], set[str]]:
    held: dict[tuple[str, int], set[str]] = {}
    for wl in snap.workloads:
        for p in wl.placement or ():
            if p.shared_gpu is not None:
                held.setdefault((p.node_id, p.shared_gpu), set()).add(wl.id)
    return held


@FAST
@given(seeds)
def test_whole_gpu_work_lands_only_where_no_sharer_remains(seed: int) -> None:
    snap = random_snapshot(seed)
    result = schedule(snap, SchedulerConfig(), NOW)
    evicted = {e.workload_id for e in result.evictions}
    # Sharers still holding each device after the evictions. One moved by consolidation
    # leaves its device (and is placed again elsewhere: test_properties checks no device
    # ends up both whole and shared).
    remaining = {key: holders - evicted for key, holders in _sharers(snap).items()}
    for admission in result.admissions:
        for pod in admission.pods:
            for index in pod.gpus:
                assert not remaining.get((pod.node_id, index)), (
                    f"{admission.workload_id} takes {pod.node_id}/{index} whole beside sharers "
                    f"{remaining[(pod.node_id, index)]}"
                )


@FAST
@given(seeds)
def test_a_shared_gpu_stays_shared_while_one_sharer_is_left(seed: int) -> None:
    """After a cycle, every device a surviving sharer holds is still a shared device (no
    whole owner); it leaves sharing only when none of its sharers is left."""
    snap = random_snapshot(seed)
    after = apply_result(snap, schedule(snap, SchedulerConfig(), NOW), NOW)
    whole = {
        (p.node_id, index) for wl in after.workloads for p in wl.placement or () for index in p.gpus
    }
    for key, holders in _sharers(after).items():
        assert holders and key not in whole, key


def test_the_random_snapshots_do_put_sharers_and_whole_work_on_one_node() -> None:
    mixed = 0
    for seed in range(200):
        snap = random_snapshot(seed)
        shared_nodes = {node for node, _ in _sharers(snap)}
        if any(
            not p.shared_gpu and p.node_id in shared_nodes
            for wl in snap.workloads
            for p in wl.placement or ()
        ):
            mixed += 1
    assert mixed >= 10  # the properties above are exercised, not vacuous
