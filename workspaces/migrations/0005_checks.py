"""CHECK constraints on the workspaces app's numbers (issue 27, bad rows): an environment's
port and defaults, a template's request, an idle policy's minutes and threshold.

Rows that would break a check are fixed first (`fix_rows`), so the migration runs on any
data: the column is reset to its default (an environment's port to 8888, a template's GPUs
to 0...); an idle policy with either time out of range gets both defaults back (60 and 120
minutes: one alone could break its warn-before-stop check). The admin's pages show them.
"""

from decimal import Decimal

from django.db import migrations, models

INT32_MAX = 2**31 - 1
GPUS_MAX, CPU_MAX = Decimal("999.999"), Decimal("99999.99")
MODELS = {
    "environment": "environment",
    "template": "workspacetemplate",
    "idle_policy": "idlepolicy",
}
RESET = {
    "environment": {"port": 8888, "default_gpus": 0, "default_cpu": 1, "default_memory_mib": 4096},
    "template": {"gpus": 0, "cpu": 1, "gpu_memory_mib": 0, "memory_mib": 4096},
    "idle_policy": {"gpu_util_threshold_pct": 5},
}
IDLE_TIMES = {"warn_after_min": 60, "stop_after_min": 120}


def in_range(table, column, low, high):
    """As portal.tolerant.in_range made it when this migration was written."""
    condition = models.Q(**{f"{column}__gte": low, f"{column}__lte": high})
    return migrations.AddConstraint(
        model_name=MODELS[table],
        constraint=models.CheckConstraint(condition=condition, name=f"{table}_{column}_in_range"),
    )


def fix_rows(apps, schema_editor):
    for operation in Migration.operations[1:]:
        model = apps.get_model("workspaces", operation.model_name)
        table, column = next(
            (t, c) for t in RESET for c in (*RESET[t], *IDLE_TIMES)
            if operation.constraint.name == f"{t}_{c}_in_range"
        )  # fmt: skip
        reset = IDLE_TIMES if column in IDLE_TIMES else {column: RESET[table][column]}
        model.objects.exclude(operation.constraint.condition).update(**reset)


class Migration(migrations.Migration):
    dependencies = [
        ("workspaces", "0004_tolerant_reads"),
    ]

    operations = [
        migrations.RunPython(fix_rows, migrations.RunPython.noop),
        in_range("environment", "port", 1, 65535),
        in_range("environment", "default_gpus", 0, GPUS_MAX),
        in_range("environment", "default_cpu", 0, CPU_MAX),
        in_range("environment", "default_memory_mib", 0, INT32_MAX),
        in_range("idle_policy", "warn_after_min", 0, INT32_MAX),
        in_range("idle_policy", "stop_after_min", 0, INT32_MAX),
        in_range("idle_policy", "gpu_util_threshold_pct", 0, 100),
        in_range("template", "gpus", 0, GPUS_MAX),
        in_range("template", "cpu", 0, CPU_MAX),
        in_range("template", "gpu_memory_mib", 0, INT32_MAX),
        in_range("template", "memory_mib", 0, INT32_MAX),
    ]
