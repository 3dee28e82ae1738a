"""Measure sample ingestion into PostgreSQL: `manage.py bench_ingest --json`."""

from __future__ import annotations

import datetime as dt
import json
import random
import statistics
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.test import Client
from django.utils import timezone

from clusters.metrics import bench
from clusters.metrics.models import AllocationInterval, GpuSample
from clusters.metrics.services import node_token_issue, samples_ingest
from clusters.models import Cluster, Gpu, Node

CLUSTER = "bench-ingest"


class Command(BaseCommand):
    help = "Ingest synthetic GPU samples in agent-sized batches and report samples per second."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--samples", type=int, default=200_000)
        parser.add_argument("--batch", type=int, default=2_000, help="samples per batch")
        parser.add_argument("--nodes", type=int, default=64)
        parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
        parser.add_argument(
            "--allow-sqlite", action="store_true", help="measure the configured SQLite instead"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not bench.on_postgresql() and not options["allow_sqlite"]:
            argv = ["bench_ingest", *self.passthrough(options)]
            code = bench.rerun_with_postgres(argv)
            if code:
                raise CommandError(f"the benchmark failed (exit {code})")
            return
        bench.migrate_quietly()
        nodes = self.make_nodes(options["nodes"], options["gpus"])
        try:
            result = self.measure(nodes, options)
        finally:
            GpuSample.objects.filter(node_id__in=[n.pk for n in nodes]).delete()
            AllocationInterval.objects.filter(node_id__in=[n.pk for n in nodes]).delete()
            Cluster.objects.filter(name=CLUSTER).delete()
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(f"{result['samples_per_s']:.0f} samples/s ({result})")

    def passthrough(self, options: dict[str, Any]) -> list[str]:
        argv = [f"--{name}={options[name]}" for name in ("samples", "batch", "nodes", "gpus")]
        return [*argv, "--json"] if options["json"] else argv

    def make_nodes(self, count: int, gpus: int) -> list[Node]:
        cluster, _ = Cluster.objects.get_or_create(name=CLUSTER, defaults={"backend": "simulated"})
        nodes = [
            Node.objects.get_or_create(cluster=cluster, name=f"n{i:04d}")[0] for i in range(count)
        ]
        Gpu.objects.bulk_create(
            [
                Gpu(node=n, index=g, model="A100", memory_mib=81920)
                for n in nodes
                for g in range(gpus)
            ],
            ignore_conflicts=True,
        )
        return nodes

    def batches(self, nodes: list[Node], options: dict[str, Any]) -> list[list[dict]]:
        """Agent-shaped samples (epoch times, as JSON carries them), built before timing."""
        rng = random.Random(7)
        start, total, size = time.time() - 3600, options["samples"], options["batch"]
        gpus = options["gpus"]
        samples = [
            {
                "node_id": nodes[(i // gpus) % len(nodes)].pk, "gpu_index": i % gpus,
                "ts": start + i / 1000, "util_pct": rng.uniform(0, 100),
                "mem_used_mib": rng.randrange(81920), "mem_total_mib": 81920,
                "power_w": rng.uniform(60, 400), "temp_c": rng.uniform(30, 80),
                "workload_id": rng.randrange(1, 500), "pod_index": 0,
            }
            for i in range(total)
        ]  # fmt: skip
        return [samples[i : i + size] for i in range(0, total, size)]

    def measure(self, nodes: list[Node], options: dict[str, Any]) -> dict[str, Any]:
        batches = self.batches(nodes, options)
        samples_ingest(batches[0])  # warm up: connection, prepared plans, caches
        durations = []
        began = time.perf_counter()
        with bench.statements() as queries:
            for batch in batches:
                t0 = time.perf_counter()
                samples_ingest(batch)
                durations.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - began
        api_rate = self.measure_api(nodes[0], batches[: max(1, len(batches) // 4)])
        stored = GpuSample.objects.filter(node_id__in=[n.pk for n in nodes]).count()
        return {
            "samples_per_s": round(options["samples"] / elapsed, 1),
            "samples": options["samples"],
            "batch": options["batch"],
            "seconds": round(elapsed, 3),
            "batch_ms_median": round(statistics.median(durations) * 1000, 2),
            # statements per batch: bulk writes keep it flat, whatever the batch's size
            "sql_per_batch": round(queries.count / len(batches), 1),
            "api_samples_per_s": api_rate,
            "stored": stored,
            "database": bench.connection.vendor,
        }

    def measure_api(self, node: Node, batches: list[list[dict]]) -> float:
        """The same batches through POST /api/v1/metrics: JSON, token check, DRF, ingestion.
        An agent reports only the workloads placed on its node: here, every one the batches name."""
        _, token = node_token_issue(actor=None, node=node)
        placed = sorted({s["workload_id"] for batch in batches for s in batch})
        since = timezone.now() - dt.timedelta(hours=2)
        AllocationInterval.objects.bulk_create(
            AllocationInterval(pod_allocation_id=0, workload_id=w, project_id=0, department_id=0,
                               node_id=node.pk, started_at=since)
            for w in placed
        )  # fmt: skip
        client = Client()
        auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        bodies = [json.dumps({"samples": batch}) for batch in batches]
        began = time.perf_counter()
        for body in bodies:
            response = client.post("/api/v1/metrics", body, "application/json", **auth)
            if response.status_code != 201:
                raise CommandError(f"the API answered {response.status_code}: {response.content!r}")
        return round(sum(map(len, batches)) / (time.perf_counter() - began), 1)
