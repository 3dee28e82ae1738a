"""Preempt: inside a project, a higher-priority workload evicts lower-priority ones.

Only preemptible workloads of the same project with a strictly lower priority that have
run their minimum runtime are victims, and only when the project's quota allows the
newcomer once they are gone. Runs after reclaim: it costs the project its own work.
"""

from __future__ import annotations

from scheduling.engine.actions.victims import VictimIndex, make_room
from scheduling.engine.context import Context
from scheduling.engine.placement import ShapeKey
from scheduling.engine.types import EvictionReason, Workload

MAX_VICTIMS = 64


def preempt(ctx: Context) -> None:
    """Let each pending workload evict lower-priority work of its own project."""
    if not ctx.config.preempt:
        return
    index = VictimIndex(ctx, lambda wl: wl.preemptible and ctx.min_runtime_passed(wl))
    if not index.by_node:
        return
    failed: set[tuple[str, int, str, ShapeKey]] = set()
    for wl in ctx.pending():
        for pool in ctx.pools_for(wl):
            key = (wl.queue_id, wl.priority, pool, ShapeKey.of(wl))
            if key in failed:
                continue

            def eligible(victim: Workload, wl: Workload = wl) -> bool:
                return victim.queue_id == wl.queue_id and victim.priority < wl.priority

            found = make_room(
                ctx,
                wl,
                pool,
                index,
                eligible,
                EvictionReason.PREEMPT,
                MAX_VICTIMS,
                ready=lambda wl=wl, pool=pool: ctx.quota_block(wl, pool) is None,
            )
            if found is not None:
                ctx.admit(wl, pool, found[1])
                break
            failed.add(key)
