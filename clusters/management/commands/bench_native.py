"""Native pods created in namespaces -> all bound: `manage.py bench_native --json [--pods 1000]`.

Issue 26's benchmark. Against the in-process fake API server of the test suite (its Job
controller on), pods are made with the official client as kubectl and controllers make
them, in the namespaces of a few projects whose quotas let everything fit (the point is
throughput, not contention): bare pods, the pods of `batch/v1` Jobs of two, and 8-pod
gangs (an operator's pods: a PyTorchJob-like controller reference and
`gpupool.io/min-available: "8"`). Then it runs what the beat runs (a reconcile pass for
the intake, a scheduling cycle, a reconcile pass that binds) until every pod is bound, and
reports pods per second of that, wall and CPU, API requests and SQL statements per pass.

It uses the configured database; every row it makes is rolled back at the end. With
`--postgres` and no PostgreSQL configured, it starts a throw-away one and runs itself again
against it (as bench_controlplane does), reporting the database's CPU too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.watch import watches_stop
from clusters.inventory import inventory_sync
from clusters.management.commands.bench_reconcile import Rollback
from clusters.metrics import bench
from clusters.models import Backend, Cluster, NodePool
from clusters.reconcile import cluster_reconcile
from portal.models import Department, DepartmentQuota, Project, ProjectQuota
from scheduling.bench_controlplane.probe import Cost, backend_cpu_s, measured
from scheduling.cycle import cycle_run

GPUS_PER_NODE = 8
GANG = 8  # pods of an operator's gang
JOB = 2  # pods of a Job (parallelism and completions)
# One block of the mix: 8 bare pods, 4 Jobs of 2, one gang of 8 (a third each); pods past
# the last whole block are bare.
BLOCK = ("pod",) * 8 + ("job",) * 4 + ("gang",)
SIZE = {"pod": 1, "job": JOB, "gang": GANG}
PHASES = ("intake", "cycle", "bind")
MAX_ROUNDS = 10


class Command(BaseCommand):
    help = "Create N native pods in project namespaces and measure intake to binding."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--pods", type=int, default=1000)
        parser.add_argument("--projects", type=int, default=4)
        parser.add_argument("--workers", type=int, default=32)
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument(
            "--postgres", action="store_true", help="on a throw-away PostgreSQL if none is set"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["postgres"] and not bench.on_postgresql():
            argv = ["bench_native", "--postgres", *_passed(options)]
            if code := bench.rerun_with_postgres(argv):
                raise CommandError(f"the benchmark failed (exit {code})")
            return
        if options["postgres"]:
            bench.migrate_quietly()
        from tests.clusters.fake_apiserver import serve_in_process  # noqa: PLC0415 - test-only

        nodes = math.ceil(options["pods"] * 1.25 / GPUS_PER_NODE)  # room for the gangs
        result: dict[str, Any] = {}
        with ExitStack() as stack:
            # In a process of its own, as an API server is: it must not share this
            # interpreter's GIL with the passes it serves.
            kubeconfig = serve_in_process(stack, nodes, GPUS_PER_NODE, job_controller=True)
            try:
                with transaction.atomic():
                    result = _bench(kubeconfig, nodes, options)
                    raise Rollback
            except Rollback:
                pass
        self.stdout.write(json.dumps(result, indent=None if options["json"] else 2))


def _passed(options: dict) -> list[str]:
    keys = ("pods", "projects", "workers")
    return [f"--{k}={options[k]}" for k in keys] + ["--json"] * options["json"]


def _bench(kubeconfig: dict, nodes: int, options: dict) -> dict[str, Any]:
    """1. the cluster, its inventory and the projects; 2. the pods, made as kubectl and
    controllers make them; 3. rounds of intake, cycle and binding until all are bound."""
    tag = uuid.uuid4().hex[:6]
    cluster = Cluster.objects.create(
        name=f"nbench-{tag}",
        backend=Backend.KUBERNETES,
        config={"workers": options["workers"], "grace_period_s": 0},
    )
    inventory_sync(cluster, backend=KubernetesBackend(cluster, kubeconfig=kubeconfig))
    namespaces = _projects(tag, options["projects"], options["pods"], nodes)
    api = k8s_config.new_client_from_config_dict(kubeconfig)
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = options["workers"]
    try:
        started = time.perf_counter()
        kinds = _create(api, namespaces, options["pods"], options["workers"])
        created_s = time.perf_counter() - started
        rounds, phases = _rounds(cluster, kubeconfig, api, namespaces, options["pods"])
    finally:
        watches_stop(cluster.pk)
    bound = _bound(api, namespaces)
    total = {key: _sum(phases, key) for key in ("seconds", "cpu_s", "db_cpu_s", "api_server_cpu_s")}
    return {
        "pods": options["pods"],
        "bound": bound,
        "mix": kinds,
        "rounds": len(rounds),
        **total,
        "pods_per_s": round(bound / total["seconds"], 1) if total["seconds"] else None,
        "api_requests": sum(r["api_requests"] for r in rounds),
        "phases": phases,
        "passes": rounds,
        "create_seconds": round(created_s, 3),
        "database": connection.vendor,
        "api_server": "fake",
    }


def _projects(tag: str, count: int, pods: int, nodes: int) -> list[str]:
    """`count` projects of one department on the cluster's pool, each deserving more GPUs
    than its share of the pods."""
    pool = NodePool.objects.get(name="bench")
    department = Department.objects.create(name=f"nbench-{tag}")
    DepartmentQuota.objects.create(
        department=department, node_pool=pool, gpus=Decimal(nodes * GPUS_PER_NODE)
    )
    namespaces = []
    for index in range(count):
        namespace = f"gp-nbench-{tag}-{index}"
        project = Project.objects.create(
            department=department, name=f"nbench-{index}", namespace=namespace
        )
        deserved = math.ceil(pods / count) + GANG
        ProjectQuota.objects.create(project=project, node_pool=pool, gpus=Decimal(deserved))
        namespaces.append(namespace)
    return namespaces


def _mix(pods: int) -> list[str]:
    """The kind of each group, in order: whole blocks, then bare pods."""
    blocks = pods // sum(SIZE[k] for k in BLOCK)
    kinds = list(BLOCK) * blocks
    return kinds + ["pod"] * (pods - sum(SIZE[k] for k in kinds))


def _create(api: k8s.ApiClient, namespaces: list[str], pods: int, workers: int) -> dict:
    """The namespaces (as the team's admin makes them), then each group's objects, on a
    thread pool (many clients at once); how many pods of each kind."""
    core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
    for namespace in namespaces:
        core.create_namespace({"metadata": {"name": namespace}})
    kinds = _mix(pods)

    def make(index: int) -> None:
        kind, namespace = kinds[index], namespaces[index % len(namespaces)]
        name = f"{kind}-{index:05d}"
        if kind == "job":
            batch.create_namespaced_job(namespace, _job(name))
        elif kind == "gang":
            owner = _operator(name)
            for rank in range(GANG):
                core.create_namespaced_pod(namespace, _pod(f"{name}-worker-{rank}", owner))
        else:
            core.create_namespaced_pod(namespace, _pod(name))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(make, range(len(kinds))))
    return {kind: sum(SIZE[k] for k in kinds if k == kind) for kind in SIZE}


def _pod_spec() -> dict:
    return {
        "schedulerName": "gpupool",
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",  # any image: no kubelet runs it
                "resources": {
                    "requests": {"cpu": "1", "memory": "2Gi"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
            }
        ],
    }


def _pod(name: str, owner: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
        meta["annotations"] = {"gpupool.io/min-available": str(GANG)}
    return {"metadata": meta, "spec": _pod_spec()}


def _job(name: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": JOB,
            "completions": JOB,
            "backoffLimit": 0,
            "template": {"spec": _pod_spec()},
        },
    }


def _operator(name: str) -> dict:
    """The controller reference an operator's pods carry (a PyTorchJob's)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": name,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _rounds(
    cluster: Cluster, kubeconfig: dict, api: k8s.ApiClient, namespaces: list[str], pods: int
) -> tuple[list[dict], dict[str, dict]]:
    """What the beat runs, each step measured, until every pod is bound: a reconcile pass
    (intake), a cycle, a reconcile pass (binding). A fresh backend per pass, as each of
    the beat's tasks makes one."""
    phases = {name: Cost() for name in PHASES}
    rounds: list[dict] = []
    server = _server_pid()
    server_cpu = dict.fromkeys(PHASES, 0.0)
    while len(rounds) < MAX_ROUNDS:
        row: dict[str, Any] = {"api_requests": 0}
        for name in PHASES:
            backend = KubernetesBackend(cluster, kubeconfig=kubeconfig)
            served = backend_cpu_s(server)
            with measured() as cost:
                if name == "cycle":
                    cycle_run()
                else:
                    cluster_reconcile(cluster, backend=backend)
            _add(phases[name], cost)
            if served is not None and (now := backend_cpu_s(server)) is not None:
                server_cpu[name] += now - served
            row[f"{name}_sql"] = cost.sql
            row[f"{name}_s"] = round(cost.wall_s, 3)
            row["api_requests"] += backend.requests
        rounds.append(row)
        if _bound(api, namespaces) >= pods:
            break
    return rounds, {name: _figures(cost, server_cpu[name]) for name, cost in phases.items()}


def _bound(api: k8s.ApiClient, namespaces: list[str]) -> int:
    """Pods of the bench bound to a node (spec.nodeName set): the bench's own check, not
    measured."""
    core = k8s.CoreV1Api(api)
    lists = [core.list_namespaced_pod(ns, _preload_content=False) for ns in namespaces]
    return sum(
        1
        for answer in lists
        for pod in json.loads(answer.data)["items"]
        if pod["spec"].get("nodeName")
    )


def _server_pid() -> int | None:
    """The fake API server: this process's only child (serve_in_process)."""
    children = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            children += (task / "children").read_text().split()
    return int(children[0]) if len(children) == 1 else None


def _sum(phases: dict[str, dict], key: str) -> float | None:
    """A figure over the phases; None when a phase could not measure it."""
    values = [phase[key] for phase in phases.values()]
    return None if None in values else round(sum(values), 3)


def _add(total: Cost, cost: Cost) -> None:
    total.wall_s += cost.wall_s
    total.cpu_s += cost.cpu_s
    total.sql += cost.sql
    if cost.db_cpu_s is not None:
        total.db_cpu_s = (total.db_cpu_s or 0.0) + cost.db_cpu_s


def _figures(cost: Cost, server_cpu_s: float | None) -> dict[str, Any]:
    return {
        "seconds": round(cost.wall_s, 3),
        "cpu_s": round(cost.cpu_s, 3),
        "db_cpu_s": None if cost.db_cpu_s is None else round(cost.db_cpu_s, 3),
        "api_server_cpu_s": None if server_cpu_s is None else round(server_cpu_s, 3),
        "sql": cost.sql,
    }
