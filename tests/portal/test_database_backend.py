"""The suite really runs on the servers it claims: PostgreSQL and Redis when their URLs are set
(tests/services.py sets them), SQLite in the embedded run."""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection


@pytest.mark.services
def test_the_test_database_is_postgresql_when_database_url_is_set(db):
    if not os.environ.get("DATABASE_URL"):
        pytest.skip("DATABASE_URL is not set: run under `python -m tests.services`")
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        assert cursor.fetchone()[0].startswith("PostgreSQL")
    assert connection.settings_dict["NAME"].startswith("test_")


@pytest.mark.services
def test_the_cache_is_redis_when_redis_url_is_set():
    if not os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is not set: run under `python -m tests.services`")
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    cache.set("gpupool-test-key", "here", 30)
    assert cache.get("gpupool-test-key") == "here"
    assert os.environ["REDIS_URL"] == settings.CELERY_BROKER_URL


def test_the_embedded_run_uses_sqlite(db):
    if not os.environ.get("GPUPOOL_TEST_EMBEDDED"):
        pytest.skip("only the embedded run (make test's second pass) checks this")
    assert connection.vendor == "sqlite"
