"""Celery entry points of the workspaces app."""

from __future__ import annotations

from celery import shared_task
from django.core.cache import cache

from workspaces.culling import workspaces_cull

LOCK = "workspaces:cull-idle"


@shared_task(ignore_result=True)
def cull_idle_workspaces() -> dict[str, int] | None:
    """Beat runs this every minute. Single-flight: two overlapping runs would both warn
    the same workspace, so the second one returns at once."""
    if not cache.add(LOCK, 1, timeout=300):
        return None
    try:
        return workspaces_cull()
    finally:
        cache.delete(LOCK)
