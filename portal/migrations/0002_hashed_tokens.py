"""API tokens move from DRF's plaintext table (authtoken_token) to knox's hashed one.

Each existing token keeps working (same key, for the `gpupool login` configs that hold it)
until it expires one token lifetime (REST_KNOX TOKEN_TTL) from now; the plaintext table is
then dropped, since rest_framework.authtoken is no longer installed. Going back creates no
plaintext again: the reverse step only empties knox's table, so users run `gpupool login`.
"""

from datetime import UTC

from django.conf import settings
from django.db import migrations
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from knox.crypto import hash_token
from knox.settings import CONSTANTS, knox_settings

OLD_TABLE = "authtoken_token"


def aware(value):
    """SQLite hands a raw SELECT's datetime back as naive UTC text; PostgreSQL as a datetime."""
    value = parse_datetime(value) if isinstance(value, str) else value
    return timezone.make_aware(value, UTC) if timezone.is_naive(value) else value


def move_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return  # a database made after the switch: nothing to move
    AuthToken = apps.get_model("knox", "AuthToken")
    expiry = timezone.now() + knox_settings.TOKEN_TTL
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {OLD_TABLE}")
        rows = cursor.fetchall()
    AuthToken.objects.bulk_create(
        AuthToken(
            digest=hash_token(key),
            token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH],
            user_id=user_id,
            created=aware(created),
            expiry=expiry,
        )
        for key, user_id, created in rows
    )
    schema_editor.execute(f"DROP TABLE {OLD_TABLE}")


def forget_tokens(apps, schema_editor):
    apps.get_model("knox", "AuthToken").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0001_initial"),
        ("knox", "0009_extend_authtoken_field"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(move_tokens, forget_tokens)]
