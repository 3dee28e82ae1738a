"""Single flight for the scheduling cycle: at most one cycle runs across all workers.

Two cycles at once would both see the same free GPUs and hand them out twice. With
Redis (production) the lock is a Redis lock with an expiry; without it (SQLite, the
embedded mode) it is a row claimed by a conditional UPDATE whose row count says who
won: the database serialises the two updates, so only one of them matches the row.
Both expire after `ttl_s`, so a worker that died mid-cycle does not stop scheduling.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import timedelta

import redis
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from scheduling.models import CycleLock

LOCK_ID = 1
LOCK_TTL_S = 300
REDIS_KEY = "gpupool:scheduling-cycle-lock"


@contextlib.contextmanager
def cycle_lock(ttl_s: int = LOCK_TTL_S) -> Iterator[bool]:
    """Yields True when this caller holds the lock, False when another one does."""
    lock = _redis_lock if getattr(settings, "REDIS_URL", "") else _database_lock
    with lock(ttl_s) as acquired:
        yield acquired


@contextlib.contextmanager
def _redis_lock(ttl_s: int) -> Iterator[bool]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    lock = client.lock(REDIS_KEY, timeout=ttl_s, blocking=False)
    acquired = lock.acquire()
    try:
        yield acquired
    finally:
        if acquired:
            with contextlib.suppress(redis.exceptions.LockError):  # expired: nothing to free
                lock.release()
        client.close()


@contextlib.contextmanager
def _database_lock(ttl_s: int) -> Iterator[bool]:
    token = uuid.uuid4().hex
    CycleLock.objects.get_or_create(pk=LOCK_ID)
    now = timezone.now()
    free = Q(locked_until__isnull=True) | Q(locked_until__lt=now)
    claimed = CycleLock.objects.filter(free, pk=LOCK_ID).update(
        holder=token, locked_until=now + timedelta(seconds=ttl_s)
    )
    try:
        yield claimed == 1
    finally:
        if claimed:
            CycleLock.objects.filter(pk=LOCK_ID, holder=token).update(holder="", locked_until=None)
