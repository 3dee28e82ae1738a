"""Test-only Celery tasks, loaded into a real worker with `-I tests.portal.worker_tasks`
(tests/portal/test_worker_heals.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from portal.celery import app


@app.task(name="tests.slow_cycle")
def slow_cycle(flag: str, seconds: float) -> int | None:
    """A scheduling cycle that, the first time, stays inside the engine for `seconds`
    (holding the cycle lock) after writing its pool child's pid to `flag`, for a test to
    kill that child mid-cycle; run again (redelivered), an ordinary cycle."""
    import scheduling.cycle

    real = scheduling.cycle.schedule

    def slow(*args, **kwargs):
        Path(flag).write_text(str(os.getpid()))
        time.sleep(seconds)
        return real(*args, **kwargs)

    if not Path(flag).exists():
        scheduling.cycle.schedule = slow
    try:
        run = scheduling.cycle.cycle_run()
    finally:
        scheduling.cycle.schedule = real
    return run.pk if run else None


@app.task(name="tests.mark")
def mark(path: str) -> None:
    """Leave a file behind: the task ran."""
    Path(path).write_text(str(os.getpid()))


@app.task(name="tests.slow_reconcile")
def slow_reconcile(flag: str, seconds: float) -> int:
    """A reconcile of a simulated cluster (made the first time) that, the first time, stays
    inside the pass for `seconds` (holding the cluster's lease) after writing its pool
    child's pid to `flag`, for a test to kill that child mid-pass; run again (redelivered),
    an ordinary one. Returns the cluster's id."""
    from clusters import tasks
    from clusters.backends.simulated import description_parse
    from clusters.models import Backend, Cluster

    description = description_parse("nodes: [{name: n0, gpus: 1}]")
    cluster, _ = Cluster.objects.get_or_create(
        name="heals", defaults={"backend": Backend.SIMULATED, "config": description}
    )
    real = tasks.cluster_reconcile

    def slow(*args, **kwargs):
        Path(flag).write_text(str(os.getpid()))
        time.sleep(seconds)
        return real(*args, **kwargs)

    if not Path(flag).exists():
        tasks.cluster_reconcile = slow
    try:
        tasks.reconcile_cluster(cluster.pk)
    finally:
        tasks.cluster_reconcile = real
    return cluster.pk
