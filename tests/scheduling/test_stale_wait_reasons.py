"""Scheduling 0020: admitted and running workloads lose the queue's reason that an older
release left on them (a sweep kept it when its trials started), since that field now says
what their pods wait for; pending workloads keep theirs."""

from __future__ import annotations

import pytest

from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from scheduling.selectors import workload_why
from tests.scheduling.test_database_checks_migration import latest, migrate, raw

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_migration_clears_the_queues_reason_left_on_running_work(org, cluster, submit):
    search = {"method": "grid", "parameters": {"lr": [1]}, "parallelism": 1}
    sweep = submit(org.researcher, org.project_a, "sweep", kind="hpo", gpus=1, search=search)
    assert cycle_run().ok
    waiting = submit(org.researcher, org.project_a, "waiting", gpus=4)  # no cycle since
    assert Workload.objects.get(pk=sweep.pk).state == WorkloadState.RUNNING
    migrate([("scheduling", "0019_cyclerun_admitted_at_release")])
    try:
        raw("scheduling_workload", sweep.pk, pending_reason="sweep sweep waits for a GPU")
        raw("scheduling_workload", waiting.pk, pending_reason="needs 4 GPUs")
    finally:
        migrate(latest())
    sweep = Workload.objects.get(pk=sweep.pk)
    assert (sweep.pending_reason, workload_why(sweep)) == ("", "")
    assert Workload.objects.get(pk=waiting.pk).pending_reason == "needs 4 GPUs"
