"""Reconciliation against Kubernetes through the official client (fake or real API server)."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.fernet import Fernet
from kubernetes import watch

from clusters.backends import BackendError, PodPhase, get_backend
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.manifests import reservation_name
from clusters.crypto import KubeconfigKeyMissing, kubeconfig_decrypt
from clusters.models import Node, installation_uid
from clusters.reconcile import cluster_reconcile
from clusters.tasks import sync_inventory
from scheduling.lifecycle import workload_transition
from scheduling.models import PodAllocation, WorkloadPolicy, WorkloadState
from tests.clusters.conftest import admit, make_workload
from tests.clusters.kube import KUBELET_WAIT_S, k8s_name, kube  # noqa: F401 - the fixture

S = WorkloadState
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def setup(kube, org):  # noqa: F811
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    return cluster, nodes


def reserve_name(cluster, node: str, index: int) -> str:
    return reservation_name(KubernetesBackend(cluster).owner, node, index)


def posts(fake, fragment: str) -> int:
    return sum(1 for method, path in fake.requests if method == "POST" and path.endswith(fragment))


def training(org, name: str, **fields):
    fields.setdefault("command", ["sh", "-c", "sleep 3600"])
    return make_workload(org.project_a, org.researcher, name, **fields)


def test_the_kubeconfig_is_stored_encrypted_and_needs_the_key(kube, settings):  # noqa: F811
    cluster = kube.cluster()
    assert "server" not in cluster.kubeconfig_encrypted
    assert "server" in kubeconfig_decrypt(cluster.kubeconfig_encrypted)
    settings.GPUPOOL_KUBECONFIG_KEY = ""
    with pytest.raises(KubeconfigKeyMissing):
        kubeconfig_decrypt(cluster.kubeconfig_encrypted)


def test_inventory_reads_gpus_models_pools_and_topology_from_node_labels(kube, org):  # noqa: F811
    fake = kube.require_fake()
    fake.add_node("cordoned", gpus=4, unschedulable=True, labels={"gpupool.io/node-pool": "a100"})
    fake.add_node("notready", gpus=4, ready=False, labels={"gpupool.io/node-pool": "a100"})
    for name, effect in [("drained", "NoExecute"), ("reserved", "NoSchedule")]:
        taint = {"key": "example.com/maintenance", "value": "yes", "effect": effect}
        fake.add_node(name, gpus=4, taints=[taint], labels={"gpupool.io/node-pool": "a100"})
    gpu_only = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    soft = {"key": "example.com/busy", "effect": "PreferNoSchedule"}
    fake.add_node("gpu-tainted", gpus=4, taints=[gpu_only, soft])
    cluster = kube.cluster()
    assert "7 nodes" in get_backend(cluster).test_connection()
    kube.nodes(cluster)
    node = Node.objects.get(name="gpu-a")
    assert (node.pool, node.topology, float(node.cpu_cores)) == (org.pool, {"rack": "r1"}, 96.0)
    assert node.memory_mib == 1056 * 1024
    assert [(g.index, g.model, g.memory_mib) for g in node.gpus.all()][:2] == [
        (0, "NVIDIA-A100-SXM4-80GB", 81920),
        (1, "NVIDIA-A100-SXM4-80GB", 81920),
    ]
    assert not Node.objects.get(name="cordoned").schedulable
    assert not Node.objects.get(name="notready").schedulable
    # Taints GPUPool's pods do not tolerate keep them off; the GPU taint they tolerate does not.
    assert not Node.objects.get(name="drained").schedulable
    assert not Node.objects.get(name="reserved").schedulable
    assert Node.objects.get(name="gpu-tainted").schedulable
    reasons = dict(Node.objects.values_list("name", "unschedulable_reason"))
    assert reasons == {
        "gpu-a": "",
        "gpu-b": "",
        "cordoned": "cordoned",
        "notready": "NotReady",
        "drained": "tainted example.com/maintenance:NoExecute",
        "reserved": "tainted example.com/maintenance:NoSchedule",
        "gpu-tainted": "",
    }


def test_reconcile_creates_pinned_labelled_pods_once_and_deletes_them_on_stop(kube, setup, org):  # noqa: F811
    cluster, nodes = setup
    gpus = [0, 1] if kube.fake else []  # a real test cluster may have no GPUs to give
    workload = training(org, "train", pods=2, env={"EPOCHS": "3"})
    admit(
        workload, nodes[0], pods=[{"gpu_indices": gpus}, {"gpu_indices": gpus, "node": nodes[-1]}]
    )
    cluster_reconcile(cluster)
    backend = KubernetesBackend(cluster)
    names = [f"gp-{workload.pk}-0", f"gp-{workload.pk}-1"]
    first = {name: s.backend_ref for name, s in backend.pod_statuses().items()}
    assert sorted(first) == names
    namespace = org.project_a.namespace
    pod = backend.api.read_namespaced_pod(k8s_name(cluster, names[0]), namespace)
    assert pod.spec.node_name == nodes[0].name
    container = pod.spec.containers[0]
    assert (container.resources.limits or {}).get("nvidia.com/gpu") == ("2" if gpus else None)
    env = {e.name: e.value for e in container.env}
    assert env["EPOCHS"] == "3" and env["GPUPOOL_WORKLOAD_ID"] == str(workload.pk)
    assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "gpupool"
    assert pod.metadata.labels["gpupool.io/installation"] == installation_uid()
    assert pod.metadata.labels["gpupool.io/cluster"] == str(cluster.uid)
    made = backend.api.read_namespace(namespace)
    assert made.metadata.labels["gpupool.io/project"] == "ml-vision"
    assert made.metadata.annotations["gpupool.io/cluster"] == str(cluster.uid)
    cluster_reconcile(cluster)  # the second pass re-creates nothing: same pods, same uids
    again = {name: s.backend_ref for name, s in KubernetesBackend(cluster).pod_statuses().items()}
    assert again == first
    if kube.fake:
        assert posts(kube.fake, "/pods") == 2
        workload.refresh_from_db()
        assert workload.state == S.RUNNING
        assert set(workload.allocations.values_list("phase", flat=True)) == {"Running"}
    workload.refresh_from_db()
    if workload.state in (S.ADMITTED, S.RUNNING):
        workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    if workload.allocations.exists():  # asked to stop: terminating until a kubelet confirms
        assert all(s.terminating for s in KubernetesBackend(cluster).pod_statuses().values())
    kube.require_kubelet("its pods stop only when a kubelet confirms")
    deadline = time.monotonic() + KUBELET_WAIT_S
    while workload.allocations.exists() and time.monotonic() < deadline:
        cluster_reconcile(cluster)
        time.sleep(0 if kube.fake else 1)
    assert not workload.allocations.exists()
    assert KubernetesBackend(cluster).pod_statuses() == {}


def test_a_finished_pod_sets_the_exit_code_and_frees_the_gpus(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = training(org, "fails")
    admit(workload, nodes[0], pods=[{"gpu_indices": [2]}])
    cluster_reconcile(cluster)
    fake.finish("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"), exit_code=3)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.exit_code) == (S.FAILED, 3)
    assert workload.allocations.count() == 0
    assert fake.pods() == []


def test_preemption_deletes_gracefully_and_requeues_once_the_pod_is_gone(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    fake.deferred_delete = True
    cluster, nodes = setup
    cluster.config["grace_period_s"] = 45
    cluster.save()
    workload = training(org, "victim", checkpoint_dir="/ckpt/victim")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    cause = "Reclaimed for project b's guaranteed quota: b/x needs 1 GPU."
    workload_transition(workload, S.PREEMPTED, reason="Preempted:reclaim", message=cause)
    cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 45
    assert workload.allocations.get().phase == "Terminating"  # GPU still held
    cluster_reconcile(cluster)
    deletes = [p for m, p in fake.requests if m == "DELETE" and "/pods/" in p]
    assert len(deletes) == 1  # not asked again while it shuts down
    fake.complete_deletions()
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (S.PENDING, 1)
    assert workload.allocations.count() == 0
    assert requeued(workload) == (
        "Stopped by GPUPool: Reclaimed for project b's guaranteed quota: b/x needs 1 GPU; "
        "requeued. It will resume from /ckpt/victim."
    )


def requeued(workload) -> str:
    """The message of its last requeue: who stopped its pods."""
    return workload.events.filter(reason="Requeued").last().message


def test_a_pod_deleted_outside_gpupool_is_requeued_as_deleted_not_preempted(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = training(org, "drained")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}, {"gpu_indices": [1]}])
    cluster_reconcile(cluster)
    name = k8s_name(cluster, f"gp-{workload.pk}-1")
    KubernetesBackend(cluster).api.delete_namespaced_pod(name, "gp-ml-vision")  # kubectl
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (S.PENDING, 1)
    said = f"Pod gp-{workload.pk}-1 was deleted outside GPUPool (kubectl delete, a drain)"
    assert workload.events.get(reason="PodLost").message == said + "."
    assert requeued(workload) == said + "; requeued."
    assert fake.pods() == []


def test_a_lost_node_requeues_its_workloads_and_becomes_unschedulable(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    lost = training(org, "on-b")
    kept = training(org, "on-a")
    admit(lost, Node.objects.get(name="gpu-b"), pods=[{"gpu_indices": [0]}])
    admit(kept, Node.objects.get(name="gpu-a"), pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    fake.remove_node("gpu-b")
    cluster_reconcile(cluster)
    lost.refresh_from_db()
    kept.refresh_from_db()
    assert (lost.state, lost.restart_count, lost.allocations.count()) == (S.PENDING, 1, 0)
    assert requeued(lost) == "Pods lost on gpu-b; requeued."
    assert kept.state == S.RUNNING
    kube.nodes(cluster)
    assert Node.objects.get(name="gpu-b").schedulable is False


def test_transient_500s_are_retried_and_nothing_is_duplicated(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.inject("500", 2, method="POST", path="/pods")
    fake.inject("500", 1, method="GET", path="/api/v1/pods")
    workload = training(org, "retried")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    assert len(fake.pods()) == 1
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_a_persistent_500_keeps_the_allocation_and_the_next_pass_repairs_it(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.inject("500", 100, method="POST", path="/pods")
    workload = training(org, "later")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    result = cluster_reconcile(cluster)
    assert result.errors and "500" in result.errors[0]
    cluster.refresh_from_db()
    assert cluster.reachable and "500" in cluster.last_error
    assert workload.allocations.count() == 1 and fake.pods() == []
    fake.faults.clear()
    cluster_reconcile(cluster)
    assert len(fake.pods()) == 1
    cluster.refresh_from_db()
    assert cluster.last_error == ""


def test_a_timed_out_create_that_did_happen_is_adopted_not_duplicated(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.inject("timeout", 1, method="POST", path="/pods")
    workload = training(org, "slow")
    admit(workload, nodes[0], pods=[{"gpu_indices": [1]}])
    cluster_reconcile(cluster)
    assert posts(fake, "/pods") == 2  # the retry met 409 AlreadyExists and adopted the pod
    assert len(fake.pods()) == 1
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_an_injected_409_is_retried_on_the_next_pass(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.inject("409", 1, method="POST", path="/pods")
    workload = training(org, "conflicted")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    first = cluster_reconcile(cluster)
    assert fake.pods() == [] and "conflict" in first.errors[0]
    cluster_reconcile(cluster)
    assert len(fake.pods()) == 1


def test_pods_gpupool_did_not_create_are_never_touched(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace("gp-ml-vision")
    workload = training(org, "squatted")
    squatter = {
        "metadata": {"name": k8s_name(cluster, f"gp-{workload.pk}-0")},
        "spec": {"containers": [{"name": "x", "image": "x"}]},
    }
    stranger = {
        "metadata": {"name": "someone-elses"},
        "spec": {"containers": [{"name": "x", "image": "x"}]},
    }
    backend.api.create_namespaced_pod("gp-ml-vision", squatter)
    backend.api.create_namespaced_pod("gp-ml-vision", stranger)
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    result = cluster_reconcile(cluster)
    assert "did not create" in result.errors[0]
    workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    assert sorted(p["metadata"]["name"] for p in fake.pods()) == [
        k8s_name(cluster, f"gp-{workload.pk}-0"),
        "someone-elses",
    ]


def test_an_unreachable_cluster_is_marked_and_its_workloads_kept_until_it_is_back(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = training(org, "patient")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    fake.down = True
    result = cluster_reconcile(cluster)
    assert result.reachable is False
    cluster.refresh_from_db()
    workload.refresh_from_db()
    assert cluster.reachable is False and cluster.last_error
    assert workload.state == S.RUNNING and workload.allocations.count() == 1
    fake.down = False
    cluster_reconcile(cluster)
    cluster.refresh_from_db()
    assert cluster.reachable is True and cluster.last_error == ""
    assert len(fake.pods()) == 1


def test_fractions_share_one_reservation_pod_per_gpu_on_the_device_it_holds(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, _ = setup
    node = Node.objects.get(name="gpu-a")
    whole = training(org, "whole")
    first = training(org, "half-a", gpu_request="fraction", gpus="0.5")
    second = training(org, "half-b", gpu_request="fraction", gpus="0.5")
    admit(whole, node, pods=[{"gpu_indices": [0, 1]}])
    admit(first, node, pods=[{"shared_gpu_index": 3, "gpu_share": 0.5}])
    admit(second, node, pods=[{"shared_gpu_index": 3, "gpu_share": 0.5}])
    cluster_reconcile(cluster)
    # Pass 1 starts the reservation; the shared pods wait until its device is known.
    [reservation] = [
        p for p in fake.pods() if p["metadata"]["labels"]["gpupool.io/role"] == "reservation"
    ]
    reserved = reserve_name(cluster, "gpu-a", 3)
    assert reservation["metadata"]["name"] == reserved
    assert reservation["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # Guaranteed, and above every sharer: a node under pressure evicts the sharers first.
    assert reservation["status"]["qosClass"] == "Guaranteed"
    assert reservation["spec"]["priority"] == 1_000_000
    assert fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{first.pk}-0")) is None
    cluster_reconcile(cluster)
    # The device plugin handed out devices in the order pods came: the reservation got
    # device 0, not the index 3 the cycle numbered; the shared pods follow the device.
    annotations = fake.pod("gpupool-system", reserved)["metadata"]["annotations"]
    assert annotations["gpupool.io/gpu-uuid"] == "GPU-gpu-a-0"
    for workload in (first, second):
        shared = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))["spec"][
            "containers"
        ][0]
        env = {e["name"]: e["value"] for e in shared["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-a-0"
        assert env["GPUPOOL_GPU_FRACTION"] == "0.5"
        assert "nvidia.com/gpu" not in shared["resources"]["limits"]
    logs_read = sum(1 for m, p in fake.requests if p.endswith(f"{reserved}/log"))
    cluster_reconcile(cluster)
    assert sum(1 for m, p in fake.requests if p.endswith(f"{reserved}/log")) == logs_read
    for workload in (whole, first, second):
        workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)  # the reservation goes once no shared pod is left
    assert fake.pods() == []


def test_a_reservation_is_kept_while_a_shared_pod_is_still_shutting_down(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, _ = setup
    node = Node.objects.get(name="gpu-b")
    shared = training(org, "slow-half", gpu_request="fraction", gpus="0.5")
    admit(shared, node, pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)
    fake.deferred_delete = True
    workload_transition(shared, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)
    assert fake.pod("gpupool-system", reserve_name(cluster, "gpu-b", 0)) is not None
    fake.complete_deletions()
    cluster_reconcile(cluster)
    assert fake.pods() == []
    assert shared.allocations.count() == 0


def test_workloads_with_ports_get_a_service_and_an_endpoint(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = training(
        org, "notebook", kind="workspace", spec={"ports": [{"name": "http", "port": 8888}]}
    )
    admit(workload, nodes[0])
    cluster_reconcile(cluster)
    [service] = fake.services()
    name = k8s_name(cluster, f"gp-{workload.pk}-0")
    assert service["spec"]["selector"] == {
        "gpupool.io/pod": f"gp-{workload.pk}-0",
        "gpupool.io/installation": installation_uid(),
        "gpupool.io/cluster": str(cluster.uid),
    }
    assert workload.allocations.get().endpoint == f"{name}.gp-ml-vision.svc:8888"
    workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    assert fake.services() == []


def test_pods_can_be_pinned_with_a_binding_instead_of_node_name(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster(pin="binding")
    nodes = kube.nodes(cluster)
    workload = training(org, "bound")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    assert pod["spec"]["nodeName"] == nodes[0].name and pod["spec"]["schedulerName"] == "gpupool"
    assert posts(fake, "/binding") == 1
    assert get_backend(cluster).pod_statuses()[f"gp-{workload.pk}-0"].phase == PodPhase.RUNNING


def test_list_and_watch_follow_pods_and_an_expired_version_is_gone(kube, setup):  # noqa: F811
    fake = kube.require_fake()
    cluster, _ = setup
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace("watched")
    listed = backend.api.list_namespaced_pod("watched")
    body = {
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "c", "image": "x"}]},
    }
    backend.api.create_namespaced_pod("watched", body)
    backend.api.delete_namespaced_pod("p", "watched")
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            backend.api.list_namespaced_pod,
            "watched",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
    ]
    assert events == [("ADDED", "p"), ("DELETED", "p")]
    fake.history.clear()
    fake.history.append((fake.last_rv, "pods", "ADDED", {"metadata": {}}))
    with pytest.raises(Exception, match="410"):
        list(
            watch.Watch().stream(
                backend.api.list_namespaced_pod, "watched", resource_version="1", timeout_seconds=1
            )
        )


def test_pod_status_is_read_and_written_with_conflicts_on_stale_versions(kube, setup):  # noqa: F811
    kube.require_fake()
    from kubernetes.client.exceptions import ApiException

    cluster, _ = setup
    api = KubernetesBackend(cluster).api
    KubernetesBackend(cluster).ensure_namespace("st")
    body = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = api.create_namespaced_pod("st", body)
    assert api.read_namespaced_pod_status("p", "st").status.phase == "Pending"
    api.patch_namespaced_pod_status("p", "st", {"status": {"phase": "Running"}})
    assert api.read_namespaced_pod("p", "st").status.phase == "Running"
    stale = {
        "metadata": {"name": "p", "resourceVersion": created.metadata.resource_version},
        "status": {"phase": "Failed"},
    }
    with pytest.raises(ApiException) as err:
        api.replace_namespaced_pod_status("p", "st", stale)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        api.create_namespaced_pod("st", body)
    assert (err.value.status, json.loads(err.value.body)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as err:
        api.read_namespaced_pod("nope", "st")
    assert err.value.status == 404


def test_a_manifest_the_api_server_rejects_fails_the_workload_with_its_message(kube, setup, org):  # noqa: F811
    cluster, nodes = setup
    # Kubernetes 1.30+ takes any printable ASCII but "=" in a variable's name.
    workload = training(org, "bad-env", env={"A=B": "x"})
    admit(workload, nodes[0])
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.FAILED
    message = workload.events.last().message
    assert message.startswith("The pod cannot run: 422") and "A=B" in message
    assert workload.allocations.count() == 0


def test_a_pod_evicted_by_its_node_requeues_the_workload_instead_of_failing_it(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = training(org, "evicted")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    with fake.lock:
        stored = fake.objects["pods"][("gp-ml-vision", pod["metadata"]["name"])]
        stored["status"] = {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (S.PENDING, 1)
    assert requeued(workload) == (
        f"Pod gp-{workload.pk}-0 was evicted by the kubelet on gpu-a: Evicted: low on memory; "
        "requeued."
    )
    assert fake.pods() == []


def test_stopped_pods_are_deleted_with_their_policy_grace_period_else_the_clusters(
    kube,  # noqa: F811
    setup,
    org,
):
    fake = kube.require_fake()
    fake.deferred_delete = True
    cluster, nodes = setup
    cluster.config["grace_period_s"] = 45
    cluster.save()
    WorkloadPolicy.objects.create(department=org.dept_a, termination_grace_s=120)
    WorkloadPolicy.objects.create(project=org.project_a, termination_grace_s=7)
    own = training(org, "own-policy")
    inherited = make_workload(org.project_a2, org.researcher, "dept-policy", command=["sleep"])
    default = make_workload(org.project_b, org.outsider, "no-policy", command=["sleep"])
    for index, workload in enumerate((own, inherited, default)):
        admit(workload, nodes[0], pods=[{"gpu_indices": [index]}])
    cluster_reconcile(cluster)
    manifests = {
        w.name: fake.pod(w.project.namespace, k8s_name(cluster, f"gp-{w.pk}-0"))
        for w in (own, default)
    }
    assert manifests["own-policy"]["spec"]["terminationGracePeriodSeconds"] == 7
    assert "terminationGracePeriodSeconds" not in manifests["no-policy"]["spec"]
    for workload in (own, inherited, default):
        workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    graces = {
        w.name: fake.pod(w.project.namespace, k8s_name(cluster, f"gp-{w.pk}-0"))["metadata"][
            "deletionGracePeriodSeconds"
        ]
        for w in (own, inherited, default)
    }
    assert graces == {"own-policy": 7, "dept-policy": 120, "no-policy": 45}
    fake.complete_deletions()
    cluster_reconcile(cluster)
    assert PodAllocation.objects.count() == 0


def test_a_pod_deleted_with_grace_0_releases_its_gpus_in_the_same_pass(kube, setup, org):  # noqa: F811
    """A real API server answers a grace-0 delete with the pod marked for deletion
    (deletionTimestamp, deletionGracePeriodSeconds 0) though it is gone already."""
    fake = kube.require_fake()
    fake.deferred_delete = True  # only the kubelet's confirmation ends a graceful delete
    cluster, nodes = setup
    WorkloadPolicy.objects.create(project=org.project_a, termination_grace_s=0)
    workload = training(org, "no-grace")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    workload_transition(workload, S.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    assert fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0")) is None
    assert PodAllocation.objects.count() == 0  # not a pass later


def test_a_workspace_data_volume_is_mounted_at_the_notebook_directory(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    volume = {"name": "data", "claim": "rita-notebooks", "mount_path": "/data"}
    workspace = training(
        org,
        "lab",
        kind="workspace",
        spec={"ports": [{"name": "http", "port": 8888}], "volumes": [volume]},
    )
    datasets = {"name": "datasets", "claim": "imagenet", "mount_path": "/datasets"}
    job = training(org, "reader", spec={"volumes": [{**datasets, "read_only": True}]})
    admit(workspace, nodes[0])
    admit(job, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workspace.pk}-0"))["spec"]
    assert pod["volumes"] == [
        {
            "name": "data",
            "persistentVolumeClaim": {"claimName": "rita-notebooks", "readOnly": False},
        }
    ]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data", "readOnly": False}
    ]
    reader = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{job.pk}-0"))["spec"]
    assert reader["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "imagenet",
        "readOnly": True,
    }
    assert reader["containers"][0]["volumeMounts"][0]["mountPath"] == "/datasets"
    workspace.refresh_from_db()
    assert workspace.state == S.RUNNING


def test_a_volume_the_api_server_refuses_fails_the_workload_with_its_message(kube, setup, org):  # noqa: F811
    kube.require_fake()
    cluster, nodes = setup
    bad = {"name": "Not_A_Label", "claim": "c", "mount_path": "/x"}
    workload = training(org, "bad-volume", spec={"volumes": [bad]})
    admit(workload, nodes[0])
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.FAILED
    assert 'spec.volumes.name: Invalid value: "Not_A_Label"' in workload.events.last().message


def test_a_service_that_failed_after_its_pod_is_created_on_the_next_pass(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.inject("500", 100, method="POST", path="/services")
    workload = training(
        org, "lab", kind="workspace", spec={"ports": [{"name": "http", "port": 8888}]}
    )
    admit(workload, nodes[0])
    result = cluster_reconcile(cluster)
    assert len(fake.pods()) == 1 and fake.services() == []
    assert any("service" in error for error in result.errors)
    fake.faults.clear()
    cluster_reconcile(cluster)
    [service] = fake.services()
    assert service["metadata"]["name"] == k8s_name(cluster, f"gp-{workload.pk}-0")
    assert posts(fake, "/pods") == 1  # the pod was not made again
    made = posts(fake, "/services")
    cluster_reconcile(cluster)
    assert posts(fake, "/services") == made  # repaired once, then left alone


def test_a_service_left_without_its_pod_is_deleted_and_strangers_are_not(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace("gp-ml-vision")
    ours = {
        "metadata": {"name": k8s_name(cluster, "gp-999-0"), "labels": backend.owner.labels},
        "spec": {"selector": {"gpupool.io/pod": "gp-999-0"}, "ports": [{"port": 80}]},
    }
    theirs = {"metadata": {"name": "gp-998-0"}, "spec": {"ports": [{"port": 80}]}}
    # Another GPUPool's (no identities of ours): never deleted, though managed by gpupool.
    other = {
        "metadata": {"name": "gp-997-0", "labels": {"app.kubernetes.io/managed-by": "gpupool"}},
        "spec": {"selector": {"gpupool.io/pod": "gp-997-0"}, "ports": [{"port": 80}]},
    }
    for service in (ours, theirs, other):
        backend.api.create_namespaced_service("gp-ml-vision", service)
    cluster_reconcile(cluster)
    assert sorted(s["metadata"]["name"] for s in fake.services()) == ["gp-997-0", "gp-998-0"]


def test_a_namespace_the_cluster_refuses_holds_back_only_its_projects_pods(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    fake.forbidden_namespaces.add(org.project_a.namespace)
    refused = training(org, "refused")
    admit(refused, nodes[0], pods=[{"gpu_indices": [0]}])
    other = make_workload(org.project_b, org.researcher, "other", command=["sleep", "60"])
    admit(other, nodes[0], pods=[{"gpu_indices": [1]}])
    result = cluster_reconcile(cluster)
    assert [p["metadata"]["namespace"] for p in fake.pods()] == [org.project_b.namespace]
    assert any("403" in error for error in result.errors)
    cluster.refresh_from_db()
    assert cluster.reachable and "403" in cluster.last_error
    refused.refresh_from_db()
    other.refresh_from_db()
    assert (refused.state, other.state) == (S.ADMITTED, S.RUNNING)
    assert refused.allocations.count() == 1
    fake.forbidden_namespaces.clear()
    cluster_reconcile(cluster)
    refused.refresh_from_db()
    assert refused.state == S.RUNNING and len(fake.pods()) == 2


def test_a_binding_that_failed_after_its_pod_is_made_on_the_next_pass(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster(pin="binding")
    nodes = kube.nodes(cluster)
    fake.inject("500", 100, method="POST", path="/binding")
    workload = training(org, "unbound")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    result = cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    assert not pod["spec"].get("nodeName") and any("500" in e for e in result.errors)
    fake.faults.clear()
    cluster_reconcile(cluster)
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    assert pod["spec"]["nodeName"] == nodes[0].name and posts(fake, "/pods") == 1
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_a_kubeconfig_the_key_cannot_open_marks_the_cluster_and_keeps_its_work(
    kube,  # noqa: F811
    setup,
    org,
    settings,
):
    cluster, nodes = setup
    workload = training(org, "locked")
    admit(workload, nodes[0], pods=[{"gpu_indices": []}])
    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()  # the key was rotated
    result = cluster_reconcile(cluster)
    assert result.reachable is False
    cluster.refresh_from_db()
    assert cluster.reachable is False and "cannot be decrypted" in cluster.last_error
    assert workload.allocations.count() == 1
    assert sync_inventory(cluster.pk) is None  # the inventory task marks it too, no crash
    assert Node.objects.filter(cluster=cluster, schedulable=True).count() == len(nodes)


def test_a_reservation_the_node_refuses_is_made_again_once_a_device_is_free(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, _ = setup
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace("other-team")
    hog = {  # a pod GPUPool does not know of takes every device of gpu-a
        "metadata": {"name": "hog"},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [
                {"name": "x", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }
    backend.api.create_namespaced_pod("other-team", hog)
    shared = training(org, "squeezed", gpu_request="fraction", gpus="0.5")
    admit(shared, Node.objects.get(name="gpu-a"), pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    cluster_reconcile(cluster)
    reserved = reserve_name(cluster, "gpu-a", 0)
    assert fake.pod("gpupool-system", reserved)["status"]["phase"] == "Failed"
    result = cluster_reconcile(cluster)
    failed = f"reservation pod {reserved} failed"
    assert any(failed in e for e in result.errors)
    assert fake.pod("gpupool-system", reserved) is None
    backend.api.delete_namespaced_pod("hog", "other-team")
    for _ in range(3):  # make the reservation, read its device, make the shared pod
        cluster_reconcile(cluster)
    assert fake.pod("gpupool-system", reserved)["status"]["phase"] == "Running"
    shared.refresh_from_db()
    assert shared.state == S.RUNNING


def waiting(backend, workload, reason: str, message: str) -> None:
    """What the kubelet reports for a container it cannot start (yet)."""
    state = {"waiting": {"reason": reason, "message": message}}
    status = {"phase": "Pending", "containerStatuses": [{"name": "main", "state": state}]}
    backend.api.patch_namespaced_pod_status(
        backend.owner.object_name(f"gp-{workload.pk}-0"),
        "gp-ml-vision",
        {"status": status},
        _preload_content=False,
    )


def test_a_pod_waiting_for_its_image_shows_why_and_an_invalid_image_fails(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    fake.auto_run = False  # the kubelet starts nothing by itself
    cluster, nodes = setup
    backend = KubernetesBackend(cluster)
    pulling, invalid = training(org, "pulling"), training(org, "invalid")
    for workload in (pulling, invalid):
        admit(workload, nodes[0], pods=[{"gpu_indices": []}])
    cluster_reconcile(cluster)
    waiting(backend, pulling, "ImagePullBackOff", 'Back-off pulling image "nope:1"')
    waiting(backend, invalid, "InvalidImageName", 'couldn\'t parse image name "UPPER:x"')
    cluster_reconcile(cluster)
    pulling.refresh_from_db()
    invalid.refresh_from_db()
    # A pull may still succeed (a registry hiccup): the pod waits, and says why.
    assert pulling.state == S.ADMITTED
    assert pulling.allocations.get().phase == "ImagePullBackOff"
    # An image name that cannot be parsed never will be: the workload fails with the reason.
    assert invalid.state == S.FAILED
    assert "InvalidImageName" in invalid.events.last().message


def test_pods_stuck_terminating_on_a_silent_node_are_requeued_and_deleted_by_force(
    kube,  # noqa: F811
    setup,
    org,
):
    fake = kube.require_fake()
    fake.deferred_delete = True  # the kubelet must confirm every graceful deletion
    cluster, nodes = setup
    workload = training(org, "partitioned")
    admit(workload, Node.objects.get(name="gpu-a"), pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    name = k8s_name(cluster, f"gp-{workload.pk}-0")
    # gpu-a stops answering; the node controller evicts its pods, the kubelet never confirms.
    fake.add_node("gpu-a", ready=False, labels={"gpupool.io/node-pool": "a100"})
    KubernetesBackend(cluster).api.delete_namespaced_pod(name, "gp-ml-vision")
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING  # within its grace period: it may still go by itself
    fake.objects["pods"][("gp-ml-vision", name)]["metadata"]["deletionTimestamp"] = (
        "2020-01-01T00:00:00Z"  # long past its deadline
    )
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    # Requeued (as when its node is gone), and its GPU released once the pod was forced out.
    assert (workload.state, workload.restart_count, workload.allocations.count()) == (
        S.PENDING,
        1,
        0,
    )
    assert workload.events.filter(message="Pods lost on gpu-a.").exists()
    assert fake.pod("gp-ml-vision", name) is None


def test_changes_made_while_the_cluster_was_unreachable_are_applied_once_when_it_is_back(
    kube,  # noqa: F811
    setup,
    org,
):
    fake = kube.require_fake()
    cluster, nodes = setup
    kept, stopped, later = training(org, "kept"), training(org, "stopped"), training(org, "later")
    admit(kept, nodes[0], pods=[{"gpu_indices": [0]}])
    admit(stopped, nodes[0], pods=[{"gpu_indices": [1]}])
    cluster_reconcile(cluster)
    uid = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{kept.pk}-0"))["metadata"]["uid"]
    fake.down = True
    workload_transition(stopped, S.STOPPED, reason="Stopped")
    admit(later, nodes[1], pods=[{"gpu_indices": [0]}])
    for _ in range(2):
        assert cluster_reconcile(cluster).reachable is False
    assert stopped.allocations.count() == 1  # its GPU stays taken: its pod may still run
    fake.down = False
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)
    names = sorted(p["metadata"]["name"] for p in fake.pods())
    assert names == sorted(k8s_name(cluster, f"gp-{w.pk}-0") for w in (kept, later))
    assert fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{kept.pk}-0"))["metadata"]["uid"] == uid
    assert posts(fake, "/pods") == 3  # kept, stopped, later: each made once
    for workload in (kept, stopped, later):
        workload.refresh_from_db()
    assert (kept.state, stopped.state, later.state) == (S.RUNNING, S.STOPPED, S.RUNNING)
    assert stopped.allocations.count() == 0


def test_a_shared_pod_whose_binding_failed_is_bound_on_the_next_pass(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster(pin="binding")
    kube.nodes(cluster)
    shared = training(org, "half", gpu_request="fraction", gpus="0.5")
    admit(shared, Node.objects.get(name="gpu-a"), pods=[{"shared_gpu_index": 0, "gpu_share": 0.5}])
    cluster_reconcile(cluster)  # the reservation pod, on the node by name
    fake.inject("500", 100, method="POST", path="/binding")
    cluster_reconcile(cluster)  # its device is known: the shared pod, whose Binding fails
    assert not fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{shared.pk}-0"))["spec"].get(
        "nodeName"
    )
    fake.faults.clear()
    cluster_reconcile(cluster)
    cluster_reconcile(cluster)
    assert (
        fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{shared.pk}-0"))["spec"]["nodeName"]
        == "gpu-a"
    )
    shared.refresh_from_db()
    assert shared.state == S.RUNNING


def test_port_names_are_made_names_the_api_server_takes(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    ports = [
        {"name": "TensorBoard_UI_port", "port": 6006},
        {"name": "tensorboard-ui-extra", "port": 6007},  # the same once cut to 15
        {"name": "8080", "port": 8080},  # no letter
    ]
    workload = training(org, "tools", kind="workspace", spec={"ports": ports})
    admit(workload, nodes[0])
    result = cluster_reconcile(cluster)
    assert result.errors == []
    [pod] = fake.pods()
    names = [p["name"] for p in pod["spec"]["containers"][0]["ports"]]
    assert names == ["tensorboard-ui", "port1", "port2"]
    [service] = fake.services()
    assert [p["name"] for p in service["spec"]["ports"]] == names
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_a_throttled_request_waits_as_long_as_the_api_server_asks(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup  # backoff_s is 0.01 here: only Retry-After makes it wait
    fake.inject("429", 1, method="POST", path="/pods")
    workload = training(org, "throttled")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    started = time.monotonic()
    result = cluster_reconcile(cluster)
    assert time.monotonic() - started >= 1.0  # Retry-After: 1
    assert result.errors == [] and len(fake.pods()) == 1


def test_an_existing_namespace_is_adopted_with_gpupools_labels(kube, setup, caplog):  # noqa: F811
    cluster, _ = setup
    api = KubernetesBackend(cluster).api
    name = kube.namespace("made-by-hand")
    api.create_namespace({"metadata": {"name": name, "labels": {"team": "vision"}}})
    KubernetesBackend(cluster).ensure_namespace(name, "ml-vision")
    found = api.read_namespace(name).metadata
    # Not the whole map: a real API server adds labels of its own.
    assert (found.labels["team"], found.labels["app.kubernetes.io/managed-by"]) == (
        "vision",
        "gpupool",
    )
    assert found.labels["gpupool.io/project"] == "ml-vision"
    assert found.labels["kubernetes.io/metadata.name"] == name
    assert found.annotations["gpupool.io/installation"] == installation_uid()
    assert f"adopted the existing namespace {name}" in caplog.text
    # A project renamed since: its label follows; already right: nothing to write.
    KubernetesBackend(cluster).ensure_namespace(name, "ml-vision-2")
    assert api.read_namespace(name).metadata.labels["gpupool.io/project"] == "ml-vision-2"
    if kube.fake:
        patches = [p for m, p in kube.fake.requests if m == "PATCH" and name in p]
        KubernetesBackend(cluster).ensure_namespace(name, "ml-vision-2")
        again = [p for m, p in kube.fake.requests if m == "PATCH" and name in p]
        assert len(patches) == 2 and again == patches


def test_a_namespace_another_tool_manages_is_refused_not_taken(kube, setup):  # noqa: F811
    cluster, _ = setup
    api = KubernetesBackend(cluster).api
    name = kube.namespace("helm-owned")
    helm = {"app.kubernetes.io/managed-by": "Helm"}
    api.create_namespace({"metadata": {"name": name, "labels": helm}})
    with pytest.raises(BackendError, match=f"{name} exists and is managed by Helm"):
        KubernetesBackend(cluster).ensure_namespace(name, "ml-vision")
    found = api.read_namespace(name).metadata
    assert found.labels["app.kubernetes.io/managed-by"] == "Helm"
    assert "gpupool.io/project" not in found.labels and not found.annotations
