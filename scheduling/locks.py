"""Single flight for the scheduling cycle: at most one cycle runs across all workers.

The lock is for speed (two cycles at once would waste work and one would fail); it is
not what keeps a GPU from being handed out twice: the cycle locks the node rows it
reads and re-checks capacity before writing (cycle.py), so a cycle that lost its lock
can only fail.

With Redis (production) the lock is a Redis lock with an expiry; without it (SQLite, the
embedded mode) it is a row claimed by a conditional UPDATE whose row count says who
won: the database serialises the two updates, so only one of them matches the row.
The expiry is short (one cycle period, at least LOCK_MIN_TTL_S) and a heartbeat thread
renews it every third of that while the cycle runs, so a long cycle keeps its lock and
a worker that died mid-cycle holds up scheduling for at most one period.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from scheduling.models import CycleLock

logger = logging.getLogger(__name__)
LOCK_ID = 1
LOCK_MIN_TTL_S = 5
REDIS_KEY = "gpupool:scheduling-cycle-lock"


def lock_ttl_s() -> int:
    """One cycle period: a dead holder's lock is free again by the next beat."""
    return max(LOCK_MIN_TTL_S, int(getattr(settings, "GPUPOOL_CYCLE_INTERVAL_S", 10)))


class Lease:
    """What cycle_lock yields: truthy when held; `token` names the holder."""

    def __init__(self, token: str, held: bool) -> None:
        self.token = token
        self.held = held
        self.renewals = 0

    def __bool__(self) -> bool:
        return self.held

    def __eq__(self, other: object) -> bool:
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


@contextlib.contextmanager
def cycle_lock(ttl_s: int | None = None) -> Iterator[Lease]:
    """Yields a Lease, true when this caller holds the lock, false when another one does."""
    ttl = ttl_s or lock_ttl_s()
    lock = _redis_lock if getattr(settings, "REDIS_URL", "") else _database_lock
    with lock(ttl) as (lease, renew):
        if not lease:
            yield lease
            return
        with _heartbeat(lease, renew, ttl):
            yield lease


@contextlib.contextmanager
def _heartbeat(lease: Lease, renew: Callable[[], bool], ttl_s: int) -> Iterator[None]:
    """Renew the lock every ttl/3 until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(ttl_s / 3):
                try:
                    if renew():
                        lease.renewals += 1
                    else:
                        logger.warning("scheduling cycle lock lost to another holder")
                        return
                except Exception:  # a failed renewal only shortens the lease
                    logger.exception("scheduling cycle lock renewal failed")
        finally:
            connection.close()  # this thread's own connection, if it opened one

    thread = threading.Thread(target=beat, name="cycle-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(ttl_s)


@contextlib.contextmanager
def _redis_lock(ttl_s: int) -> Iterator[tuple[Lease, Callable[[], bool]]]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    # Not thread-local: the heartbeat thread renews with the token this thread took.
    lock = client.lock(REDIS_KEY, timeout=ttl_s, blocking=False, thread_local=False)
    acquired = bool(lock.acquire())
    token = lock.local.token.decode() if acquired else ""

    def renew() -> bool:
        try:
            return bool(lock.reacquire())
        except redis.exceptions.LockError:  # expired and taken: not ours any more
            return False

    try:
        yield Lease(token, acquired), renew
    finally:
        if acquired:
            with contextlib.suppress(redis.exceptions.LockError):  # expired: nothing to free
                lock.release()
        client.close()


@contextlib.contextmanager
def _database_lock(ttl_s: int) -> Iterator[tuple[Lease, Callable[[], bool]]]:
    token = uuid.uuid4().hex
    CycleLock.objects.get_or_create(pk=LOCK_ID)
    now = timezone.now()
    free = Q(locked_until__isnull=True) | Q(locked_until__lt=now)
    claimed = CycleLock.objects.filter(free, pk=LOCK_ID).update(
        holder=token, locked_until=now + timedelta(seconds=ttl_s)
    )

    def renew() -> bool:
        until = timezone.now() + timedelta(seconds=ttl_s)
        return CycleLock.objects.filter(pk=LOCK_ID, holder=token).update(locked_until=until) == 1

    try:
        yield Lease(token, claimed == 1), renew
    finally:
        if claimed:
            CycleLock.objects.filter(pk=LOCK_ID, holder=token).update(holder="", locked_until=None)
