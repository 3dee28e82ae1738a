"""Requests per workload, counted by the portal's proxy, for scale-on-requests.

Every request (and WebSocket handshake) the proxy lets through to a workload's HTTP port
adds one to that workload's counter for the current minute, in the shared cache (Redis:
an atomic INCR; the embedded file cache: a read and a write, so two processes counting at
the same instant may lose one count, which a rate over minutes does not feel). No database
write per request. Counters expire after RATE_WINDOW_S plus a minute, so at most
RATE_WINDOW_S / BUCKET_S + 2 keys live per workload that is being called.

scheduling/autoscale.py reads the rate over the last min(cool-down, RATE_WINDOW_S).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.core.cache import cache

log = logging.getLogger(__name__)

BUCKET_S = 60
RATE_WINDOW_S = 15 * 60  # the rate is read over at most this long: at most 16 keys
KEY = "scheduling:requests:{id}:{bucket}"
KEEP_S = RATE_WINDOW_S + 2 * BUCKET_S
clock: Callable[[], float] = time.time  # epoch seconds; the proxy's requests are "now"


async def request_seen(workload_id: int) -> None:
    """One request to the workload went through the proxy."""
    try:
        await _count(workload_id, clock())
    except Exception:  # the cache is down: the user's request must go through regardless
        log.exception("workload %s: could not count a request", workload_id)


# Not thread-sensitive: it must not wait behind Django's sync views (as activity.proxied).
@sync_to_async(thread_sensitive=False)
def _count(workload_id: int, now: float) -> None:
    key = KEY.format(id=workload_id, bucket=int(now // BUCKET_S))
    if cache.add(key, 1, timeout=KEEP_S):
        return
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=KEEP_S)


def requests_per_minute(workload_id: int, window_s: float, now: float) -> float:
    """Requests per minute to the workload over the last `window_s` seconds (at most
    RATE_WINDOW_S), from the minute counters whose minute began in that window (the
    current minute's too, as far as it has come)."""
    window_s = max(float(BUCKET_S), min(float(window_s), float(RATE_WINDOW_S)))
    last = int(now // BUCKET_S)
    first = math.ceil((now - window_s) / BUCKET_S)
    keys = [KEY.format(id=workload_id, bucket=b) for b in range(first, last + 1)]
    total = sum(int(v) for v in cache.get_many(keys).values())
    return total * 60.0 / window_s
