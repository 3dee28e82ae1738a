"""Single flight for the scheduling cycle: at most one cycle runs across all workers.

The lock is for speed (two cycles at once would waste work and one would fail); it is
not what keeps a GPU from being handed out twice: the cycle locks the node rows it
reads and re-checks capacity before writing (cycle.py), so a cycle that lost its lock
can only fail.

It is a portal.leases lease: a Redis lock with Redis, a row claimed by a conditional UPDATE
without it. The expiry is short (one cycle period, at least leases.MIN_TTL_S) and a
heartbeat thread renews it every third of that while the cycle runs, so a long cycle keeps
its lock and a worker that died mid-cycle holds up scheduling for at most one period.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from django.conf import settings

from portal.leases import Lease, lease, period_ttl_s

NAME = "scheduling-cycle"

__all__ = ["NAME", "Lease", "cycle_lock", "lock_ttl_s"]


def lock_ttl_s() -> int:
    """One cycle period: a dead holder's lock is free again by the next beat."""
    return period_ttl_s(getattr(settings, "GPUPOOL_CYCLE_INTERVAL_S", 10))


def cycle_lock(ttl_s: int | None = None) -> AbstractContextManager[Lease]:
    """Yields a Lease, true when this caller holds the lock, false when another one does."""
    return lease(NAME, ttl_s or lock_ttl_s())
