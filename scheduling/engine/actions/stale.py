"""Stale gangs: a running gang below its minimum pods for too long is evicted whole.

A gang missing pods (one was lost with its node, say) holds GPUs that cannot do useful
work; after the grace period its remaining pods are freed so it can start again whole.
"""

from __future__ import annotations

from scheduling.engine.context import Context
from scheduling.engine.types import EvictionReason


def evict_stale_gangs(ctx: Context) -> None:
    """Evict running gangs that have been short of min_pods past the grace period."""
    grace = ctx.config.stale_gang_grace_s
    for wid in ctx.short_gangs:  # kept between cycles: a scan of every workload is not
        wl = ctx.workloads[wid]
        running = len({s.pod for s in ctx.state.slots[wl.id]})
        since = wl.degraded_since if wl.degraded_since is not None else wl.started_at
        if since is None or ctx.now - since >= grace:
            detail = f"{running} of {wl.gang_min} pods running for {grace:g} s or more"
            ctx.stmt.evict(wl, EvictionReason.STALE_GANG, None, detail)
