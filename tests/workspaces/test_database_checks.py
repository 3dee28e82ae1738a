"""The database refuses what no environment, template or idle policy may hold (issue 27, bad
rows: workspaces 0005), on SQLite and PostgreSQL; the migration that adds the checks first
resets the rows that would break one. Run back to before the checks, planted, and forward."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from tests.scheduling.test_database_checks_migration import latest, migrate, raw
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate

pytestmark = pytest.mark.django_db(transaction=True)

# table -> column -> a value out of range that the column's type still takes on both databases
OUT_OF_RANGE = {
    "workspaces_environment": {"port": 70000, "default_cpu": "-1", "default_gpus": "-0.5"},
    "workspaces_workspacetemplate": {"gpus": "-1", "cpu": "-0.01"},
    "workspaces_idlepolicy": {"gpu_util_threshold_pct": 101},
}
CASES = [(t, c, v) for t, columns in OUT_OF_RANGE.items() for c, v in columns.items()]


@pytest.fixture
def rows(org):
    lab = Environment.objects.create(name="Lab", image="lab", command=["jupyter", "lab"])
    template = WorkspaceTemplate.objects.create(project=org.project_a, name="t", environment=lab)
    policy = IdlePolicy.objects.create(project=org.project_a, warn_after_min=10, stop_after_min=30)
    return {
        "workspaces_environment": lab,
        "workspaces_workspacetemplate": template,
        "workspaces_idlepolicy": policy,
    }


@pytest.mark.parametrize(("table", "column", "value"), CASES)
def test_the_database_refuses_a_number_out_of_range(rows, table, column, value):
    with pytest.raises(IntegrityError), transaction.atomic():
        raw(table, rows[table].pk, **{column: value})


def test_rows_that_would_break_a_check_are_reset_by_the_migration(rows):
    sqlite = connection.vendor == "sqlite"
    migrate([("workspaces", "0004_tolerant_reads")])
    try:
        raw("workspaces_environment", rows["workspaces_environment"].pk, port=70000)
        raw("workspaces_workspacetemplate", rows["workspaces_workspacetemplate"].pk, cpu="-1")
        stop = "abc" if sqlite else 30  # a text: SQLite's; the threshold: both
        raw("workspaces_idlepolicy", rows["workspaces_idlepolicy"].pk, stop_after_min=stop)
        raw("workspaces_idlepolicy", rows["workspaces_idlepolicy"].pk, gpu_util_threshold_pct=900)
    finally:
        migrate(latest())

    assert Environment.objects.get().port == 8888
    assert WorkspaceTemplate.objects.get().cpu == 1
    policy = IdlePolicy.objects.get()
    expected = (60, 120) if sqlite else (10, 30)
    assert (policy.warn_after_min, policy.stop_after_min) == expected
    assert policy.gpu_util_threshold_pct == 5
