"""Seed the demo: each app's `demo.seed(stdout)` in turn. Idempotent: run it any number of times."""

from __future__ import annotations

import importlib

from django.core.management.base import BaseCommand
from django.db import transaction

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
            with transaction.atomic():
                module.seed(self.stdout)
