"""The installation's identity (one row), and each cluster record's own uid, API server
and kube-system namespace uid (a cluster is registered once)."""

import uuid

from django.db import migrations, models


def identities(apps, schema_editor):
    Installation = apps.get_model("clusters", "Installation")
    if not Installation.objects.exists():
        Installation.objects.create(uid=uuid.uuid4())
    Cluster = apps.get_model("clusters", "Cluster")
    for cluster in Cluster.objects.filter(uid__isnull=True):
        cluster.uid = uuid.uuid4()
        cluster.save(update_fields=["uid"])


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0005_local_sandbox"),
    ]

    operations = [
        migrations.CreateModel(
            name="Installation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("uid", models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.AddField(
            model_name="cluster",
            name="uid",
            field=models.UUIDField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="cluster",
            name="api_server",
            field=models.CharField(blank=True, db_index=True, max_length=2048),
        ),
        migrations.AddField(
            model_name="cluster",
            name="kube_system_uid",
            field=models.CharField(blank=True, db_index=True, max_length=64),
        ),
        migrations.RunPython(identities, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="cluster",
            name="uid",
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
    ]
