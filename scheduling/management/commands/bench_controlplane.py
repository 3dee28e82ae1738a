"""Measure the whole control plane at scale: `manage.py bench_controlplane --json --scale full`.

Without DATABASE_URL it starts a throw-away PostgreSQL and Redis (tests/services.py) and
runs itself again against them. It builds its state in the database it is given, so that
database must hold no cluster and no workload yet.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from clusters.metrics import bench
from clusters.models import Cluster
from scheduling.bench_controlplane import bench_run, child_cold_cycle, state
from scheduling.models import Workload


class Command(BaseCommand):
    help = "Build a cluster's worth of state and measure cycles, reconciles and syncs in it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--scale", choices=sorted(state.SCALES), default="small")
        # The bench runs its cold cycle in a child process of its own, through this flag.
        parser.add_argument("--child-cold-cycle", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["child_cold_cycle"]:
            self.stdout.write(json.dumps(child_cold_cycle()))
            return
        if not bench.on_postgresql():
            argv = ["bench_controlplane", f"--scale={options['scale']}"]
            code = bench.rerun_with_postgres(argv + ["--json"] * options["json"], redis=True)
            if code:
                raise CommandError(f"the benchmark failed (exit {code})")
            return
        bench.migrate_quietly()
        if Cluster.objects.exists() or Workload.objects.exists():
            raise CommandError(
                "the database already holds clusters or workloads: give the bench an empty "
                "one (or leave DATABASE_URL unset for a throw-away server)"
            )
        result = bench_run(options["scale"])
        if options["json"]:
            self.stdout.write(json.dumps(result))
        self.report(result)

    def report(self, result: dict[str, Any]) -> None:
        """The comparable figures, readably, on stderr."""
        for key, value in result.items():
            if not isinstance(value, dict | list) or key == "notes":
                print(f"{key:>28}: {value}", file=sys.stderr)
