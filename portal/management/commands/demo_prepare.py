"""Prepare `make demo`'s database in one process (each `manage.py` start costs seconds):
1. migrate, with Django's system checks, when a migration is unapplied (the first start,
   or after a pull that brought one); on an unchanged tree nothing is migrated or checked,
   and a line says so;
2. seed the demo (`seed_demo`: each seeder once per database, then its every-start part).
"""

from __future__ import annotations

from django.apps import apps
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def unapplied_migrations() -> list[str]:
    """The migrations `migrate` would apply, as `app.name`; an app without migrations that
    has models (migrate would create its tables) counts as one."""
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    unmigrated = [
        f"{label} (no migrations)"
        for label in sorted(executor.loader.unmigrated_apps)
        if any(apps.get_app_config(label).get_models())
    ]
    return [f"{m.app_label}.{m.name}" for m, _ in plan] + unmigrated


class Command(BaseCommand):
    help = "Migrate when a migration is unapplied, then seed the demo (make demo's start)."
    # migrate runs the system checks itself, when there is something to migrate.
    requires_system_checks: list[str] = []

    def handle(self, *args, **options):
        pending = unapplied_migrations()
        if pending:
            self.stdout.write(f"migrating the database ({len(pending)} migrations)...")
            call_command("migrate", interactive=False, verbosity=0, skip_checks=False)
        else:
            self.stdout.write("the database is up to date: nothing to migrate.")
        self.stdout.write("seeding the demo...")
        call_command("seed_demo", stdout=self.stdout)
