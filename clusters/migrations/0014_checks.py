"""CHECK constraints on the inventory's numbers (issue 27, bad rows).

Rows that would break a check are fixed first (`fix_rows`), so the migration runs on any
data: a node's or GPU's number is reset to 0, and a GPU whose index is out of range is
removed; the next inventory sync writes both again as the cluster reports them.
"""

import random
from decimal import Decimal

from django.db import migrations, models

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def in_range(model, column, high):
    """As portal.tolerant.in_range made it (from 0) when this migration was written."""
    condition = models.Q(**{f"{column}__gte": 0, f"{column}__lte": high})
    name = f"{model}_{column}_in_range"
    return migrations.AddConstraint(
        model_name=model, constraint=models.CheckConstraint(condition=condition, name=name)
    )


def fix_rows(apps, schema_editor):
    for operation in Migration.operations[1:]:
        model = apps.get_model("clusters", operation.model_name)
        constraint = operation.constraint
        column = constraint.name.split("_", 1)[1].removesuffix("_in_range")
        bad = model.objects.exclude(constraint.condition)
        if column == "index":
            bad.delete()
        else:
            bad.update(**{column: 0}, version=random.getrandbits(62) + 1)
    # PostgreSQL: the rows' deferred foreign-key checks fire now, or it refuses to ALTER
    # the tables in this transaction ("pending trigger events").
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0013_tolerant_reads"),
    ]

    operations = [
        migrations.RunPython(fix_rows, migrations.RunPython.noop),
        in_range("gpu", "index", INT32_MAX),
        in_range("gpu", "memory_mib", INT32_MAX),
        in_range("node", "cpu_cores", Decimal("9999999.99")),
        in_range("node", "memory_mib", INT64_MAX),
        in_range("node", "foreign_gpus", INT32_MAX),
        in_range("node", "foreign_cpu", Decimal("9999999.99")),
        in_range("node", "foreign_memory_mib", INT64_MAX),
    ]
