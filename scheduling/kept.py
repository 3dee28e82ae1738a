"""Reads kept for the length of a block: a caller that checks many submits at once (a
native intake pass queues up to thousands) reads each thing they share once, as it was
when the block began: the nodes' sizes, the node pools' names, a project's policy.

Outside a block every read goes to the database, as a single submit's must."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
_KEPT: ContextVar[dict[Hashable, object] | None] = ContextVar("kept_reads", default=None)


@contextlib.contextmanager
def reads_kept() -> Iterator[None]:
    """Inside the block, `kept(key, read)` calls `read` once per key."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def kept(key: Hashable, read: Callable[[], T]) -> T:
    """`read()`, or inside a `reads_kept` block what it gave the first time for `key`."""
    cache = _KEPT.get()
    if cache is None:
        return read()
    if key not in cache:
        cache[key] = read()
    return cache[key]  # type: ignore[return-value]
