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


@app.on_after_configure.connect
def _beat_schedule(sender: Celery, **_: Any) -> None:
    """Beat's entries, the intervals from the settings (read, and checked, by portal/env.py)
    once the settings are loaded: a bad interval stops beat with the variable's name."""
    sender.conf.beat_schedule.update(
        {
            "clusters-reconcile-all": {
                "task": "clusters.tasks.reconcile_all",
                "schedule": float(settings.GPUPOOL_RECONCILE_INTERVAL_S),
            },
            "clusters-sync-inventories": {
                "task": "clusters.tasks.sync_all_inventories",
                "schedule": 60.0,
            },
            "scheduling-cycle": {
                "task": "scheduling.tasks.run_cycle",
                "schedule": float(settings.GPUPOOL_CYCLE_INTERVAL_S),
            },
            "workspaces-cull-idle": {
                "task": "workspaces.tasks.cull_idle_workspaces",
                "schedule": 60.0,
            },
            "metrics-rollup": {"task": "metrics.rollup", "schedule": 60.0},
            "metrics-retention": {"task": "metrics.retention", "schedule": 3600.0},
        }
    )
