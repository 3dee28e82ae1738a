"""What one reconcile pass costs with N running pods: observed by the watch, or by the poll.

Against the fake API server of the test suite in a process of its own (never a real
cluster: it creates N pods). N pods are created and run; then passes are timed as a
Celery task would run them (a fresh backend per pass, one worker process), first with
`watch: false` (each pass lists every pod and service of GPUPool's), then with the
watch (each pass reads this process's cache). Also timed: how long after a pod finishes
the watch asks for a reconcile. Prints one JSON object; every row is rolled back.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.watch import set_change_listener, watches_stop
from clusters.management.commands.bench_reconcile import GPUS_PER_NODE, Rollback, _admit
from clusters.models import Backend, Cluster
from clusters.reconcile import cluster_reconcile

MAX_PODS = 50_000
NAMESPACE = "gp-bench"  # on a fake API server of its own: nobody else's pods there


class Command(BaseCommand):
    help = "Time reconcile passes over N running pods, watch versus poll; print JSON."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--pods", type=int, default=10_000)
        parser.add_argument("--passes", type=int, default=3, help="timed passes per mode")
        parser.add_argument(
            "--mode", choices=["both", "watch", "poll"], default="both", help="what to time"
        )
        parser.add_argument("--workers", type=int, default=32)

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["pods"] <= MAX_PODS:
            raise CommandError(f"--pods: between 1 and {MAX_PODS}")
        if not 1 <= options["passes"] <= 100:
            raise CommandError("--passes: between 1 and 100")
        result: dict[str, Any] = {}
        with ExitStack() as stack:
            kubeconfig = _fake_server(stack, options["pods"])
            try:
                with transaction.atomic():
                    result = _bench(kubeconfig, options)
                    raise Rollback
            except Rollback:
                pass
        self.stdout.write(json.dumps(result))


def _fake_server(stack: ExitStack, pods: int) -> dict:
    from tests.clusters.fake_apiserver import serve_in_process  # noqa: PLC0415 - test-only

    # The watch must not fall out of the event window while the pods are made.
    return serve_in_process(stack, -(-pods // GPUS_PER_NODE), GPUS_PER_NODE, window=pods * 3)


class _Timed(KubernetesBackend):
    """Times the cluster side of a pass (observing, reconciling) apart from the database."""

    seconds = 0.0

    def pod_statuses(self) -> Any:
        started = time.perf_counter()
        try:
            return super().pod_statuses()
        finally:
            self.seconds += time.perf_counter() - started

    def reconcile(self, desired: list, **graces: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().reconcile(desired, **graces)
        finally:
            self.seconds += time.perf_counter() - started


def _passes(cluster: Cluster, kubeconfig: dict, count: int) -> dict[str, Any]:
    rows = []
    for _ in range(count):
        backend = _Timed(cluster, kubeconfig=kubeconfig)
        started = time.perf_counter()
        result = cluster_reconcile(cluster, backend=backend)
        rows.append(
            {
                "pass_s": time.perf_counter() - started,
                "cluster_s": backend.seconds,
                "requests": backend.requests,
                "bytes": backend.bytes_read,
                "observed_by": backend.observed_by,
                "created": result.created,
                "deleted": result.deleted,
            }
        )
    return {
        "pass_s_median": round(statistics.median(r["pass_s"] for r in rows), 4),
        "cluster_s_median": round(statistics.median(r["cluster_s"] for r in rows), 4),
        "requests_per_pass": max(r["requests"] for r in rows),
        "bytes_per_pass": max(r["bytes"] for r in rows),
        "observed_by": sorted({r["observed_by"] for r in rows}),
        "changes": sum(r["created"] + r["deleted"] for r in rows),
    }


def _reaction_s(cluster: Cluster, kubeconfig: dict) -> float:
    """A pod finishes (its status written through the API, as a kubelet does): seconds
    until the watch asks for a reconcile."""
    asked = threading.Event()
    set_change_listener(lambda cluster_id: asked.set())
    try:
        api = KubernetesBackend(cluster, kubeconfig=kubeconfig).api
        pod = api.list_namespaced_pod(NAMESPACE, limit=1).items[0]
        body = {"status": {"phase": "Succeeded"}}
        started = time.perf_counter()
        api.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, body)
        if not asked.wait(30):
            return -1.0
        return round(time.perf_counter() - started, 4)
    finally:
        set_change_listener(None)


def _bench(kubeconfig: dict, options: dict) -> dict[str, Any]:
    pods = options["pods"]
    cluster = Cluster.objects.create(
        name="bench-watch",
        backend=Backend.KUBERNETES,
        config={"workers": options["workers"], "grace_period_s": 0, "watch": False},
    )
    nodes = [f"bench-{i}" for i in range(-(-pods // GPUS_PER_NODE))]
    _admit(cluster, nodes, pods, NAMESPACE, gpus=True)
    started = time.perf_counter()
    first = cluster_reconcile(cluster, backend=KubernetesBackend(cluster, kubeconfig=kubeconfig))
    out: dict[str, Any] = {
        "pods": pods,
        "created": first.created,
        "create_pass_s": round(time.perf_counter() - started, 2),
        "passes_per_mode": options["passes"],
    }
    if options["mode"] in ("both", "poll"):
        out["poll"] = _passes(cluster, kubeconfig, options["passes"])
    if options["mode"] in ("both", "watch"):
        cluster.config = {**cluster.config, "watch": True, "resync_s": 3600}
        cluster.save(update_fields=["config"])
        warm = _passes(cluster, kubeconfig, 1)  # lists once and starts the watch
        out["watch_first_pass"] = warm
        out["watch"] = _passes(cluster, kubeconfig, options["passes"])
        out["watch_reaction_s"] = _reaction_s(cluster, kubeconfig)
        watches_stop(cluster.pk)
    out["api_server"] = "fake (own process)"
    return out
