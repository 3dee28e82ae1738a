"""The scheduling cycle: one pure function from a snapshot to decisions."""

from __future__ import annotations

from scheduling.engine.types import CycleResult, SchedulerConfig, Snapshot


def schedule(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """Run one scheduling cycle over `snapshot` at time `now` and return its decisions.

    Steps, in order:
    1. evict running gangs that stayed below their minimum pods past the grace period;
    2. compute each queue's fair share per pool and resource (hierarchical water-filling);
    3. allocate pending workloads, most starved queue first, gangs all-or-nothing;
    4. consolidate: move preemptible work to free a whole slot when fragmentation blocks;
    5. reclaim: under-quota queues evict preemptible work of queues above fair share;
    6. preempt: inside a project, higher priority evicts lower-priority preemptible work;
    7. give every workload still pending a readable reason.

    Pure and deterministic: the same snapshot, config and now give the same result. The
    snapshot is never mutated; apply the result with scheduling.engine.apply.apply_result.
    """
    raise NotImplementedError("the cycle is being built; see issue 3")
