"""Pods pass the `restricted` Pod Security level unless their workload needs root, and a pod
the cluster's admission refuses fails its workload with the API server's message, its
GPUs freed in the same pass, never retried. Runs against a real API server too."""

from __future__ import annotations

import pytest

from clusters.backends.kubernetes import KubernetesBackend
from clusters.models import Node
from clusters.reconcile import cluster_reconcile
from scheduling.models import WorkloadState
from scheduling.specs import clean_spec
from tests.clusters.conftest import admit, make_workload
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture

S = WorkloadState
pytestmark = pytest.mark.timeout(60)
ENFORCE = "pod-security.kubernetes.io/enforce"


def enforcing(kube, cluster, namespace: str, level: str) -> None:  # noqa: F811
    """The admin made the project's namespace, with a Pod Security level; GPUPool adopts it."""
    api = KubernetesBackend(cluster).api
    api.create_namespace({"metadata": {"name": namespace, "labels": {ENFORCE: level}}})


def job(org, name: str, **fields):
    fields.setdefault("command", ["sleep", "3600"])
    fields.setdefault("image", "registry.k8s.io/pause:3.10")
    return make_workload(org.project_a, org.researcher, name, **fields)


def pod_posts(kube) -> int:  # noqa: F811
    return sum(1 for m, p in kube.fake.requests if m == "POST" and p.endswith("/pods"))


def test_a_restricted_namespace_runs_default_pods_and_fails_root_ones_with_its_reason(
    kube,  # noqa: F811
    org,
):
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    namespace = org.project_a.namespace
    enforcing(kube, cluster, namespace, "restricted")
    plain = job(org, "plain")
    root = job(org, "root", spec={"run_as_root": True})
    admit(plain, nodes[0], pods=[{"gpu_indices": [0] if kube.fake else []}])
    admit(root, nodes[0], pods=[{"gpu_indices": [1] if kube.fake else []}])
    cluster_reconcile(cluster)
    plain.refresh_from_db()
    root.refresh_from_db()
    # Admitted by Pod Security as it is: non-root, no escalation, no capabilities, seccomp.
    api = KubernetesBackend(cluster).api
    made = api.read_namespaced_pod(k8s_name(cluster, f"gp-{plain.pk}-0"), namespace)
    assert made.spec.security_context.run_as_non_root is True
    assert made.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    container = made.spec.containers[0].security_context
    assert (container.allow_privilege_escalation, container.capabilities.drop) == (False, ["ALL"])
    # Refused: failed with what the API server said, its GPU released in the same call.
    assert root.state == S.FAILED
    message = root.events.last().message
    assert message.startswith("The pod cannot run: 403 Forbidden")
    assert 'violates PodSecurity "restricted:latest"' in message
    assert root.allocations.count() == 0
    if kube.fake:
        assert plain.state == S.RUNNING
        posts = pod_posts(kube)
        cluster_reconcile(cluster)
        assert pod_posts(kube) == posts  # not asked again


def test_a_workload_that_needs_root_runs_where_the_level_allows_it(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    enforcing(kube, cluster, org.project_a.namespace, "baseline")
    root = job(org, "root", spec={"run_as_root": True})
    admit(root, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    root.refresh_from_db()
    assert root.state == S.RUNNING
    pod = fake.pod(org.project_a.namespace, k8s_name(cluster, f"gp-{root.pk}-0"))
    assert "runAsNonRoot" not in pod["spec"]["securityContext"]
    assert "capabilities" not in pod["spec"]["containers"][0]["securityContext"]


def test_a_webhook_denial_fails_the_workload_with_the_webhooks_reason(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    fake.webhooks["policy.example.com"] = lambda pod: "images must come from registry.corp"
    workload = job(org, "unsigned")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.FAILED and workload.allocations.count() == 0
    assert workload.events.last().message == (
        'The pod cannot run: 403 Forbidden: admission webhook "policy.example.com" denied '
        "the request: images must come from registry.corp"
    )


def test_a_refused_reservation_fails_the_workloads_sharing_its_gpu(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)

    def no_reservations(pod):
        role = pod["metadata"]["labels"].get("gpupool.io/role")
        return "no GPU holders here" if role == "reservation" else None

    fake.webhooks["quota.example.com"] = no_reservations
    half = job(org, "half", gpu_request="fraction", gpus="0.5")
    admit(half, Node.objects.get(name="gpu-a"), pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    result = cluster_reconcile(cluster)
    half.refresh_from_db()
    assert half.state == S.FAILED and half.allocations.count() == 0
    assert "no GPU holders here" in half.events.last().message
    assert any("reservation pod for gpu-a GPU 0 refused" in e for e in result.errors)
    assert fake.pods() == []


def test_reservation_pods_run_under_a_priority_class_gpupool_makes_once(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)
    node = Node.objects.get(name="gpu-a")
    for name in ("a", "b"):
        shared = job(org, name, gpu_request="fraction", gpus="0.5")
        admit(shared, node, pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)  # a new backend: asks again, 409 says it is there
    [klass] = fake.objects["priorityclasses"].values()
    assert (klass["metadata"]["name"], klass["value"]) == ("gpupool-reservation", 1_000_000)
    assert klass["preemptionPolicy"] == "Never"
    posts = [p for m, p in fake.requests if m == "POST" and p.endswith("/priorityclasses")]
    assert len(posts) == 2
    # Someone deleted it, and the reservation with it, under a backend that made it: the
    # reservation is refused (403, no such class), and the next pass makes both again.
    backend = KubernetesBackend(cluster)
    cluster_reconcile(cluster, backend=backend)
    with fake.lock:
        fake.objects["priorityclasses"].clear()
        for key, pod in list(fake.objects["pods"].items()):
            if pod["metadata"]["labels"].get("gpupool.io/role") == "reservation":
                fake._delete("pods", *key)
    refused = cluster_reconcile(cluster, backend=backend)
    assert any("no PriorityClass with name gpupool-reservation" in e for e in refused.errors)
    cluster_reconcile(cluster, backend=backend)
    assert list(fake.objects["priorityclasses"]) == [("", "gpupool-reservation")]
    roles = [p["metadata"]["labels"]["gpupool.io/role"] for p in fake.pods()]
    assert sorted(roles) == ["reservation", "workload", "workload"]


def test_a_submission_declares_that_its_image_needs_root_as_a_boolean(db):  # node pools read
    base = {"image": "ubuntu:24.04", "command": ["apt-get", "update"]}
    cleaned, errors = clean_spec("training", "apt", {**base, "run_as_root": "true"})
    assert errors == {} and cleaned["spec"]["run_as_root"] is True
    cleaned, errors = clean_spec("training", "apt", base)
    assert errors == {} and "run_as_root" not in cleaned["spec"]
    _, errors = clean_spec("training", "apt", {**base, "run_as_root": "perhaps"})
    assert errors == {"run_as_root": ["Enter true or false."]}


def test_under_a_cluster_wide_restricted_default_every_gpupool_pod_is_admitted(kube, org):  # noqa: F811
    """With MPS off: an MPS sharer needs hostIPC and a hostPath (the next test)."""
    fake = kube.require_fake()
    fake.pod_security_default = "restricted"
    cluster = kube.cluster(mps=False)
    kube.nodes(cluster)
    node = Node.objects.get(name="gpu-a")
    whole, half = job(org, "whole"), job(org, "half", gpu_request="fraction", gpus="0.5")
    lab = job(org, "lab", kind="workspace", spec={"ports": [{"name": "http", "port": 8888}]})
    admit(whole, node, pods=[{"gpu_indices": [0]}])
    admit(half, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    admit(lab, node)
    for _ in range(3):  # the reservation, its device, the shared pod
        assert cluster_reconcile(cluster).errors == []
    for workload in (whole, half, lab):
        workload.refresh_from_db()
        assert workload.state == S.RUNNING, workload.name
    assert sorted(p["metadata"]["labels"]["gpupool.io/role"] for p in fake.pods()) == [
        "reservation",
        "workload",
        "workload",
        "workload",
    ]


def test_under_a_restricted_default_an_mps_sharer_is_refused_saying_what_to_change(kube, org):  # noqa: F811
    fake = kube.require_fake()
    fake.pod_security_default = "restricted"
    cluster = kube.cluster()
    kube.nodes(cluster)
    half = job(org, "half", gpu_request="fraction", gpus="0.5")
    admit(half, Node.objects.get(name="gpu-a"), pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    for _ in range(3):
        cluster_reconcile(cluster)
    half.refresh_from_db()
    assert half.state == S.FAILED
    event = half.events.filter(reason="PodFailed").get()
    assert "hostIPC" in event.message and "`mps: false`" in event.message
