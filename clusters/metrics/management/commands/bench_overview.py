"""Measure the overview dashboard's server time: `manage.py bench_overview --json`."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.test import Client
from django.utils import timezone

from clusters.metrics import bench, benchdata


class Command(BaseCommand):
    help = "Build 30 days of roll-ups for many projects, then time the overview's rendering."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--projects", type=int, default=200)
        parser.add_argument("--pools", type=int, default=4)
        parser.add_argument("--nodes", type=int, default=16, help="nodes per pool")
        parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
        parser.add_argument("--repeat", type=int, default=15, help="requests per page")
        parser.add_argument("--allow-sqlite", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if not bench.on_postgresql() and not options["allow_sqlite"]:
            keys = ("projects", "pools", "nodes", "gpus", "repeat")
            argv = ["bench_overview", *[f"--{k}={options[k]}" for k in keys]]
            code = bench.rerun_with_postgres([*argv, "--json"] if options["json"] else argv)
            if code:
                raise CommandError(f"the benchmark failed (exit {code})")
            return
        bench.migrate_quietly()
        benchdata.cleanup()
        try:
            result = self.run_bench(options)
        finally:
            benchdata.cleanup()
        self.stdout.write(json.dumps(result) if options["json"] else str(result))

    def run_bench(self, options: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        began = time.perf_counter()
        nodes = benchdata.build_inventory(options["pools"], options["nodes"], options["gpus"])
        admin, projects = benchdata.build_org(options["projects"])
        rows = benchdata.build_usage(projects, nodes, options["gpus"], now)
        samples = benchdata.build_now(admin, projects, nodes, options["gpus"], now)
        built_s = time.perf_counter() - began
        client = Client()
        client.force_login(admin)
        pages = {
            "24h": "/dashboard/",
            "7d": "/dashboard/?range=7d",
            "30d": "/dashboard/?range=30d",
            "fragment_now": "/dashboard/fragment/now/",
            "fragment_chart_30d": "/dashboard/fragment/chart/?range=30d",
        }
        medians = {
            name: self.time_page(client, url, options["repeat"]) for name, url in pages.items()
        }
        statements = {name: self.page_sql(client, url) for name, url in pages.items()}
        return {
            "server_ms_median": max(medians["24h"], medians["7d"], medians["30d"]),
            "pages_ms_median": medians,
            "pages_sql": statements,  # statements of one render: flat in the projects
            "projects": len(projects),
            "gpus": len(nodes) * options["gpus"],
            "rollup_rows": rows,
            "live_samples": samples,
            "build_s": round(built_s, 1),
            "database": bench.connection.vendor,
        }

    def page_sql(self, client: Client, url: str) -> int:
        """SQL statements one render of the page issues."""
        with bench.statements() as queries:
            client.get(url)
        return queries.count

    def time_page(self, client: Client, url: str, repeat: int) -> float:
        client.get(url)  # warm up: template loading, connection
        durations = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            response = client.get(url)
            durations.append((time.perf_counter() - t0) * 1000)
            if response.status_code != 200:
                raise CommandError(f"{url} answered {response.status_code}")
        return round(statistics.median(durations), 1)
