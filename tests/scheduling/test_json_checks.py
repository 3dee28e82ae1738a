"""The database refuses a JSON column of the wrong type at its top (issue 27, bad rows): a
cluster's config that is no object, topology_labels or data_volume_roots that are no array,
a pod's port addresses that are no object (clusters 0015, scheduling 0017; json_type on
SQLite, jsonb_typeof on PostgreSQL). The migrations that add the checks first fix rows that
would break them. Run back to before the checks, planted, and forward again."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from clusters.models import Cluster
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, WorkloadState
from tests.scheduling.test_database_checks_migration import latest, migrate, raw

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("scheduling", "0016_checks"), ("clusters", "0014_checks")]
# table -> column -> values of the wrong JSON type (as JSON text)
WRONG = {
    "clusters_cluster": {
        "config": ['["a"]', '"text"', "7", "null"],
        "topology_labels": ['{"rack": "r"}', '"rack"'],
        "data_volume_roots": ['{"a": "/data"}'],
    },
    "scheduling_podallocation": {"ports": ['["127.0.0.1:1"]', '"127.0.0.1:1"', "null"]},
}
CASES = [(table, column, value) for table, cols in WRONG.items() for column, values in cols.items()
         for value in values]  # fmt: skip


@pytest.fixture
def rows(org, cluster, submit):
    """An admitted workload: its allocation and its node's cluster."""
    workload = submit(org.researcher, org.project_a, "checked", gpus=1)
    assert cycle_run().ok
    alloc = PodAllocation.objects.get(workload=workload)
    return {"clusters_cluster": alloc.node.cluster_id, "scheduling_podallocation": alloc.pk}


@pytest.mark.parametrize(("table", "column", "value"), CASES)
def test_the_database_refuses_a_json_column_of_the_wrong_type(rows, table, column, value):
    with pytest.raises(IntegrityError), transaction.atomic():
        raw(table, rows[table], **{column: value})


def test_rows_that_would_break_a_json_check_are_fixed_by_the_migration(rows):
    cluster = Cluster.objects.get(pk=rows["clusters_cluster"])
    alloc = PodAllocation.objects.get(pk=rows["scheduling_podallocation"])
    migrate(BEFORE)
    try:
        raw("clusters_cluster", cluster.pk, config='["a"]', topology_labels='{"r": 1}')
        raw("clusters_cluster", cluster.pk, data_volume_roots='"/data"')
        raw("scheduling_podallocation", alloc.pk, ports='["127.0.0.1:1"]')
    finally:
        migrate(latest())

    cluster.refresh_from_db()
    assert (cluster.config, cluster.topology_labels, cluster.data_volume_roots) == ({}, [], [])
    alloc.refresh_from_db()
    assert alloc.ports == {}
    assert alloc.workload.state == WorkloadState.ADMITTED  # the backend reports them again
