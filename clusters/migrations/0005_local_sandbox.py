"""Data-volume roots of local clusters; workspace tokens out of workloads' env.

A workspace's Jupyter token used to travel in its workload's `env`, which the workloads
API and the workload page show: it now lives on the Workspace row only (the backend adds
it to the pod's environment), and existing workloads lose their copy.
"""

from django.db import migrations, models


def forget_tokens_in_env(apps, schema_editor):
    Workload = apps.get_model("scheduling", "Workload")
    for workload in Workload.objects.filter(kind="workspace").only("env").iterator():
        if "JUPYTER_TOKEN" in (workload.env or {}):
            del workload.env["JUPYTER_TOKEN"]
            workload.save(update_fields=["env"])


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0004_node_unschedulable_reason"),
        ("scheduling", "0005_policy_grace_cycle_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="data_volume_roots",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(forget_tokens_in_env, migrations.RunPython.noop),
    ]
