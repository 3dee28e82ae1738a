"""Celery entry points of the metrics app (scheduled by beat in portal/celery.py)."""

from __future__ import annotations

import logging

from celery import shared_task

from clusters.metrics.hourly import rollup_hours
from clusters.metrics.retention import metrics_retention
from clusters.metrics.rollup import rollup_minutes

log = logging.getLogger(__name__)


@shared_task(name="metrics.rollup")
def rollup() -> dict[str, int]:
    """Minutes then hours; both are idempotent and single-flight (they lock their watermark)."""
    done = {"minutes": rollup_minutes(), "hours": rollup_hours()}
    if done["minutes"] or done["hours"]:
        log.info("metrics roll-up: %(minutes)d minutes, %(hours)d hours", done)
    return done


@shared_task(name="metrics.retention")
def retention() -> dict[str, int]:
    deleted = metrics_retention()
    log.info("metrics retention deleted %s", deleted)
    return deleted
