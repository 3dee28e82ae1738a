"""Preempt: inside a project, a higher-priority workload evicts lower-priority ones.

Only preemptible workloads of the same project with a strictly lower priority that have
run their minimum runtime are victims, and only when the project's quota allows the
newcomer once they are gone. Runs after reclaim: it costs the project its own work.
"""

from __future__ import annotations

from scheduling.engine.actions.reclaim import Failures
from scheduling.engine.actions.victims import (
    Candidates,
    Victim,
    VictimIndex,
    VictimRule,
    make_room,
    preemptible,
)
from scheduling.engine.context import Context
from scheduling.engine.fairshare import EPS
from scheduling.engine.types import EvictionReason, Workload

MAX_VICTIMS = 64


def preempt(ctx: Context) -> None:
    """Let each pending workload evict lower-priority work of its own project."""
    if not ctx.config.preempt:
        return
    index = preemptible(ctx)
    if not index.by_queue:
        return
    failures = Failures()
    for wl in ctx.pending():
        if ctx.searches_left <= 0:
            return
        if wl.queue_id not in index.by_queue:
            continue
        for pool in ctx.pools_for(wl):
            if _try_preempt(ctx, wl, pool, index, failures):
                break


def _try_preempt(
    ctx: Context, wl: Workload, pool: str, index: VictimIndex, failures: Failures
) -> bool:
    need = ctx.gpu_need(wl, pool)
    key = (wl.queue_id, wl.priority, pool, wl.gpu_models, wl.topology, wl.pods[0].is_shared)
    if failures.known(key, wl, need):
        return False
    if not wl.preemptible and ctx.nonpreemptible_block(wl, pool) is not None:
        return False  # evicting preemptible work frees none of its non-preemptible quota
    victims = [v for v in index.live(wl.queue_id, pool) if v.wl.priority < wl.priority]
    free = ctx.state.free_whole(pool, ctx.state.models_for(pool, wl.gpu_models))
    if not victims or free + sum(v.gpus[pool] for v in victims) < need - EPS:
        failures.add(key, wl, need)
        return False

    def eligible(victim: Victim) -> bool:
        return victim.wl.queue_id == wl.queue_id and victim.wl.priority < wl.priority

    found = make_room(
        ctx,
        wl,
        pool,
        Candidates.of(victims),
        VictimRule(eligible),
        EvictionReason.PREEMPT,
        MAX_VICTIMS,
        ready=lambda: ctx.quota_block(wl, pool) is None,
    )
    if found is None:
        failures.add(key, wl, need)
        return False
    ctx.admit(wl, pool, found[1])
    return True
