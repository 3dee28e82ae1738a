"""CHECK constraints on the JSON types of a cluster's config (an object), topology_labels and
data_volume_roots (arrays) (issue 27, bad rows).

Rows that would break a check are fixed first (`fix_rows`), so the migration runs on any
data: such a value is no config a backend could read (clusters/stored.py skipped the cluster
for it), and becomes the column's empty value; the admin sets it again.
"""

from django.db import migrations, models
from django.db.models.lookups import Exact

import portal.tolerant

EMPTY = {"object": {}, "array": []}


def json_is(column, kind):
    """As portal.tolerant.json_is made it when this migration was written."""
    condition = Exact(portal.tolerant.JsonType(column), kind)
    name = f"cluster_{column}_is_an_{kind}"
    return migrations.AddConstraint(
        model_name="cluster", constraint=models.CheckConstraint(condition=condition, name=name)
    )


def fix_rows(apps, schema_editor):
    cluster = apps.get_model("clusters", "Cluster")
    for operation in Migration.operations[1:]:
        condition = operation.constraint.condition
        column = condition.lhs.source_expressions[0].name
        cluster.objects.exclude(condition).update(**{column: EMPTY[condition.rhs]})


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0014_checks"),
    ]

    operations = [
        migrations.RunPython(fix_rows, migrations.RunPython.noop),
        json_is("config", "object"),
        json_is("topology_labels", "array"),
        json_is("data_volume_roots", "array"),
    ]
