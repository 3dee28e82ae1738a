"""Celery entry points of scheduling: the cycle (on beat, and soon after changes)."""

from __future__ import annotations

from celery import shared_task
from django.core.cache import cache

from portal.celery import app as celery_app
from portal.queueing import enqueue
from scheduling.cycle import cycle_run

DEBOUNCE_KEY = "gpupool:scheduling-cycle-requested"
# A burst of submits within this window shares one cycle.
DEBOUNCE_S = 1.0
# If the worker never runs the queued cycle, a later request may queue another.
DEBOUNCE_EXPIRY_S = 30


@shared_task(name="scheduling.tasks.run_cycle", ignore_result=True)
def run_cycle() -> int | None:
    """Run one scheduling cycle; the CycleRun id, or None when another cycle holds the lock."""
    # Cleared before the cycle reads the database, so a change made while it runs
    # requests a fresh cycle instead of being folded into this one.
    cache.delete(DEBOUNCE_KEY)
    run = cycle_run()
    if run is None:
        # The running cycle read its snapshot before the change that asked for this one:
        # try again soon rather than leave that change waiting for the next beat.
        _queue_cycle()
    return run.pk if run else None


def request_cycle() -> None:
    """Ask for a cycle soon. Calls within DEBOUNCE_S of each other share one cycle."""
    if celery_app.conf.task_always_eager:
        # In-process (unit tests): run now; there is nothing to debounce against.
        run_cycle.delay()
        return
    _queue_cycle()


def _queue_cycle() -> None:
    if celery_app.conf.task_always_eager:
        return  # in-process: the caller runs cycles itself
    enqueue(_debounced_cycle, "a scheduling cycle")


def _debounced_cycle() -> None:
    if cache.add(DEBOUNCE_KEY, 1, timeout=DEBOUNCE_EXPIRY_S):
        run_cycle.apply_async(countdown=DEBOUNCE_S)


def on_cycle_wanted(sender: object, **kwargs: object) -> None:
    """scheduling.signals.cycle_wanted's receiver (connected in scheduling/apps.py)."""
    request_cycle()
