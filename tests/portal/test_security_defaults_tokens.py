"""API tokens: hashed at rest, expiring, bounded per user, and moved over from DRF's plaintext."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from portal.tokens import api_token_issue
from tests import factories as f


def login(username: str = "rita") -> dict:
    body = {"username": username, "password": f.PASSWORD}
    response = APIClient().post("/api/v1/auth/token", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def me(token: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get("/api/v1/users/me").status_code


def test_the_database_keeps_a_digest_of_the_token_never_the_token(org):
    token = login()["token"]
    stored = AuthToken.objects.get(user=org.researcher)
    assert token not in {stored.digest, stored.token_key}
    assert stored.token_key == token[:15]
    assert len(stored.digest) == 128  # SHA-512, hex
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        assert not any(token in str(column) for row in cursor.fetchall() for column in row)


def test_a_token_expires_after_its_lifetime_and_then_gets_401(org, settings):
    body = login()
    expiry = AuthToken.objects.get(user=org.researcher).expiry
    assert timedelta(days=29) < expiry - timezone.now() <= timedelta(days=30)
    assert body["expiry"]
    assert me(body["token"]) == 200
    past = timezone.now() - timedelta(seconds=1)
    AuthToken.objects.filter(user=org.researcher).update(expiry=past)
    assert me(body["token"]) == 401
    assert not AuthToken.objects.filter(user=org.researcher).exists()  # expired rows are dropped


def test_a_new_login_keeps_earlier_tokens_up_to_the_per_user_limit(org, settings):
    settings.GPUPOOL_API_TOKENS_PER_USER = 2
    first, second, third = (login()["token"] for _ in range(3))
    assert (me(first), me(second), me(third)) == (401, 200, 200)
    assert AuthToken.objects.filter(user=org.researcher).count() == 2


@pytest.mark.parametrize(
    "header", [b"Token \xff\xfe", "Token wrong", "Token " + "a" * 64, "Token a b"]
)
def test_a_malformed_or_unknown_token_is_a_401(org, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/users/me").status_code == 401


def test_an_admin_issued_token_authenticates_and_deleting_it_revokes_it(org):
    stored, token = api_token_issue(user=org.outsider)
    assert me(token) == 200
    stored.delete()
    assert me(token) == 401


@pytest.mark.django_db(transaction=True)
def test_the_migration_hashes_existing_plaintext_tokens_and_drops_their_table():
    executor = MigrationExecutor(connection)
    executor.migrate([("portal", "0001_initial")])
    user = f.make_user("legacy")
    key = "0123456789abcdef0123456789abcdef01234567"  # DRF's format: 40 hex digits
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamp with time zone NOT NULL, user_id bigint NOT NULL)"
            if connection.vendor == "postgresql"
            else "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created datetime NOT NULL, user_id bigint NOT NULL)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [key, timezone.now(), user.pk],
        )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert "authtoken_token" not in connection.introspection.table_names()
    stored = AuthToken.objects.get(user=user)
    assert stored.digest != key and stored.token_key == key[:15]
    assert stored.expiry > timezone.now() + timedelta(days=29)
    assert me(key) == 200
