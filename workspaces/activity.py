"""When someone last used a workspace's tool through the proxy. Jupyter reports its own
activity (`/api/status`); VS Code server and TensorBoard do not, so idle culling reads
this instead for them. Kept in the shared cache (Redis, or files in the embedded mode),
which the web and worker processes both reach."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.utils import timezone

log = logging.getLogger(__name__)
KEY = "workspaces:proxied:{id}"
# A write per workspace and web process at most this often: culling counts in minutes.
WRITE_EVERY_S = 30.0
KEEP_S = 7 * 86_400
_written: dict[int, float] = {}


async def proxied(workspace_id: int) -> None:
    """A request, WebSocket handshake or WebSocket message from the user went through."""
    now = time.monotonic()
    last = _written.get(workspace_id)
    if last is not None and now - last < WRITE_EVERY_S:
        return
    _written[workspace_id] = now
    try:
        await _record(workspace_id)
    except Exception:  # the cache is down: the user's request must go through regardless
        log.exception("workspace %s: could not record its activity", workspace_id)


# Not thread-sensitive (cache.aset would be): it must not wait behind Django's sync views.
@sync_to_async(thread_sensitive=False)
def _record(workspace_id: int) -> None:
    cache.set(KEY.format(id=workspace_id), timezone.now().isoformat(), timeout=KEEP_S)


def last_proxied(workspace_id: int) -> datetime | None:
    value = cache.get(KEY.format(id=workspace_id))
    return datetime.fromisoformat(value) if value else None
