"""Shared clusters: pods bound by anyone else (the default scheduler, another GPUPool, a
DaemonSet) take their GPUs, CPU and memory out of the node's free capacity, and GPUPool
never binds into what they hold. Foreign pods are made as kubectl would, with the official
client and `nodeName` set, against the in-suite API server."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.foreign import pod_requests
from clusters.backends.kubernetes.ownership import BOUND_BY_ANNOTATION, Owner
from clusters.inventory import inventory_sync
from clusters.models import Node, NodePool
from clusters.reconcile import cluster_reconcile
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_submit
from tests import factories as f
from tests.clusters.kube import kube  # noqa: F401 - the fixture

S = WorkloadState
pytestmark = pytest.mark.timeout(60)
GIB = 2**30


def test_a_pods_requests_are_counted_as_the_kubernetes_scheduler_counts_them():
    spec = {
        "initContainers": [
            # A plain init container runs alone before the others: only its peak counts.
            {"name": "setup", "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}},
            # A sidecar (restartable init container) runs beside the containers.
            {
                "name": "proxy",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
            },
        ],
        "containers": [
            {
                "name": "main",
                # Only limits: the API server defaults the requests to them.
                "resources": {"limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "2"}},
            },
            {"name": "log", "resources": {"requests": {"cpu": "250m", "memory": "1e9"}}},
        ],
        "overhead": {"cpu": "100m", "memory": "64Mi"},
    }
    got = pod_requests(spec)
    # cpu: max(2 + 0.25 + 0.5 sidecar, 6 init) + 0.1 overhead.
    assert float(got["cpu"]) == pytest.approx(6.1)
    # memory: max(8Gi + 1e9 + 256Mi, 1Gi) + 64Mi.
    assert got["memory"] == 8 * GIB + 10**9 + 256 * 2**20 + 64 * 2**20
    assert got["nvidia.com/gpu"] == 2


def test_a_quantity_the_api_server_would_refuse_counts_as_nothing():
    spec = {
        "containers": [{"name": "x", "resources": {"requests": {"cpu": "lots", "memory": "1Gi"}}}]
    }
    assert pod_requests(spec) == {"cpu": 0, "memory": GIB, "nvidia.com/gpu": 0}


def _api(kube) -> k8s.CoreV1Api:  # noqa: F811
    return k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))


def _pod(name: str, node: str | None, *, gpus: int = 0, cpu: str = "1", memory: str = "1Gi",
         labels: dict | None = None, annotations: dict | None = None) -> dict:  # fmt: skip
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    body = {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
                }
            ]
        },
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def test_inventory_stores_what_pods_gpupool_did_not_bind_hold(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    api = _api(kube)
    owner = KubernetesBackend(cluster).owner
    other = Owner(str(uuid.uuid4()), str(uuid.uuid4()))
    # The default scheduler's GPU pod, a DaemonSet's pod, another GPUPool's pod:
    api.create_namespaced_pod("default", _pod("train-x", "gpu-a", gpus=2, cpu="4", memory="16Gi"))
    api.create_namespaced_pod(
        "kube-system", _pod("dcgm-exporter-x", "gpu-a", cpu="100m", memory="128Mi")
    )
    api.create_namespaced_pod("default", _pod("theirs", "gpu-a", gpus=1, labels=other.labels))
    # ...and pods that hold nothing there: one finished, one not bound yet, a native pod
    # GPUPool bound itself, one of GPUPool's own.
    api.create_namespaced_pod("default", _pod("done", "gpu-a", gpus=4))
    fake.finish("default", "done")
    api.create_namespaced_pod("default", _pod("waiting", None, gpus=4))
    native = {BOUND_BY_ANNOTATION: owner.bound_by}
    api.create_namespaced_pod("default", _pod("native", "gpu-a", gpus=1, annotations=native))
    api.create_namespaced_pod("default", _pod("own", "gpu-a", gpus=1, labels=owner.labels))
    api.create_namespaced_pod("default", _pod("elsewhere", "gpu-b", cpu="500m", memory="512Mi"))
    inventory_sync(cluster)
    node = Node.objects.get(cluster=cluster, name="gpu-a")
    assert (node.foreign_gpus, node.foreign_cpu, node.foreign_memory_mib) == (
        3,
        Decimal("5.1"),
        17536,
    )
    assert node.foreign_pods == {
        "count": 3,
        "names": ["default/train-x", "default/theirs", "kube-system/dcgm-exporter-x"],
    }
    b = Node.objects.get(cluster=cluster, name="gpu-b")
    assert (b.foreign_gpus, b.foreign_cpu, b.foreign_memory_mib) == (0, Decimal("0.5"), 512)
    # Nothing changed: nothing written. A pod that is terminating still holds its share.
    version = node.version
    assert inventory_sync(cluster).written == 0
    fake.deferred_delete = True  # as a kubelet does: the pod stops within its grace period
    api.delete_namespaced_pod("train-x", "default", grace_period_seconds=30)
    assert fake.pod("default", "train-x")["metadata"].get("deletionTimestamp")
    assert inventory_sync(cluster).written == 0
    fake.complete_deletions()
    inventory_sync(cluster)
    node.refresh_from_db()
    assert (node.foreign_gpus, node.foreign_cpu, node.foreign_memory_mib) == (
        1,
        Decimal("1.1"),
        1152,
    )
    assert node.version != version  # the kept snapshot reads it again


def _one_node(kube, fake, name: str = "kube"):  # noqa: F811
    cluster = kube.cluster(name)
    if "gpu-b" in {n["metadata"]["name"] for n in fake.objects["nodes"].values()}:
        fake.remove_node("gpu-b")
    inventory_sync(cluster)
    return cluster


def _submit(org, project, name: str, gpus: int, pool: str, user=None) -> Workload:
    return workload_submit(
        actor=user or org.researcher,
        project=project,
        kind="training",
        name=name,
        image="pytorch/pytorch:2.3",
        command=["sleep", "600"],
        gpus=gpus,
        node_pools=[pool],
    )


def _refused(fake) -> list[str]:
    """Pods the node's kubelet refused for want of GPUs (a real one: OutOfnvidia.com/gpu)."""
    return [p["metadata"]["name"] for p in fake.pods() if p["status"].get("phase") == "Failed"]


def test_gpus_a_default_scheduler_pod_holds_are_never_booked(kube, org):  # noqa: F811
    fake = kube.require_fake()
    api = _api(kube)
    api.create_namespaced_pod("default", _pod("their-job", "gpu-a", gpus=6))
    cluster = _one_node(kube, fake)
    first = _submit(org, org.project_a, "first", 2, "a100")
    second = _submit(org, org.project_a, "second", 2, "a100")
    cycle_run()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == (S.ADMITTED, S.PENDING)
    assert second.pending_reason == "Needs 2 GPUs in pool a100; 0 are free"
    cluster_reconcile(cluster)
    first.refresh_from_db()
    assert first.state == S.RUNNING and _refused(fake) == []
    # The other pod finishes: its GPUs are GPUPool's to give at the next sync.
    fake.finish("default", "their-job")
    inventory_sync(cluster)
    cycle_run()
    second.refresh_from_db()
    assert second.state == S.ADMITTED


def test_the_pending_reason_counts_only_what_others_leave_free(kube, org):  # noqa: F811
    fake = kube.require_fake()
    _api(kube).create_namespaced_pod("default", _pod("their-job", "gpu-a", gpus=6))
    _one_node(kube, fake)
    big = _submit(org, org.project_a, "big", 3, "a100")
    cycle_run()
    big.refresh_from_db()
    assert big.state == S.PENDING
    assert big.pending_reason == "Needs 3 GPUs in pool a100; 2 are free"


def test_two_gpupool_installations_on_one_node_never_overbook_it(kube, org):  # noqa: F811
    """Two Cluster records on one cluster: each other's pods are foreign, as another
    installation's would be (its identity labels differ)."""
    fake = kube.require_fake()
    one = _one_node(kube, fake, "one")
    two = kube.cluster("two")
    inventory_sync(two)
    their_pool = NodePool.objects.get(cluster=two)
    f.make_department_quota(org.dept_b, their_pool, gpus=8)
    f.make_project_quota(org.project_b, their_pool, gpus=8)
    big = _submit(org, org.project_a, "big", 6, "a100")
    cycle_run()
    cluster_reconcile(one)
    inventory_sync(two)  # sees the first record's six GPUs as someone else's
    assert Node.objects.get(cluster=two).foreign_gpus == 6
    theirs = [
        _submit(org, org.project_b, f"t{i}", 2, their_pool.name, org.outsider) for i in (1, 2)
    ]
    cycle_run()
    states = []
    for wl in (big, *theirs):
        wl.refresh_from_db()
        states.append(wl.state)
    assert states == [S.RUNNING, S.ADMITTED, S.PENDING]
    cluster_reconcile(two)
    inventory_sync(one)  # and the first record sees the second's two
    assert Node.objects.get(cluster=one).foreign_gpus == 2
    held = sum(
        int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
        for p in fake.pods()
        for c in p["spec"]["containers"]
        if p["status"].get("phase") != "Failed"
    )
    assert held == 8 and _refused(fake) == []
    # The first record's next workload finds the node full.
    late = _submit(org, org.project_a, "late", 1, "a100")
    cycle_run()
    late.refresh_from_db()
    assert late.state == S.PENDING
