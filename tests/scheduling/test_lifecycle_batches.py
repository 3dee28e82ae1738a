"""Transitions in a batch (scheduling.lifecycle.workloads_transition, which the cycle's
admissions and evictions and the reconcile's releases and state moves go through): one
UPDATE per distinct set of values, each row written with its own values and a new
version, and an event per workload."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.lifecycle import workloads_transition
from scheduling.models import Workload, WorkloadState
from tests.clusters.conftest import make_workload

S = WorkloadState
pytestmark = pytest.mark.django_db


def requeue(org, restart_counts: list[int]) -> tuple[list[Workload], list[str]]:
    """Preempted workloads with these restart counts, moved back to Pending with each its
    count + 1 in one batch; the UPDATE statements on workloads it issued."""
    workloads = [
        make_workload(org.project_a, org.researcher, f"w{n}", state=S.PREEMPTED, restart_count=c)
        for n, c in enumerate(restart_counts)
    ]
    before = {w.pk: w.version for w in workloads}
    moves = [(w, f"requeued {w.pk}", {"restart_count": w.restart_count + 1}) for w in workloads]
    with CaptureQueriesContext(connection) as queries:
        workloads_transition(moves, S.PENDING, reason="Requeued")
    for workload in workloads:
        row = Workload.objects.get(pk=workload.pk)
        assert (row.state, row.restart_count) == (S.PENDING, workload.restart_count)
        assert row.version == workload.version != before[workload.pk]
        event = row.events.get()
        assert (event.type, event.reason, event.message) == (
            S.PENDING, "Requeued", f"requeued {workload.pk}"
        )  # fmt: skip
    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "scheduling_wo')
    ]
    return workloads, updates


def test_a_batch_writes_each_workload_its_own_values_in_a_statement_per_distinct_set(org):
    workloads, updates = requeue(org, [n % 2 for n in range(20)])
    assert [w.restart_count for w in workloads] == [n % 2 + 1 for n in range(20)]
    assert len(updates) == 2 and not any("CASE" in sql for sql in updates)


def test_a_batch_whose_values_mostly_differ_is_written_row_by_row_in_one_statement(org):
    workloads, updates = requeue(org, [0, 1, 2, 3, 4])
    assert [w.restart_count for w in workloads] == [1, 2, 3, 4, 5]
    assert len(updates) == 1 and "CASE" in updates[0]
