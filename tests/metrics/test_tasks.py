from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusters.metrics import tasks
from clusters.metrics.models import GpuSample, RollupMark, WorkloadUsage
from clusters.metrics.services import samples_ingest
from portal.celery import app
from tests.metrics.helpers import allocate, every, make_node, make_workload, sample

pytestmark = pytest.mark.django_db


def test_beat_runs_the_rollup_every_minute_and_retention_hourly():
    schedule = app.conf.beat_schedule
    assert schedule["metrics-rollup"] == {
        "task": "metrics.rollup",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    }
    assert schedule["metrics-retention"] == {
        "task": "metrics.retention",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    }
    assert {"metrics.rollup", "metrics.retention"} <= set(app.tasks)


def test_the_rollup_task_rolls_up_recent_minutes_of_a_running_workload(org, settings):
    settings.GPUPOOL_METRICS_ROLLUP_LAG_S = 0
    now = timezone.now()
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher)
    allocate(work, node, [0], at=now - dt.timedelta(minutes=4))
    samples_ingest([sample(node, 0, ts, 25.0) for ts in every(now - dt.timedelta(minutes=4), now)])

    # apply() runs the task in-process through Celery's machinery (the conftest's eager switch
    # does not reach this app's namespaced configuration, so delay() would wait for a worker).
    done = tasks.rollup.apply().get()

    assert done["minutes"] >= 4
    assert RollupMark.objects.get(name="minute").done_until > now - dt.timedelta(minutes=1)
    rows = WorkloadUsage.objects.filter(workload_id=work.pk)
    assert sum(r.used_s for r in rows) == pytest.approx(0.25 * sum(r.allocated_s for r in rows))
    assert tasks.rollup.apply().get()["minutes"] == 0  # nothing new: nothing to do


def test_the_retention_task_drops_old_samples(org, settings):
    settings.GPUPOOL_METRICS_RAW_DAYS = 7
    node = make_node(org.pool)
    samples_ingest([sample(node, 0, timezone.now() - dt.timedelta(days=9), 5.0)])
    assert tasks.retention.apply().get()["samples"] == 1
    assert not GpuSample.objects.exists()
