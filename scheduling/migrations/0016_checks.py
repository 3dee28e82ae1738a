"""CHECK constraints on the numbers and choices the cycle, reconcile and pages read (issue 27).

Rows that would break a check are fixed first (`fix_rows`), so the migration runs on any
data: the column is reset (a count to its lowest value, a nullable one to NULL, a choice to
its default) and the workload is failed with a message naming the column, as the cycle
quarantines one. An allocation whose pod_index is out of range cannot be fixed (the index
names its pod in the cluster): the migration stops naming the rows, to be removed by hand.
"""

import random
from decimal import Decimal

from django.conf import settings
from django.db import migrations, models

# A violating column's value after the fix; a nullable one not named here becomes NULL.
RESET = {
    "gpus": 0,
    "cpu": 0,
    "pods": 1,
    "min_pods": 1,
    "memory_mib": 0,
    "gpu_memory_mib": 0,
    "priority": 0,
    "restart_count": 0,
    "state": "failed",
    "kind": "training",
    "gpu_request": "whole",
    "priority_class": "train",
}


INT32_MAX = 2**31 - 1


def in_range(model, table, column, low, high, *, null=False):
    """As portal.tolerant.in_range made it when this migration was written."""
    condition = models.Q(**{f"{column}__gte": low, f"{column}__lte": high})
    if null:
        condition |= models.Q(**{f"{column}__isnull": True})
    name = f"{table}_{column}_in_range"
    return migrations.AddConstraint(
        model_name=model, constraint=models.CheckConstraint(condition=condition, name=name)
    )


def one_of(column, values):
    condition = models.Q(**{f"{column}__in": values})
    name = f"workload_{column}_is_a_choice"
    return migrations.AddConstraint(
        model_name="workload", constraint=models.CheckConstraint(condition=condition, name=name)
    )


def fix_rows(apps, schema_editor):
    workload_model = apps.get_model("scheduling", "Workload")
    failed = {}
    for operation in Migration.operations[1:]:
        model = apps.get_model("scheduling", operation.model_name)
        constraint = operation.constraint
        column = constraint.name.split("_", 1)[1].removesuffix("_in_range")
        column = column.removesuffix("_is_a_choice")
        bad = model.objects.exclude(constraint.condition)
        ids = list(bad.values_list("pk", flat=True))
        if not ids:
            continue
        if column == "pod_index":
            raise RuntimeError(f"scheduling 0016: PodAllocation rows {ids} have no pod_index")
        owners = ids if model is workload_model else bad.values_list("workload_id", flat=True)
        failed.update(dict.fromkeys(owners, column))
        bad.update(**{column: RESET.get(column)}, version=random.getrandbits(62) + 1)
    for pk, column in failed.items():
        workload_model.objects.filter(pk=pk).update(
            state="failed",
            message=f"Failed when the database gained its checks: {column} held a value "
            "outside its range. Submit it again with valid values.",
            version=random.getrandbits(62) + 1,
        )
    # PostgreSQL: the rows' deferred foreign-key checks fire now, or it refuses to ALTER
    # the tables in this transaction ("pending trigger events").
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0014_checks"),
        ("portal", "0008_project_enforce_scheduler"),
        ("scheduling", "0015_tolerant_reads"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(fix_rows, migrations.RunPython.noop),
        *(
            in_range("podallocation", "allocation", column, low, high, null=null)
            for column, low, high, null in (
                ("pod_index", 0, INT32_MAX, False),
                ("shared_gpu_index", 0, INT32_MAX, True),
                ("gpu_share", 0, 1, True),
                ("gpu_memory_mib", 0, INT32_MAX, False),
                ("mig_gpu_index", 0, INT32_MAX, True),
                ("mig_start", 0, 32767, True),
            )
        ),
        in_range("workload", "workload", "gpus", 0, Decimal("999.999")),
        in_range("workload", "workload", "cpu", 0, Decimal("99999.99")),
        in_range("workload", "workload", "pods", 1, INT32_MAX),
        migrations.AddConstraint(
            model_name="workload",
            constraint=models.CheckConstraint(
                condition=models.Q(("min_pods__gte", 1), ("min_pods__lte", models.F("pods"))),
                name="workload_min_pods_in_range",
            ),
        ),
        *(
            in_range("workload", "workload", column, low, high, null=null)
            for column, low, high, null in (
                ("memory_mib", 0, INT32_MAX, False),
                ("gpu_memory_mib", 0, INT32_MAX, False),
                ("min_gpus", 1, 32767, True),
                ("priority", -INT32_MAX - 1, INT32_MAX, False),
                ("max_runtime_s", 0, INT32_MAX, True),
                ("checkpoint_interval_s", 0, INT32_MAX, True),
                ("restart_count", 0, INT32_MAX, False),
                ("exit_code", -INT32_MAX - 1, INT32_MAX, True),
            )
        ),
        one_of(
            "state",
            ["pending", "admitted", "running", "succeeded", "failed", "stopped", "preempted"],
        ),
        one_of("kind", ["workspace", "training", "distributed", "hpo", "inference"]),
        one_of("gpu_request", ["whole", "fraction", "memory", "mig"]),
        one_of("priority_class", ["build", "train", "inference"]),
    ]
