"""Celery entry points of the workspaces app."""

from __future__ import annotations

from celery import shared_task

from portal.leases import lease, period_ttl_s
from workspaces.culling import workspaces_cull

LEASE = "workspaces-cull-idle"
PERIOD_S = 60  # beat's schedule for the task (portal/celery.py)


@shared_task(ignore_result=True)
def cull_idle_workspaces() -> dict[str, int] | None:
    """Beat runs this every minute. Single-flight: two overlapping runs would both warn
    the same workspace, so the second one returns at once. The lease lasts one period
    (renewed while the run goes on): a worker killed mid-run does not stop the next."""
    with lease(LEASE, period_ttl_s(PERIOD_S)) as held:
        return workspaces_cull() if held else None
