"""var/ holds the database, the broker's queue and the secret key: no other user of the
machine may read them (they were 0644 in a 0755 folder)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.portal.test_demo_supervisor import demo

ROOT = Path(__file__).resolve().parents[2]
# Settings loaded as `manage.py` loads them, then a write to the database and the broker,
# under the umask most machines give a user (0022): what it makes must not follow it.
START = """
import os
os.umask(0o022)
import django
django.setup()
from django.conf import settings
from django.db import connection
from portal import broker
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE IF NOT EXISTS t (x)")
    cursor.execute("INSERT INTO t VALUES (1)")
broker.open_database(settings.CELERY_BROKER_TRANSPORT_OPTIONS["path"]).close()
"""


def start(var: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="portal.settings", GPUPOOL_VAR_DIR=str(var))
    subprocess.run(
        [sys.executable, "-c", START], cwd=ROOT, env=env, check=True, timeout=120,
        capture_output=True,
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_var_folder_and_its_database_files_are_the_owners_alone(tmp_path):
    var = tmp_path / "var"
    start(var)
    assert mode(var) == 0o700
    files = {p.name: mode(p) for p in var.iterdir() if p.is_file()}
    assert {"gpupool.sqlite3", "celery-broker.sqlite3", "secret_key"} <= set(files)
    assert {name: m for name, m in files.items() if m & 0o077} == {}


def test_an_existing_var_folder_loses_other_users_access_and_keeps_its_group(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o775)
    var.chmod(0o775)  # as a root worker's setup gives var/ the web process's group
    database = var / "gpupool.sqlite3"
    database.touch()
    database.chmod(0o664)
    start(var)
    assert (mode(var), mode(database)) == (0o770, 0o660)


def test_the_demo_and_every_process_it_starts_create_files_for_their_user_alone(
    monkeypatch, tmp_path
):
    class Started(Exception):
        pass

    def first_step():
        raise Started

    monkeypatch.setattr(demo, "collect_static", first_step)
    monkeypatch.setattr(os, "environ", os.environ.copy())  # main() sets defaults in it
    before = os.umask(0o022)
    try:
        with pytest.raises(Started):
            demo.main()
        made = tmp_path / "made"
        subprocess.run(["touch", str(made)], check=True)  # a child inherits the umask
    finally:
        os.umask(before)
    assert mode(made) == 0o600
