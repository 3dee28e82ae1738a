"""A CHECK that a pod's port addresses (PodAllocation.ports) are an object (issue 27, bad
rows).

Rows that would break it are fixed first (`fix_rows`), so the migration runs on any data: the
addresses become {}, which the backend fills again as it reports the pod on its next pass
(nothing else is lost: they are the backend's report, not the user's request).
"""

import random

from django.db import migrations, models
from django.db.models.lookups import Exact

import portal.tolerant

CONDITION = Exact(portal.tolerant.JsonType("ports"), "object")


def fix_rows(apps, schema_editor):
    allocation = apps.get_model("scheduling", "PodAllocation")
    allocation.objects.exclude(CONDITION).update(ports={}, version=random.getrandbits(62) + 1)
    if schema_editor.connection.vendor == "postgresql":  # as scheduling 0016 says why
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0016_checks"),
    ]

    operations = [
        migrations.RunPython(fix_rows, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="podallocation",
            constraint=models.CheckConstraint(
                condition=CONDITION, name="allocation_ports_is_an_object"
            ),
        ),
    ]
