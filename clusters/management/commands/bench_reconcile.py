"""Reconcile N admitted pods into a Kubernetes API server and report pods per second.

Against the in-process fake API server of the test suite, or the cluster named by
GPUPOOL_TEST_KUBECONFIG. Every database row it makes is rolled back at the end. It works
in a namespace of its own (`gp-bench-<random>`) under a Cluster record of its own, so it
counts, and deletes, only the pods it made, whatever else runs there (another GPUPool's
pods included); at the end it deletes that namespace.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand
from django.db import transaction
from kubernetes.client.exceptions import ApiException

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.watch import watches_stop
from clusters.models import Backend, Cluster, Gpu, Node
from clusters.reconcile import cluster_reconcile
from portal.models import Department, Project, User
from scheduling.bench_controlplane.probe import measured
from scheduling.models import PodAllocation, Workload, WorkloadState

GPUS_PER_NODE = 8
REAL = "GPUPOOL_TEST_KUBECONFIG"


class Rollback(Exception):
    pass


class Command(BaseCommand):
    help = "Reconcile N admitted pods into the test API server and print pods per second."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--pods", type=int, default=1000)
        parser.add_argument("--workers", type=int, default=32)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        with ExitStack() as stack:
            kubeconfig, node_names = self._api_server(stack, options["pods"])
            result: dict[str, Any] = {}
            try:
                with transaction.atomic():
                    result = self._bench(kubeconfig, node_names, options)
                    raise Rollback
            except Rollback:
                pass
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key}: {value}")

    def _api_server(self, stack: ExitStack, pods: int) -> tuple[dict, list[str]]:
        real = os.environ.get(REAL)
        if real:
            return yaml.safe_load(Path(real).read_text()), []
        # The fake runs in its own process, as an API server would: it must not compete
        # with the reconciling threads for this interpreter's GIL.
        from tests.clusters.fake_apiserver import serve_in_process  # noqa: PLC0415 - test-only

        nodes = -(-pods // GPUS_PER_NODE)
        kubeconfig = serve_in_process(stack, nodes, GPUS_PER_NODE)
        return kubeconfig, [f"bench-{i}" for i in range(nodes)]

    def _bench(self, kubeconfig: dict, node_names: list[str], options: dict) -> dict[str, Any]:
        cluster = Cluster.objects.create(
            name=f"bench-{os.getpid()}",
            backend=Backend.KUBERNETES,
            config={"workers": options["workers"], "grace_period_s": 0},
        )
        backend = _TimedBackend(cluster, kubeconfig=kubeconfig)
        if not node_names:  # a real cluster: spread over its nodes
            node_names = [n.name for n in backend.list_inventory() if n.schedulable]
        namespace = f"gp-bench-{uuid.uuid4().hex[:8]}"
        try:
            # Whole GPUs on the fake; on a real cluster CPU-only pods, which any node admits.
            _admit(cluster, node_names, options["pods"], namespace, gpus=not os.environ.get(REAL))
            return self._passes(cluster, backend, kubeconfig, options) | {"namespace": namespace}
        finally:
            _remove_namespace(backend, namespace)

    def _passes(
        self, cluster: Cluster, backend: _TimedBackend, kubeconfig: dict, options: dict
    ) -> dict[str, Any]:
        started = time.perf_counter()
        first = cluster_reconcile(cluster, backend=backend)
        elapsed = time.perf_counter() - started
        with measured() as idle:  # nothing to do: targeted, unless every pass is full
            second = cluster_reconcile(
                cluster, backend=KubernetesBackend(cluster, kubeconfig=kubeconfig)
            )
        Workload.objects.filter(allocations__node__cluster=cluster).update(
            state=WorkloadState.STOPPED
        )
        cleanup = cluster_reconcile(
            cluster, backend=KubernetesBackend(cluster, kubeconfig=kubeconfig)
        )
        watches_stop(cluster.pk)  # the API server goes with the bench
        return {
            "pods": options["pods"],
            "created": first.created,
            "errors": len(first.errors),
            "seconds": round(elapsed, 3),
            "pods_per_s": round(options["pods"] / elapsed, 1),
            "api_seconds": round(backend.seconds, 3),
            "api_pods_per_s": round(options["pods"] / backend.seconds, 1),
            "second_pass_created": second.created,
            "second_pass_seconds": round(idle.wall_s, 3),
            "second_pass_cpu_s": round(idle.cpu_s, 3),
            "second_pass_sql": idle.sql,
            "second_pass_full": second.full,
            "deleted_after": cleanup.deleted,
            "workers": options["workers"],
            "api_server": "GPUPOOL_TEST_KUBECONFIG" if os.environ.get(REAL) else "fake",
        }


class _TimedBackend(KubernetesBackend):
    """Times the cluster side of the first pass (listing, creating) apart from the database."""

    seconds = 0.0

    def reconcile(self, desired: list, **graces: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().reconcile(desired, **graces)
        finally:
            self.seconds += time.perf_counter() - started


def _remove_namespace(backend: KubernetesBackend, namespace: str) -> None:
    """The bench's own namespace, with anything of its own left in it."""
    try:
        backend.call(backend.api.delete_namespace, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:  # 404: the run failed before it was made
            raise


def _admit(
    cluster: Cluster, node_names: list[str], pods: int, namespace: str, *, gpus: bool
) -> None:
    user = User.objects.create(username=f"bench-{os.getpid()}")
    department = Department.objects.create(name=f"bench-{os.getpid()}")
    project = Project.objects.create(department=department, name="bench", namespace=namespace)
    nodes = Node.objects.bulk_create(Node(cluster=cluster, name=name) for name in node_names)
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, model="bench") for node in nodes for i in range(GPUS_PER_NODE)
    )
    workloads = Workload.objects.bulk_create(
        # Tiny requests on the pause image: a real test cluster's kubelets admit them all.
        Workload(
            project=project,
            submitted_by=user,
            kind="training",
            name=f"w{i}",
            image="registry.k8s.io/pause:3.10",
            cpu=Decimal("0.01"),
            memory_mib=16,
            gpus=1 if gpus else 0,
            state=WorkloadState.ADMITTED,
        )
        for i in range(pods)
    )
    PodAllocation.objects.bulk_create(
        PodAllocation(
            workload=w,
            pod_index=0,
            node=nodes[i // GPUS_PER_NODE % len(nodes)],
            gpu_indices=[i % GPUS_PER_NODE] if gpus else [],
        )
        for i, w in enumerate(workloads)
    )
