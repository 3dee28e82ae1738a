"""The Celery application. Tasks live in each app's tasks.py; beat's schedule is here."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.conf import settings

from portal import broker  # noqa: F401 - registers the embedded broker's URL scheme

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# The cycle has a queue of its own: a worker takes from its queues in turn, so a cycle
# asked for never waits behind a pile of reconciles, syncs or roll-ups in the default one.
CYCLE_QUEUE = "cycle"


def _every(task: str, period_s: float) -> dict[str, Any]:
    """A beat entry that expires after one period: a run the worker could not take in time
    (an outage, a backlog) is dropped rather than run late, so runs never pile up; the next
    one is on its way."""
    return {"task": task, "schedule": period_s, "options": {"expires": period_s}}


@app.on_after_configure.connect
def _beat_schedule(sender: Celery, **_: Any) -> None:
    """Beat's entries, the intervals from the settings (read, and checked, by portal/env.py)
    once the settings are loaded: a bad interval stops beat with the variable's name."""
    sender.conf.beat_schedule.update(
        {
            "clusters-reconcile-all": _every(
                "clusters.tasks.reconcile_all", float(settings.GPUPOOL_RECONCILE_INTERVAL_S)
            ),
            "clusters-sync-inventories": _every("clusters.tasks.sync_all_inventories", 60.0),
            "scheduling-cycle": _every(
                "scheduling.tasks.run_cycle", float(settings.GPUPOOL_CYCLE_INTERVAL_S)
            ),
            "workspaces-cull-idle": _every("workspaces.tasks.cull_idle_workspaces", 60.0),
            "metrics-rollup": _every("metrics.rollup", 60.0),
            "metrics-retention": _every("metrics.retention", 3600.0),
        }
    )
