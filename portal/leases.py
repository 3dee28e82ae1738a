"""Named single-flight leases: at most one holder of a name across all workers, held for a
short time and renewed by a heartbeat thread while the holder works.

A lease is for speed and order (two reconciles of one cluster would both create the same
missing pod; two cycles would waste work), so it must never outlive its holder for long: a
worker killed outright (SIGKILL, the OOM killer) cannot release it, and its lease runs out
after `ttl_s`. A lock that lasted five minutes once held every reconcile of the demo's
clusters up after its worker was killed (the restarted worker ran nothing).

With Redis (production) a lease is a Redis lock with an expiry; without it (SQLite, the
embedded mode) it is a row of portal.Lease claimed by a conditional UPDATE whose row count
says who won: the database serialises the two updates, so only one of them matches the row.
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

from portal.models import Lease as LeaseRow

logger = logging.getLogger(__name__)
MIN_TTL_S = 5


class Lease:
    """What `lease` yields: truthy when held; `token` names the holder."""

    def __init__(self, token: str, held: bool) -> None:
        self.token = token
        self.held = held
        self.renewals = 0

    def __bool__(self) -> bool:
        return self.held

    def __eq__(self, other: object) -> bool:
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


def redis_key(name: str) -> str:
    return f"gpupool:{name}-lock"


def period_ttl_s(period_s: float) -> int:
    """One period of the work the lease guards: a dead holder's lease is free by the next
    beat (never under MIN_TTL_S, so that a busy database does not lose a live holder's)."""
    return max(MIN_TTL_S, int(period_s))


@contextlib.contextmanager
def lease(name: str, ttl_s: int) -> Iterator[Lease]:
    """Yields a Lease, true when this caller holds `name`, false when another one does."""
    claim = _redis_lease if getattr(settings, "REDIS_URL", "") else _database_lease
    with claim(name, ttl_s) as (held, renew):
        if not held:
            yield held
            return
        with _heartbeat(name, held, renew, ttl_s):
            yield held


@contextlib.contextmanager
def _heartbeat(name: str, held: Lease, renew: Callable[[], bool], ttl_s: int) -> Iterator[None]:
    """Renew the lease every ttl/3 until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(ttl_s / 3):
                try:
                    if renew():
                        held.renewals += 1
                    else:
                        logger.warning("lease %s lost to another holder", name)
                        return
                except Exception:  # a failed renewal only shortens the lease
                    logger.exception("renewing lease %s failed", name)
        finally:
            connection.close()  # this thread's own connection, if it opened one

    thread = threading.Thread(target=beat, name=f"lease-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(ttl_s)


@contextlib.contextmanager
def _redis_lease(name: str, ttl_s: int) -> Iterator[tuple[Lease, Callable[[], bool]]]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    # Not thread-local: the heartbeat thread renews with the token this thread took.
    lock = client.lock(redis_key(name), timeout=ttl_s, blocking=False, thread_local=False)
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
def _database_lease(name: str, ttl_s: int) -> Iterator[tuple[Lease, Callable[[], bool]]]:
    token = uuid.uuid4().hex
    LeaseRow.objects.get_or_create(name=name)
    now = timezone.now()
    free = Q(locked_until__isnull=True) | Q(locked_until__lt=now)
    claimed = LeaseRow.objects.filter(free, name=name).update(
        holder=token, locked_until=now + timedelta(seconds=ttl_s)
    )
    mine = LeaseRow.objects.filter(name=name, holder=token)

    def renew() -> bool:
        return mine.update(locked_until=timezone.now() + timedelta(seconds=ttl_s)) == 1

    try:
        yield Lease(token, claimed == 1), renew
    finally:
        if claimed:
            mine.update(holder="", locked_until=None)
