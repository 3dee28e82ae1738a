"""Metrics settings: Django settings win (tests override them), else the environment."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from portal.env import env_float, env_int

DEFAULTS: dict[str, Any] = {
    # Raw samples feed the minute roll-up and the live charts; keep them about a week.
    "GPUPOOL_METRICS_RAW_DAYS": lambda: env_int("GPUPOOL_METRICS_RAW_DAYS", 7, minimum=1),
    "GPUPOOL_METRICS_MINUTE_DAYS": lambda: env_int("GPUPOOL_METRICS_MINUTE_DAYS", 35, minimum=1),
    "GPUPOOL_METRICS_HOUR_DAYS": lambda: env_int("GPUPOOL_METRICS_HOUR_DAYS", 800, minimum=1),
    # A GPU at or below this utilisation counts as doing nothing.
    "GPUPOOL_METRICS_IDLE_PCT": lambda: env_float("GPUPOOL_METRICS_IDLE_PCT", 1.0, minimum=0),
    "GPUPOOL_METRICS_IDLE_MINUTES": lambda: env_int("GPUPOOL_METRICS_IDLE_MINUTES", 5, minimum=1),
    # Minutes are rolled up this long after they end, so in-flight batches are included.
    "GPUPOOL_METRICS_ROLLUP_LAG_S": lambda: env_int("GPUPOOL_METRICS_ROLLUP_LAG_S", 60, minimum=0),
    # The most minutes one roll-up run processes; beat's next run continues.
    "GPUPOOL_METRICS_ROLLUP_MAX_MINUTES": lambda: env_int(
        "GPUPOOL_METRICS_ROLLUP_MAX_MINUTES", 360, minimum=1
    ),
}


def raw_horizon(now: dt.datetime) -> dt.datetime:
    """The oldest instant whose raw samples are kept (GPUPOOL_METRICS_RAW_DAYS before now)."""
    return now - dt.timedelta(days=get("GPUPOOL_METRICS_RAW_DAYS"))


def get(name: str) -> Any:
    if hasattr(settings, name):
        return getattr(settings, name)
    return DEFAULTS[name]()
