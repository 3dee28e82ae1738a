from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0006_installation_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="watch_state",
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
