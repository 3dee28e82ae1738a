"""Scheduling fixtures: a cluster of GPU nodes written straight into the inventory tables,
and a `submit` helper with sensible defaults for training jobs."""

from __future__ import annotations

import pytest

from clusters.models import Cluster, Gpu, Node
from scheduling.services import workload_submit


def make_nodes(pool, count: int, gpus: int = 4, *, cluster_name: str = "sim", **node_extra):
    cluster, _ = Cluster.objects.get_or_create(name=cluster_name, defaults={"backend": "simulated"})
    nodes = []
    start = Node.objects.filter(cluster=cluster).count()
    for i in range(start, start + count):
        node = Node.objects.create(
            cluster=cluster,
            name=f"{pool.name}-node-{i}",
            pool=pool,
            cpu_cores=64,
            memory_mib=512 * 1024,
            **node_extra,
        )
        Gpu.objects.bulk_create(
            Gpu(node=node, index=g, model="A100", memory_mib=81920) for g in range(gpus)
        )
        nodes.append(node)
    return nodes


@pytest.fixture(autouse=True)
def _cycles_run_by_hand(request, monkeypatch):
    """Scheduling tests drive cycles and reconciliation themselves, step by step, so the
    cycle and reconcile that services ask for on commit are not run in-process here.
    End-to-end tests (marked `services`) hand those tasks to a real worker instead."""
    if request.node.get_closest_marker("services"):
        return
    from clusters.tasks import reconcile_cluster
    from scheduling.tasks import run_cycle

    for task in (run_cycle, reconcile_cluster):
        monkeypatch.setattr(task, "delay", lambda *args, **kwargs: None)
        monkeypatch.setattr(task, "apply_async", lambda *args, **kwargs: None)


@pytest.fixture
def cluster(org):
    """Two nodes of four A100s each in pool a100 (8 GPUs; departments deserve 8 each)."""
    return make_nodes(org.pool, 2, 4)


@pytest.fixture
def submit():
    def _submit(actor, project, name, **spec):
        spec.setdefault("image", "pytorch/pytorch:2.3")
        spec.setdefault("command", ["python", "train.py"])
        kind = spec.pop("kind", "training")
        return workload_submit(actor=actor, project=project, kind=kind, name=name, **spec)

    return _submit


def outgrown(submit, actor, project, name, *, gpus, **spec):
    """Work that no node can hold any more: queued while its pool had a larger node, since
    gone (a submit asking for more than every node is refused, so it is grown after)."""
    from scheduling.models import Workload

    workload = submit(actor, project, name, gpus=1, **spec)
    Workload.objects.filter(pk=workload.pk).update(gpus=gpus)
    workload.refresh_from_db()
    return workload
