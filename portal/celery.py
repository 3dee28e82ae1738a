"""The Celery application. Tasks live in each app's tasks.py; beat's schedule is here."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule["clusters-reconcile-all"] = {"task": "clusters.tasks.reconcile_all", "schedule": float(os.environ.get("GPUPOOL_RECONCILE_INTERVAL_S", "5"))}  # noqa: E501
app.conf.beat_schedule["clusters-sync-inventories"] = {"task": "clusters.tasks.sync_all_inventories", "schedule": 60.0}  # noqa: E501
app.conf.beat_schedule["scheduling-cycle"] = {"task": "scheduling.tasks.run_cycle", "schedule": float(os.environ.get("GPUPOOL_CYCLE_INTERVAL_S", "10"))}  # noqa: E501
app.conf.beat_schedule["workspaces-cull-idle"] = {"task": "workspaces.tasks.cull_idle_workspaces", "schedule": 60.0}  # noqa: E501
app.conf.beat_schedule["metrics-rollup"] = {"task": "metrics.rollup", "schedule": 60.0}
app.conf.beat_schedule["metrics-retention"] = {"task": "metrics.retention", "schedule": 3600.0}
