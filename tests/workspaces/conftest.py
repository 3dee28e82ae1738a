from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connections

from tests.clusters.conftest import forget_namespaces


@pytest.fixture(autouse=True)
def _no_persistent_connections():
    """The ASGI stack reads the database from executor threads the test cannot reach; with
    persistent connections (CONN_MAX_AGE on PostgreSQL) they would outlive the test and keep
    the test database from being dropped. Close each at the end of its request instead."""
    settings_dict = connections["default"].settings_dict
    previous = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    yield
    settings_dict["CONN_MAX_AGE"] = previous


@pytest.fixture
def local_var_dir(settings, tmp_path):
    """A var/ of the test's own (local pods' records, folders, sockets), and a cache of its
    own (the proxy's activity marks)."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    cache.clear()
    yield
    forget_namespaces(settings.VAR_DIR)
