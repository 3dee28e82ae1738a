"""The migrations that add the database's checks (scheduling 0016, clusters 0014) run on any
data (issue 27, bad rows): rows that would break a check are fixed first, the workload
failed naming the column; an allocation whose pod_index cannot be fixed stops the migration
naming it. Run back to before the checks, planted, and forward again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from clusters.models import Gpu, Node
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload, WorkloadState

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("scheduling", "0015_tolerant_reads"), ("clusters", "0013_tolerant_reads")]


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def raw(table: str, pk: int, **columns) -> None:
    sets = ", ".join(f'"{name}" = %s' for name in columns)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {sets} WHERE id = %s", [*columns.values(), pk])


@pytest.fixture
def before_the_checks(org, cluster, submit):
    """An admitted workload and a pending one, then the schema as it was before the checks
    (the schema is always brought back to the latest)."""
    running = submit(org.researcher, org.project_a, "running", gpus=1)
    assert cycle_run().ok
    pending = submit(org.researcher, org.project_a, "pending", gpus=1)
    migrate(BEFORE)
    try:
        yield running, pending
    finally:
        migrate(latest())


def test_rows_that_would_break_a_check_are_fixed_and_their_workload_failed(before_the_checks):
    running, pending = before_the_checks
    alloc = PodAllocation.objects.get(workload=running)
    # By id: the Node model (the latest) names columns later migrations add (mps_report).
    gpu = Gpu.objects.get(node_id=alloc.node_id, index=3)
    sqlite = connection.vendor == "sqlite"
    raw("scheduling_workload", pending.pk, cpu="abc" if sqlite else -1)
    raw("scheduling_workload", pending.pk, kind="bogus", min_pods=5)
    raw("scheduling_podallocation", alloc.pk, gpu_share="1.5", shared_gpu_index=-2)
    raw("clusters_node", alloc.node_id, foreign_cpu=-4)
    if sqlite:  # a negative index: Django's own check (>= 0) has always refused it
        raw("clusters_gpu", gpu.pk, index="abc")

    migrate(latest())

    pending = Workload.objects.get(pk=pending.pk)
    assert (pending.state, pending.cpu, pending.kind, pending.min_pods) == (
        WorkloadState.FAILED,
        0,
        "training",
        1,
    )
    assert "held a value outside its range" in pending.message, pending.message
    running = Workload.objects.get(pk=running.pk)
    assert running.state == WorkloadState.FAILED
    assert "gpu_share" in running.message or "shared_gpu_index" in running.message
    alloc = PodAllocation.objects.get(pk=alloc.pk)
    assert (alloc.gpu_share, alloc.shared_gpu_index) == (None, None)
    assert Node.objects.get(pk=alloc.node_id).foreign_cpu == 0
    assert Gpu.objects.filter(pk=gpu.pk).exists() is not sqlite


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="a text: PostgreSQL's integer column refuses it"
)
def test_an_allocation_with_no_pod_index_stops_the_migration_naming_it(before_the_checks):
    running, _ = before_the_checks
    alloc = PodAllocation.objects.get(workload=running)
    raw("scheduling_podallocation", alloc.pk, pod_index="abc")

    with pytest.raises(RuntimeError, match=rf"PodAllocation rows \[{alloc.pk}\]"):
        migrate(latest())

    # Deleted as the old schema has it: the ORM's models (and its post_delete receivers)
    # are the latest, which name columns later migrations add (Workload.pids_max).
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM scheduling_podallocation WHERE id = %s", [alloc.pk])
