"""When cycles run: on beat, and soon after a submit, stop or finish, a burst sharing one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache

from portal.celery import app as celery_app
from scheduling import tasks
from scheduling.lifecycle import workload_pods_released
from scheduling.locks import cycle_lock
from scheduling.models import CycleRun
from scheduling.services import workload_stop

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(settings, monkeypatch):
    """The countdowns of the cycles queued on the broker, as a worker setup would queue them
    (not eager), with a cache of this test's own for the debounce key."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "cycle-requests",
        }
    }
    cache.clear()  # a LocMemCache's contents outlive the test that filled them
    monkeypatch.setattr(tasks, "celery_app", SimpleNamespace(conf=SimpleNamespace()))
    tasks.celery_app.conf.task_always_eager = False
    countdowns: list[float] = []
    monkeypatch.setattr(
        tasks.run_cycle, "apply_async", lambda *a, countdown=None, **k: countdowns.append(countdown)
    )
    return countdowns


def test_a_burst_of_submits_shares_one_cycle_soon(
    org, cluster, submit, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        submit(org.researcher, org.project_a, "one", gpus=1)
    with django_capture_on_commit_callbacks(execute=True):
        submit(org.researcher, org.project_a, "two", gpus=1)
        submit(org.researcher, org.project_a, "three", gpus=1)
    assert queued == [tasks.DEBOUNCE_S]


def test_stop_and_finish_each_ask_for_a_cycle_after_the_last_one_ran(
    org, cluster, submit, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(org.researcher, org.project_a, "job", gpus=1)
    tasks.run_cycle()  # the queued cycle runs, and takes the request back
    with django_capture_on_commit_callbacks(execute=True):
        workload_stop(actor=org.researcher, workload=job)
    assert queued == [tasks.DEBOUNCE_S, tasks.DEBOUNCE_S]
    tasks.run_cycle()
    with django_capture_on_commit_callbacks(execute=True):
        workload_pods_released(job)  # the cluster confirms its pods are gone: GPUs free
    assert queued == [tasks.DEBOUNCE_S] * 3


def test_a_cycle_that_finds_another_running_tries_again_soon(org, cluster, queued):
    runs = CycleRun.objects.count()
    with cycle_lock() as held:
        assert held
        assert tasks.run_cycle() is None
        assert queued == [tasks.DEBOUNCE_S]
        tasks.request_cycle()  # a submit meanwhile shares the retry
        assert queued == [tasks.DEBOUNCE_S]
        assert tasks.run_cycle() is None  # the retry, while the lock is still held
        assert queued == [tasks.DEBOUNCE_S] * 2
    assert CycleRun.objects.count() == runs


def test_beat_runs_the_cycle_every_interval():
    entry = celery_app.conf.beat_schedule["scheduling-cycle"]
    assert entry["task"] == tasks.run_cycle.name == "scheduling.tasks.run_cycle"
    assert entry["schedule"] == django_settings.GPUPOOL_CYCLE_INTERVAL_S
