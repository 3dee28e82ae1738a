"""The database itself refuses what no row may hold (issue 27, bad rows): CHECK constraints
on the numbers and choices the cycle, reconcile and pages read (scheduling 0016, clusters
0014). A raw UPDATE or INSERT that breaks one is refused by SQLite and by PostgreSQL; on
SQLite a text in a number is refused too (it compares above every upper bound)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from clusters.models import Gpu, Node
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload

pytestmark = pytest.mark.django_db(transaction=True)

# column -> a value out of its range that the column's type still takes on both databases
WORKLOAD = {
    "gpus": "-1",
    "cpu": "-0.01",
    "pods": 0,
    "min_pods": 2,  # more than pods (1)
    "memory_mib": -1,
    "gpu_memory_mib": -1,
    "min_gpus": 0,
    "max_runtime_s": -1,
    "checkpoint_interval_s": -1,
    "restart_count": -1,
    "pids_max": 8,  # bounds.PIDS_MAX: 16 at least
    "state": "bogus",
    "kind": "bogus",
    "gpu_request": "bogus",
    "priority_class": "bogus",
}
ALLOCATION = {
    "pod_index": -1,
    "shared_gpu_index": -1,
    "gpu_share": "1.5",
    "gpu_memory_mib": -1,
    "mig_gpu_index": -1,
    "mig_start": -1,
}
NODE = {
    "cpu_cores": "-1",
    "memory_mib": -1,
    "foreign_gpus": -1,
    "foreign_cpu": "-1",
    "foreign_memory_mib": -1,
}
GPU = {"index": -1, "memory_mib": -1}
NUMBERS_ONLY_TEXT_BREAKS = ["priority", "exit_code"]  # any integer is in range


@pytest.fixture
def rows(org, cluster, submit):
    """One row of each table: an admitted workload, its allocation, node, GPU."""
    workload = submit(org.researcher, org.project_a, "checked", gpus=1)
    assert cycle_run().ok
    alloc = PodAllocation.objects.filter(workload=workload).first()
    return {
        Workload: workload,
        PodAllocation: alloc,
        Node: alloc.node,
        Gpu: Gpu.objects.get(node=alloc.node, index=alloc.gpu_indices[0]),
    }


def update(row, column: str, value) -> None:
    table = row._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'UPDATE {table} SET "{column}" = %s WHERE id = %s', [value, row.pk])


CASES = [
    (model, column, value)
    for model, columns in ((Workload, WORKLOAD), (PodAllocation, ALLOCATION), (Node, NODE))
    for column, value in columns.items()
] + [(Gpu, column, value) for column, value in GPU.items()]


@pytest.mark.parametrize(
    ("model", "column", "value"), CASES, ids=[f"{m.__name__}.{c}" for m, c, _ in CASES]
)
def test_an_update_out_of_range_is_refused(rows, model, column, value):
    stored = model.objects.filter(pk=rows[model].pk).values_list(column, flat=True)
    before = stored.get()
    with pytest.raises(IntegrityError, match=r"(?i)check"):
        update(rows[model], column, value)
    assert stored.get() == before


TEXT_CASES = (
    [
        (model, column)
        for model, columns in ((Workload, WORKLOAD), (PodAllocation, ALLOCATION), (Node, NODE))
        for column in columns
        if not isinstance(columns[column], str)
        or columns[column].lstrip("-").replace(".", "").isdigit()
    ]
    + [(Gpu, column) for column in GPU]
    + [(Workload, column) for column in NUMBERS_ONLY_TEXT_BREAKS]
)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses a text by type")
@pytest.mark.parametrize(
    ("model", "column"), TEXT_CASES, ids=[f"{m.__name__}.{c}" for m, c in TEXT_CASES]
)
def test_a_text_in_a_number_is_refused_on_sqlite(rows, model, column):
    for text in ("abc", "NaN"):
        with pytest.raises(IntegrityError, match=r"(?i)check"):
            update(rows[model], column, text)


def insert_copy(workload: Workload, name: str, **columns) -> None:
    """INSERT a copy of the workload's row under another name, with `columns` changed."""
    table = Workload._meta.db_table
    names = [f.column for f in Workload._meta.concrete_fields if f.column != "id"]
    values = {"name": name, **columns}
    select = ", ".join("%s" if n in values else f'"{n}"' for n in names)
    params = [values[n] for n in names if n in values]
    quoted = ", ".join(f'"{n}"' for n in names)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({quoted}) SELECT {select} FROM {table} WHERE id = %s",
            [*params, workload.pk],
        )


@pytest.mark.parametrize("column", list(WORKLOAD))
def test_an_insert_out_of_range_is_refused_and_a_valid_one_is_not(rows, column):
    workload = rows[Workload]
    with pytest.raises(IntegrityError, match=r"(?i)check"):
        insert_copy(workload, "out-of-range", **{column: WORKLOAD[column]})
    insert_copy(workload, "in-range")  # the same INSERT with the row's own values
    assert Workload.objects.filter(name__in=["out-of-range", "in-range"]).count() == 1
