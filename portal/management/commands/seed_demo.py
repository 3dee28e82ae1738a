"""Seed the demo: each app's `demo.seed(stdout)` in turn, once per database.

`make demo` runs this on every start. A seeder runs once (a DemoSeed row remembers it, in
the same transaction); on later starts only its `every_start(stdout)`, when it has one,
runs (printing the passwords, syncing the clusters' inventories). So what admins renamed
or deleted in between is left as they left it: a renamed demo project once stopped every
start (its namespace taken by the project `seed` tried to create again). A seeder that
fails on data it did not expect (a database seeded before DemoSeed existed, then edited)
is rolled back whole, reported in one line, and marked as seeded; the demo starts."""

from __future__ import annotations

import importlib
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand
from django.db import IntegrityError, transaction

from portal.models import DemoSeed

# Order matters: the organisation first, then clusters (pools, nodes), then what uses them.
SEEDERS = [
    "portal.demo",
    "clusters.demo",
    "clusters.metrics.demo",
    "scheduling.demo",
    "workspaces.demo",
]


class Command(BaseCommand):
    help = "Create (or bring up to date) the demo organisation, clusters and environments."

    def handle(self, *args, **options):
        for module_name in SEEDERS:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
                continue  # that app has nothing to seed
            self._run(module_name, module)

    def _run(self, name: str, module: Any) -> None:
        if DemoSeed.objects.filter(name=name).exists():
            every_start = getattr(module, "every_start", None)
            if every_start is not None:
                with transaction.atomic():
                    every_start(self.stdout)
            return
        try:
            with transaction.atomic():
                module.seed(self.stdout)
                DemoSeed.objects.create(name=name)
        except (IntegrityError, ObjectDoesNotExist) as exc:
            self.stdout.write(
                f"Demo data of {name} left as the admins changed it ({type(exc).__name__}: "
                f"{exc}).\n"
            )
            DemoSeed.objects.get_or_create(name=name)
