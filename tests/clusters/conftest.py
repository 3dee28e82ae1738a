"""Builders for cluster tests: clusters, nodes with GPUs, and workloads admitted onto them."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.cache import cache

from clusters.agent.main import mps_running
from clusters.backends import cgroups, sandbox
from clusters.metrics.api import agent_pods
from clusters.models import Backend, Cluster, Gpu, Node, NodePool
from clusters.mps_report import mps_report_store
from scheduling.models import PodAllocation, Workload, WorkloadState


@pytest.fixture(autouse=True)
def _var_dir(settings, tmp_path):
    """Each test gets its own var/: local pod records, logs and work folders."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    # Locks and rate limits live in the cache: a fresh one per test.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    cache.clear()
    yield
    forget_namespaces(settings.VAR_DIR)
    forget_cgroups(settings.VAR_DIR)


def forget_cgroups(var_dir: Path) -> None:
    """The cgroups of pods a test left finished (their records go with its var/): removed
    once their last process is reaped (a moment after a pod's end)."""
    deadline = time.monotonic() + 2
    while not cgroups.installation_remove(var_dir) and time.monotonic() < deadline:
        time.sleep(0.1)


def forget_namespaces(var_dir: Path) -> None:
    """The network namespaces local pods of a test left mounted under its var/ (a pod that
    finished keeps its gang's until it is deleted): unmounted, so that no mount outlives the
    test's folder."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = Path(line.split()[4])
        if " - nsfs " in line and target.is_relative_to(var_dir):
            sandbox.netns_remove(target)


def make_cluster(name: str = "local", backend: str = Backend.LOCAL, **extra) -> Cluster:
    return Cluster.objects.create(name=name, backend=backend, **extra)


def make_node(cluster: Cluster, name: str, *, gpus: int = 0, pool: NodePool | None = None) -> Node:
    node = Node.objects.create(cluster=cluster, name=name, pool=pool, cpu_cores=8)
    for index in range(gpus):
        Gpu.objects.create(
            node=node, index=index, uuid=f"GPU-{name}-{index}", model="A100", memory_mib=81920
        )
    return node


def make_workload(project, user, name: str, **fields) -> Workload:
    fields.setdefault("kind", "training")
    return Workload.objects.create(project=project, submitted_by=user, name=name, **fields)


def admit(workload: Workload, node: Node, *, pods: list[dict] | None = None) -> Workload:
    """What the cycle does on admission: allocation rows, then state ADMITTED."""
    for index, extra in enumerate(pods or [{}]):
        share = extra.get("gpu_share")
        PodAllocation.objects.create(
            workload=workload,
            pod_index=index,
            node=extra.get("node", node),
            gpu_indices=extra.get("gpu_indices", []),
            shared_gpu_index=extra.get("shared_gpu_index"),
            gpu_share=Decimal(str(share)) if share is not None else None,
            mig_gpu_index=extra.get("mig_gpu_index"),
            mig_profile=extra.get("mig_profile", ""),
            mig_start=extra.get("mig_start"),
        )
    workload.state = WorkloadState.ADMITTED
    workload.save(update_fields=["state"])
    return workload


class _Up:
    """A node agent's MPS daemons, each one up."""

    def pid(self, device: str) -> int:
        return 1


def agents_report(cluster: Cluster) -> None:
    """What each node's agent does after it synced its MPS daemons (all came up): say which
    run, for the allocations its pods endpoint listed (clusters/mps_report.py): a native
    sharer is bound only then."""
    for node in Node.objects.filter(cluster=cluster):
        mps_report_store(node, {"running": mps_running(agent_pods(node.pk), _Up())})
