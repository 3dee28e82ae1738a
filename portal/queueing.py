"""Asking for a task without letting an unreachable broker or cache fail the request.

A submit stores its row, then (on commit) asks for a scheduling cycle and maybe a
reconcile. When Redis or the broker is down, that ask raises; the row is already stored,
so answering 500 tells the user nothing happened and invites a duplicate submit. The beat
runs both tasks periodically anyway, so a lost ask only delays the work by one period.
`enqueue` logs the failure and notes it for the request; the view that made the change
reads the notes (`deferrals`) and tells the user the work is stored and will be picked
up by the next periodic run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from django.conf import settings
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

# What a broker or cache that cannot be reached raises: kombu's OperationalError (a
# broker), redis' errors (the cache), OSError (a socket or a file).
UNREACHABLE = (OperationalError, RedisError, OSError)

_deferred: ContextVar[tuple[str, ...]] = ContextVar("gpupool_deferred", default=())


def enqueue(send: Callable[[], object], what: str) -> bool:
    """Call `send` (a task's delay or apply_async); False, logged and noted, when the
    broker or cache cannot be reached."""
    try:
        send()
    except UNREACHABLE as exc:
        logger.warning("could not queue %s (%s); its periodic run will do it", what, exc)
        _deferred.set((*_deferred.get(), what))
        return False
    return True


@contextlib.contextmanager
def deferrals() -> Iterator[list[str]]:
    """The tasks that could not be queued inside the block (filled in when it ends)."""
    token = _deferred.set(())
    found: list[str] = []
    try:
        yield found
    finally:
        found.extend(_deferred.get())
        _deferred.reset(token)


def deferred_notice(deferred: list[str]) -> str:
    """What the user is told when a change was stored but its follow-up was not queued."""
    if not deferred:
        return ""
    return (
        "Stored, but the scheduler's queue cannot be reached right now; the next periodic "
        f"scheduling cycle (every {settings.GPUPOOL_CYCLE_INTERVAL_S} s) picks it up."
    )
