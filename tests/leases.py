"""What a worker killed while it held a portal.leases lease leaves behind, and how long a
lease has left, on either store (Redis in the PostgreSQL pass, the Lease row without it)."""

from __future__ import annotations

from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from portal.leases import redis_key
from portal.models import Lease


def leave_dead_holder(name: str, ttl_s: float) -> None:
    """The lease as its holder took it, never renewed or released again."""
    if getattr(settings, "REDIS_URL", ""):
        client = redis.Redis.from_url(settings.REDIS_URL)
        client.set(redis_key(name), "dead-worker", px=int(ttl_s * 1000))
        client.close()
        return
    until = timezone.now() + timedelta(seconds=ttl_s)
    Lease.objects.update_or_create(
        name=name, defaults={"holder": "dead-worker", "locked_until": until}
    )


def seconds_left(name: str) -> float | None:
    """How long the lease has until it runs out; None when nobody holds it."""
    if getattr(settings, "REDIS_URL", ""):
        client = redis.Redis.from_url(settings.REDIS_URL)
        left_ms = client.pttl(redis_key(name))
        client.close()
        return left_ms / 1000 if left_ms > 0 else None
    row = Lease.objects.filter(name=name, locked_until__gt=timezone.now()).first()
    return (row.locked_until - timezone.now()).total_seconds() if row else None
