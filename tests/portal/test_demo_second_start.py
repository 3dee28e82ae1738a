"""`make demo` started again on an unchanged tree does no work whose inputs did not change:
no collectstatic, no migrate, and no process imports the Kubernetes client (its import
cost seconds of every process's start, most of a second start once)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db.migrations.recorder import MigrationRecorder
from django.db.models.signals import post_migrate

from portal.management.commands.demo_prepare import unapplied_migrations
from tests.portal.demo_process import ROOT, embedded_env
from tests.portal.test_demo_supervisor import demo


def test_static_files_are_collected_again_only_when_one_changed(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setenv("GPUPOOL_STATIC_ROOT", str(tmp_path / "static"))
    (tmp_path / "static").mkdir()
    monkeypatch.setattr(demo, "manage", lambda *args: ran.append(args[0]))
    demo.collect_static()
    demo.collect_static()
    assert ran == ["collectstatic"]
    changed = next(path for path in (demo.ROOT / "static").rglob("*") if path.is_file())
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    try:
        demo.collect_static()
    finally:
        os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ran == ["collectstatic", "collectstatic"]


@pytest.mark.django_db
def test_preparing_a_migrated_database_migrates_nothing_and_seeds(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    migrations = []
    post_migrate.connect(migrations.append, dispatch_uid="test-demo-prepare")
    out = io.StringIO()
    try:
        call_command("demo_prepare", stdout=out)
    finally:
        post_migrate.disconnect(dispatch_uid="test-demo-prepare")
    assert migrations == []
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["the database is up to date: nothing to migrate.", demo.SEEDING]
    assert "Demo users (username / password):" in lines


@pytest.mark.django_db
def test_an_unapplied_migration_is_found():
    latest = MigrationRecorder.Migration.objects.filter(app="portal").latest("id")
    latest.delete()
    assert unapplied_migrations() == [f"portal.{latest.name}"]


def test_no_process_of_the_demo_imports_kubernetes_as_it_starts(tmp_path):
    """Web (settings, every URL's view), worker and beat (every task module) as they start:
    only a Kubernetes cluster's work imports the client."""
    program = (
        "import json, sys, django; django.setup()\n"
        "from django.urls import get_resolver; get_resolver().reverse_dict\n"
        "from portal.celery import app; app.loader.import_default_modules()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'"
        " or m.startswith('clusters.backends.kubernetes'))))\n"
    )
    env = embedded_env(tmp_path, DJANGO_SETTINGS_MODULE="portal.settings")
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
