"""Two GPUPool databases, or two Cluster records, on one cluster leave each other's pods
alone; a cluster is registered once. The backend-level tests run against a real API
server too (GPUPOOL_TEST_KUBECONFIG): their namespaces are unique and removed after."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from clusters.backends import BackendError, PodSpec
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.foreign import FIELD_SELECTOR
from clusters.models import Cluster, Node, installation_uid
from clusters.reconcile import cluster_reconcile
from scheduling.lifecycle import workload_transition
from scheduling.models import WorkloadState
from tests.clusters.conftest import admit, make_workload
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture

S = WorkloadState
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac.yaml"
pytestmark = pytest.mark.timeout(60)


def spec(namespace: str, image: str, *, name: str = "gp-1-0", node: str = "") -> PodSpec:
    return PodSpec(
        name=name,
        namespace=namespace,
        workload_id=1,
        pod_index=0,
        node_name=node,
        project="p",
        image=image,
        command=("sleep", "3600"),
        cpu=0.01,
        memory_mib=16,
    )


def test_two_installations_on_one_cluster_never_take_list_or_delete_each_others_pods(kube):  # noqa: F811
    """A fresh database numbers its workloads from 1 again: its gp-1-0 is not the old one's."""
    cluster = kube.cluster()
    node = KubernetesBackend(cluster).list_inventory()[0].name
    old = KubernetesBackend(cluster, installation=str(uuid.uuid4()))
    new = KubernetesBackend(cluster, installation=str(uuid.uuid4()))
    old_ns, new_ns = kube.namespace("gp-old"), kube.namespace("gp-new")
    old.reconcile([spec(old_ns, "registry.k8s.io/pause:3.10", node=node)], grace_period_s=0)
    [mine] = old.pod_statuses().values()
    assert new.pod_statuses() == {}  # not listed as the new one's
    made = new.reconcile([spec(new_ns, "busybox:1.36", node=node)], grace_period_s=0)
    assert made.created == ["gp-1-0"]  # its own pod, not the old one adopted
    assert old.pod_statuses()["gp-1-0"].backend_ref == mine.backend_ref
    # The new installation's namespace is its own; the old one's is refused to it.
    with pytest.raises(BackendError, match=f"namespace {old_ns} belongs to another GPUPool"):
        new.ensure_namespace(old_ns, "p")
    # Nothing wanted: each deletes its own pod only.
    assert new.reconcile([], grace_period_s=0).deleted == ["gp-1-0"]
    survivor = old.pod_statuses()["gp-1-0"]
    assert (survivor.backend_ref, survivor.namespace) == (mine.backend_ref, old_ns)
    pod = old.api.read_namespaced_pod(old.owner.object_name("gp-1-0"), old_ns)
    assert pod.spec.containers[0].image == "registry.k8s.io/pause:3.10"
    assert old.reconcile([], grace_period_s=0).deleted == ["gp-1-0"]


def test_a_pod_without_both_identities_is_not_ours(kube):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace("gp-p", "p")
    owner = backend.owner
    name = owner.object_name("gp-1-0")
    half = {**owner.labels, "gpupool.io/role": "workload", "gpupool.io/pod": "gp-1-0"}
    half["gpupool.io/workload-id"] = "1"
    del half["gpupool.io/cluster"]  # the installation's, but no Cluster record's
    body = {"metadata": {"name": name, "labels": half}, "spec": {"containers": []}}
    body["spec"]["containers"] = [{"name": "main", "image": "x"}]
    backend.api.create_namespaced_pod("gp-p", body)
    assert backend.pod_statuses() == {}
    # Its name taken, the create meets 409: it is refused, never adopted...
    result = backend.reconcile([spec("gp-p", "x", node="gpu-a")], grace_period_s=0)
    assert result.created == [] and "did not create" in result.errors[0]
    # ...and, wanted by nobody, never deleted.
    backend.reconcile([], grace_period_s=0)
    assert fake.pod("gp-p", name) is not None


def test_two_cluster_records_for_one_cluster_leave_each_others_pods_alone(kube, org):  # noqa: F811
    fake = kube.require_fake()
    one, two = kube.cluster("one"), kube.cluster("two")
    kube.nodes(one)
    kube.nodes(two)
    first = make_workload(org.project_a, org.researcher, "first", command=["sleep", "1"])
    second = make_workload(org.project_b, org.outsider, "second", command=["sleep", "1"])
    admit(first, Node.objects.get(cluster=one, name="gpu-a"), pods=[{"gpu_indices": [0]}])
    admit(second, Node.objects.get(cluster=two, name="gpu-a"), pods=[{"gpu_indices": [1]}])
    cluster_reconcile(one)
    cluster_reconcile(two)  # once made the first record's pods its own, or deleted them
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == (S.RUNNING, S.RUNNING)
    names = sorted(p["metadata"]["name"] for p in fake.pods())
    assert names == sorted([k8s_name(one, f"gp-{first.pk}-0"), k8s_name(two, f"gp-{second.pk}-0")])
    workload_transition(first, S.STOPPED, reason="Stopped")
    cluster_reconcile(two)
    assert fake.pod(org.project_a.namespace, k8s_name(one, f"gp-{first.pk}-0")) is not None
    cluster_reconcile(one)
    assert [p["metadata"]["name"] for p in fake.pods()] == [k8s_name(two, f"gp-{second.pk}-0")]
    # A project namespace belongs to one record: the other is told whose it is.
    late = make_workload(org.project_a, org.researcher, "late", command=["sleep", "1"])
    admit(late, Node.objects.get(cluster=two, name="gpu-b"), pods=[{"gpu_indices": [0]}])
    cluster_reconcile(two)
    late.refresh_from_db()
    assert (late.state, late.allocations.count()) == (S.FAILED, 0)
    message = late.events.last().message
    assert f"namespace {org.project_a.namespace} belongs to another GPUPool" in message
    assert str(one.uid) in message


def test_a_namespace_another_gpupool_or_tool_holds_fails_its_workloads_at_once(kube, org):  # noqa: F811
    """Refused for good: the workloads waiting on it fail in the same pass with the reason,
    their GPUs and quota released, as a pod that Pod Security refuses."""
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    taken, helm = org.project_a.namespace, org.project_b.namespace
    KubernetesBackend(cluster, installation=str(uuid.uuid4())).ensure_namespace(taken, "p")
    api = KubernetesBackend(cluster).api
    labels = {"app.kubernetes.io/managed-by": "Helm"}
    api.create_namespace({"metadata": {"name": helm, "labels": labels}})
    first = make_workload(org.project_a, org.researcher, "first", command=["sleep", "1"])
    second = make_workload(org.project_b, org.outsider, "second", command=["sleep", "1"])
    admit(first, nodes[0], pods=[{"gpu_indices": [0]}, {"gpu_indices": [1]}])
    admit(second, nodes[0], pods=[{"gpu_indices": [2]}])
    result = cluster_reconcile(cluster)
    for workload in (first, second):
        workload.refresh_from_db()
        assert (workload.state, workload.allocations.count()) == (S.FAILED, 0)
    message = first.events.last().message
    assert message.startswith(f"The pod cannot run: namespace {taken} belongs to another")
    assert f"namespace {helm} exists and is managed by Helm" in second.events.last().message
    assert result.errors == []  # the workloads say it; nothing for the next pass to retry
    pods = api.list_pod_for_all_namespaces().items
    assert [p.metadata.name for p in pods if p.metadata.namespace in (taken, helm)] == []


def test_a_namespace_the_cluster_fails_to_make_holds_its_workloads_for_the_next_pass(kube, org):  # noqa: F811
    """A 403 from RBAC or a 5xx is not the namespace's fault: the workload keeps waiting,
    the reason is the cluster's error, and the next pass makes it."""
    fake = kube.require_fake()
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "ClusterRole")
    no_namespace_create = [
        {
            **r,
            "verbs": [v for v in r["verbs"] if v != "create" or "namespaces" not in r["resources"]],
        }
        for r in role["rules"]
    ]
    workload = make_workload(org.project_a, org.researcher, "waits", command=["sleep", "1"])
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    fake.inject("500", 10, method="POST", path="/namespaces")
    for refusal in ("500", "403"):
        cluster_reconcile(cluster)
        cluster.refresh_from_db()
        workload.refresh_from_db()
        assert (workload.state, workload.allocations.count()) == (S.ADMITTED, 1)
        assert f"namespace {org.project_a.namespace}: {refusal}" in cluster.last_error
        fake.faults.clear()
        fake.allow(no_namespace_create)
    fake.allow(None)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_every_selector_name_and_annotation_carries_both_identities(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    lab = make_workload(
        org.project_a,
        org.researcher,
        "lab",
        kind="workspace",
        command=["sleep", "1"],
        spec={"ports": [{"name": "http", "port": 8888}]},
    )
    admit(lab, nodes[0])
    cluster_reconcile(cluster)
    identity = {
        "gpupool.io/installation": installation_uid(),
        "gpupool.io/cluster": str(cluster.uid),
    }
    owner = KubernetesBackend(cluster).owner
    listed = {"/api/v1/pods", "/api/v1/services"}
    lists = [(path, q) for m, path, q in fake.queries if m == "GET" and path in listed]
    assert {path for path, q in lists} == listed
    # Every list but the inventory's count of what others hold (read only, every bound pod)
    # and the pods that name our scheduler (made by others; bound, never deleted).
    native = {"fieldSelector": "spec.schedulerName=gpupool"}
    assert all(
        q.get("labelSelector") == owner.selector or q in ({"fieldSelector": FIELD_SELECTOR}, native)
        for path, q in lists
    ), lists
    [pod] = fake.pods()
    [service] = fake.services()
    for labels in (pod["metadata"]["labels"], service["metadata"]["labels"]):
        assert {k: labels[k] for k in identity} == identity
    assert {k: service["spec"]["selector"][k] for k in identity} == identity
    assert pod["metadata"]["name"].endswith(f"-{installation_uid()[:8]}-{str(cluster.uid)[:8]}")
    annotations = fake.namespaces()[org.project_a.namespace]["metadata"]["annotations"]
    assert {k: annotations[k] for k in identity} == identity
    assert KubernetesBackend(cluster).owner.selector == (
        "app.kubernetes.io/managed-by=gpupool,"
        f"gpupool.io/installation={installation_uid()},gpupool.io/cluster={cluster.uid}"
    )


def test_the_installation_identity_is_made_once_per_database(db):
    first = installation_uid()
    assert installation_uid() == first
    assert str(uuid.UUID(first)) == first


# --- a cluster is registered once ----------------------------------------------------------
def register(client, kube, name: str, server: str | None = None):  # noqa: F811
    config = kube.fake.kubeconfig()
    if server:
        config["clusters"][0]["cluster"]["server"] = server
    return client.post(
        "/api/v1/clusters/",
        {"name": name, "backend": "kubernetes", "kubeconfig": yaml.safe_dump(config)},
        format="json",
    )


@pytest.fixture
def admin_api(org):
    client = APIClient()
    client.force_authenticate(org.platform_admin)
    return client


def test_a_cluster_registered_already_is_refused_with_the_existing_records_name(
    kube,  # noqa: F811
    admin_api,
):
    kube.require_fake()
    assert register(admin_api, kube, "first").status_code == 201
    first = Cluster.objects.get(name="first")
    assert first.api_server == kube.fake.url  # http://127.0.0.1:<port>
    assert first.kube_system_uid == kube.fake.namespaces()["kube-system"]["metadata"]["uid"]
    again = register(admin_api, kube, "second", server=kube.fake.url + "/")
    assert again.status_code == 400
    assert again.json() == {
        "kubeconfig": [
            f"This cluster is registered already as first (the same API server: "
            f"{first.api_server})."
        ]
    }
    # Another URL to the same cluster: its kube-system namespace gives it away.
    other_url = kube.fake.url.replace("127.0.0.1", "localhost")
    third = register(admin_api, kube, "third", server=other_url)
    assert third.status_code == 400
    assert (
        "registered already as first (the same kube-system namespace"
        in (third.json()["kubeconfig"][0])
    )
    assert Cluster.objects.count() == 1


def test_the_registration_form_names_the_existing_record(kube, org, client_as):  # noqa: F811
    kube.require_fake()
    client = client_as(org.platform_admin)
    text = yaml.safe_dump(kube.fake.kubeconfig())
    for name in ("first", "second"):
        upload = SimpleUploadedFile("kubeconfig", text.encode())
        response = client.post(
            "/clusters/new/",
            {
                "name": name,
                "backend": "kubernetes",
                "kubeconfig": upload,
                "node_pool_label": "gpupool.io/node-pool",
            },
        )
    assert response.status_code == 200
    assert "This cluster is registered already as first" in response.content.decode()
    assert list(Cluster.objects.values_list("name", flat=True)) == ["first"]
