"""An admitted or running workload's `pending_reason` now says what its pods wait for (a
native sharer waiting for its GPU's MPS daemon: clusters.reconcile._record_waits), shown as
its "Waiting:" line, the API's `why` and `gpupool describe`'s. Before, a sweep admitted
when its trials started kept the queue's reason ("sweep ... runs at most 2 trials at
once"), and a running sweep would now say it still waits for that. Such reasons are
cleared: none of them was written by the reconcile yet (it begins with this release).
"""

import random

from django.db import migrations


def clear_reasons(apps, schema_editor):
    workload = apps.get_model("scheduling", "Workload")
    stale = workload.objects.filter(state__in=["admitted", "running"]).exclude(pending_reason="")
    stale.update(pending_reason="", version=random.getrandbits(62) + 1)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0019_cyclerun_admitted_at_release"),
    ]

    operations = [
        migrations.RunPython(clear_reasons, migrations.RunPython.noop),
    ]
