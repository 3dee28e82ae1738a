"""The backend needs exactly the verbs deploy/base/rbac.yaml grants: the fake API server
answers as if the kubeconfig's user were bound to that ClusterRole, so a verb missing
from the file fails here, and a verb in the file that nothing uses is found too."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from kubernetes import client as k8s

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.errors import message
from clusters.backends.kubernetes.grants import MANIFESTS_ROLE
from clusters.backends.kubernetes.manifests import MPS_ROOT
from clusters.enforcement import enforcement_sync
from clusters.manifest_kinds import KINDS, NAMES
from clusters.manifest_submit import manifest_submit
from clusters.models import Cluster, Gpu, MigInstance, Node
from clusters.native_sharing import FRACTION, config_map_name, sharing_patch
from clusters.reconcile import cluster_reconcile
from clusters.services import cluster_register, cluster_sync_inventory, cluster_test_connection
from clusters.webhook_cert import Target, webhook_cert_ensure
from portal.models import Project
from scheduling.lifecycle import workload_transition
from scheduling.models import Workload, WorkloadState
from tests import factories as f
from tests.clusters.conftest import admit, agents_report, make_workload
from tests.clusters.fake_apiserver import json_patch, request_attributes
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_admission_webhook import install_webhook
from tests.clusters.test_manifest_kinds import every_manifest
from tests.clusters.test_native_owners import every_owner_kind, operators_remove_suspended

S = WorkloadState
pytestmark = pytest.mark.timeout(90)
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac.yaml"
RBAC_API = "rbac.authorization.k8s.io/v1"


def cluster_role(name: str = "gpupool-controller") -> dict:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)


def install_manifests_role(api_client) -> None:
    """The ClusterRole gpupool-manifests, as `kubectl apply -k deploy/` makes it (as an
    admin, before the fake answers as GPUPool's user)."""
    k8s.RbacAuthorizationV1Api(api_client).create_cluster_role(cluster_role(MANIFESTS_ROLE))


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in rules
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_the_manifest_binds_the_role_to_gpupools_service_account():
    """The controller's role cluster-wide; the manifests' role in no ClusterRoleBinding
    (GPUPool binds it per project namespace), and nothing it grants is cluster-wide."""
    found = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in found) == [
        ("ClusterRole", "gpupool-controller"),
        ("ClusterRole", MANIFESTS_ROLE),
        ("ClusterRoleBinding", "gpupool-controller"),
        ("ServiceAccount", "gpupool"),
    ]
    docs = {d["kind"]: d for d in found}
    manifests = granted(cluster_role(MANIFESTS_ROLE)["rules"])
    assert not manifests & granted(cluster_role()["rules"])
    assert {verb for verb, _, _ in manifests} == {"create"}
    assert {resource for _, _, resource in manifests} == {k.plural for k in KINDS.values()} - {
        "pods"  # GPUPool's own pods are made in every project namespace and its system one
    }
    account = docs["ServiceAccount"]["metadata"]
    assert (account["name"], account["namespace"]) == ("gpupool", "gpupool")
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpupool-controller",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupool", "namespace": "gpupool"}
    ]
    assert ("patch", "", "namespaces") in granted(cluster_role()["rules"])


def everything_gpupool_does(kube, org) -> list:  # noqa: F811
    """Register, test, sync, adopt a namespace, run whole, shared, served and distributed
    workloads observed through the watch (the default), read logs, read back a pod and a
    rendezvous Service whose creates conflicted, bind pods, stop it all."""
    fake = kube.fake
    setup = KubernetesBackend(kube.cluster("setup"))
    setup.api.create_namespace(
        {"metadata": {"name": org.project_a.namespace}}  # made by hand: adopted, patched
    )
    # A Job made with kubectl (by a user the role does not bind) that names GPUPool's
    # scheduler: queued (its parallelism read), told why it waits (its pod's status, an
    # event), bound, then stopped (suspended).
    batch = k8s.BatchV1Api(setup.api.api_client)
    template = {
        "spec": {
            "schedulerName": "gpupool",
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        }
    }
    namespace = org.project_a.namespace
    batch.create_namespaced_job(
        namespace, {"metadata": {"name": "native"}, "spec": {"template": template}}
    )
    # Operators' owners of each kind GPUPool walks up to (read) and suspends (on stop).
    fake.install_crds()
    every_owner_kind(setup.api)
    fake.run_controllers()  # kube-controller-manager makes the Jobs' pods
    # A bare pod asking for half a GPU, made ready for it (clusters/native_sharing.py): its
    # GPU environment is a ConfigMap GPUPool writes before it binds the pod.
    main = {"name": "main", "image": "x"}
    shared = {"metadata": {"name": "native-half", "annotations": {FRACTION: "0.5"}},
              "spec": {**template["spec"], "containers": [main]}}  # fmt: skip
    ops = sharing_patch(shared, config_map=config_map_name("native-half"), mps_root=MPS_ROOT)
    setup.api.create_namespace({"metadata": {"name": org.project_b.namespace}})
    setup.api.create_namespaced_pod(org.project_b.namespace, json_patch(shared, ops))
    install_webhook(setup.api.api_client, ("Secret", "MutatingWebhookConfiguration"))
    install_manifests_role(setup.api.api_client)
    Cluster.objects.filter(name="setup").delete()
    rules = cluster_role()["rules"]
    fake.allow(rules)
    cluster = cluster_register(
        actor=org.platform_admin,
        name="kube",
        backend="kubernetes",
        kubeconfig=yaml.safe_dump(fake.kubeconfig()),
    )
    cluster.config = {"retries": 3, "backoff_s": 0.01, "timeout_s": 0.5}
    cluster.save()
    assert cluster_test_connection(actor=org.platform_admin, cluster=cluster)[0]
    cluster_sync_inventory(actor=org.platform_admin, cluster=cluster)
    # The pod webhook: project A's namespace labelled (after a list of those labelled now),
    # its certificate made (the Secret filled, the configuration's caBundle written).
    Project.objects.filter(pk=org.project_a.pk).update(enforce_scheduler=True)
    assert enforcement_sync(cluster) == []
    webhook_cert_ensure(cluster, Target(), now=timezone.now())
    bound = kube.cluster("bound", pin="binding")
    kube.nodes(bound)
    gpu_a = Node.objects.get(cluster=cluster, name="gpu-a")
    whole = make_workload(org.project_a, org.researcher, "whole", command=["sleep", "9"])
    half = make_workload(
        org.project_a, org.researcher, "half", gpu_request="fraction", gpus="0.5", command=["x"]
    )
    lab = make_workload(
        org.project_b,
        org.outsider,
        "lab",
        kind="workspace",
        command=["x"],
        spec={"ports": [{"name": "http", "port": 8888}]},
    )
    # A cluster whose admin publishes ports through an Ingress class.
    published = kube.cluster(
        "published", publish_ports="ingress", ingress_class="nginx", ingress_domain="example.com"
    )
    kube.nodes(published)
    boards = f.make_project(org.project_b.department, "boards")  # a namespace of its own
    f.make_membership(org.outsider, role=f.Role.RESEARCHER, project=boards)
    board = make_workload(
        boards, org.outsider, "board", command=["x"],
        spec={"ports": [{"name": "tb", "port": 6006, "protocol": "http"}]},
    )  # fmt: skip
    pinned = make_workload(org.project_a2, org.researcher, "pinned", command=["x"])
    ddp = make_workload(
        org.project_a, org.researcher, "ddp", kind="distributed", pods=2, min_pods=2, command=["x"]
    )
    # A MIG instance wanted on GPU 7 (its agent reported it in MIG mode): the layout is
    # published on the Node.
    gpu_a.mig_report = {"layout": "", "mig_mode": [7], "devices": {}, "errors": []}
    gpu_a.save(update_fields=["mig_report"])
    cluster_sync_inventory(actor=org.platform_admin, cluster=cluster)
    MigInstance.objects.create(gpu=Gpu.objects.get(node=gpu_a, index=7, mig_enabled=True),
                               profile="1g.10gb", start=0)  # fmt: skip
    admit(whole, gpu_a, pods=[{"gpu_indices": [0]}])
    admit(half, gpu_a, pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    admit(lab, gpu_a)
    admit(pinned, Node.objects.get(cluster=bound, name="gpu-b"), pods=[{"gpu_indices": [0]}])
    admit(board, Node.objects.get(cluster=published, name="gpu-b"))
    admit(ddp, gpu_a, pods=[{"gpu_indices": [2]}, {"gpu_indices": [3]}])
    fake.run_controllers()
    # A conflict on the create of ddp's headless Service: it is read back to see whose. (Its
    # two pods create it at once, and the later one's real conflict was the only read: a
    # race, which a loaded machine once lost.)
    fake.inject("409", 1, method="POST", path=f"/namespaces/{org.project_a.namespace}/services")
    cluster_reconcile(cluster)
    native = Workload.objects.get(spec__native__owner__name="native")
    Workload.objects.filter(pk=native.pk).update(pending_reason="Needs 1 GPU; 0 are free.")
    cluster_reconcile(cluster)
    native.refresh_from_db()
    admit(native, gpu_a, pods=[{"gpu_indices": [4]}])
    half_native = Workload.objects.get(spec__native__owner__name="native-half")
    admit(half_native, gpu_a, pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    # A conflict on its ConfigMap's create: read to see whose (here: nobody's yet, 404).
    fake.inject("409", 1, method="POST", path=f"/namespaces/{org.project_b.namespace}/configmaps")
    # A conflict on a pod's create: it is read back to see whose.
    fake.inject("409", 1, method="POST", path=f"/namespaces/{org.project_a.namespace}/pods")
    for _ in range(5):  # reservation; its device (its MPS daemon); the shared pods; the native
        cluster_reconcile(cluster)
        agents_report(cluster)
    for _ in range(2):  # the pod, bound after its create; its phase
        cluster_reconcile(bound)
        cluster_reconcile(published)  # the pod, its Service and Ingress; its phase
    logs = KubernetesBackend(cluster).pod_logs(f"gp-{whole.pk}-0", org.project_a.namespace)
    assert logs.startswith("GPU-gpu-a-")  # the device plugin's device, as nvidia-smi names it
    workloads = [whole, half, lab, pinned, ddp, board, native, half_native]
    for workload in workloads:
        workload.refresh_from_db()
    states = [w.state for w in workloads]
    operators = Workload.objects.filter(spec__has_key="native").exclude(
        pk__in=[native.pk, half_native.pk]
    )
    assert operators.count() == 9  # every_owner_kind's owners, each queued
    for workload in [*workloads, *operators]:
        workload_transition(workload, S.STOPPED, reason="Stopped")
    for _ in range(2):
        cluster_reconcile(cluster)
        fake.complete_deletions()
        fake.run_controllers()
    operators_remove_suspended(fake)
    cluster_reconcile(bound)
    cluster_reconcile(published)
    # A Job submitted as YAML is created by GPUPool's user (clusters/manifest_submit.py).
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "submitted"},
           "spec": {"suspend": True, "template": template}}  # fmt: skip
    manifest_submit(
        actor=org.researcher, project=org.project_a, text=yaml.safe_dump(job), cluster=cluster
    )
    # And one of every other kind a project may allow (its pod templates tried as dry-run
    # pods first); no operator runs here to make their pods.
    Project.objects.filter(pk=org.project_a.pk).update(manifest_kinds=NAMES)
    org.project_a.refresh_from_db()
    for body in every_manifest(prefix="submitted-"):
        manifest_submit(
            actor=org.researcher, project=org.project_a, text=yaml.safe_dump(body), cluster=cluster
        )
    return states


def test_the_backend_needs_exactly_the_verbs_the_shipped_cluster_role_grants(kube, org):  # noqa: F811
    fake = kube.require_fake()
    states = everything_gpupool_does(kube, org)
    assert fake.denied == []
    assert states == [S.RUNNING] * 8
    assert fake.pods() == [] and fake.services() == []
    assert fake.objects["configmaps"] == {}  # the hostfile went with its Service
    assert (
        "gpupool.io/mig-layout" in fake.objects["nodes"][("", "gpu-a")]["metadata"]["annotations"]
    )
    roles = granted(cluster_role()["rules"]) | granted(cluster_role(MANIFESTS_ROLE)["rules"])
    unused = roles - fake.allowed
    assert not unused, f"granted but never used: {sorted(unused)}"


def test_a_verb_missing_from_the_role_fails_and_is_retried_not_blamed_on_the_workload(
    kube,  # noqa: F811
    org,
):
    fake = kube.require_fake()
    cluster = kube.cluster()
    nodes = kube.nodes(cluster)
    rules = copy.deepcopy(cluster_role()["rules"])
    for rule in rules:
        if rule["resources"] == ["pods"]:
            rule["verbs"].remove("create")
    fake.allow(rules)
    workload = make_workload(org.project_a, org.researcher, "w", command=["sleep", "9"])
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    result = cluster_reconcile(cluster)
    assert fake.denied == [("create", "pods", org.project_a.namespace)]
    assert any('cannot create resource "pods"' in e for e in result.errors)
    workload.refresh_from_db()
    assert workload.state == S.ADMITTED and workload.allocations.count() == 1
    fake.allow(cluster_role()["rules"])
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_the_fake_authorizes_every_api_group_as_a_real_server_does(kube):  # noqa: F811
    """Not only the groups GPUPool used first: a Job (batch) or an Eviction (core
    subresource) that no rule allows is 403, as RBAC answers (once it was let through as a
    non-resource URL, so a verb missing from the role went unseen)."""
    fake = kube.require_fake()
    assert request_attributes("GET", "/apis/batch/v1/namespaces/ns/jobs/j", {}) == (
        "get", "batch", "jobs", "ns", "j",
    )  # fmt: skip
    assert request_attributes("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d", {})[:3] == (
        "patch", "apps", "deployments",
    )  # fmt: skip
    assert request_attributes("GET", "/version", {}) is None
    fake.allow([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"]}])
    api = KubernetesBackend(kube.cluster()).api
    api.create_namespace({"metadata": {"name": "team"}})
    with pytest.raises(k8s.ApiException) as refused:
        k8s.BatchV1Api(api.api_client).create_namespaced_job(
            "team", {"metadata": {"name": "j"}, "spec": {"template": {"spec": {}}}}
        )
    assert refused.value.status == 403
    assert fake.denied == [("create", "jobs", "team")]


def pytorch_job(name: str) -> dict:
    worker = {"replicas": 1, "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Worker": worker}}}  # fmt: skip


def test_submitted_kinds_are_created_only_in_the_namespaces_gpupool_manages(kube, org):  # noqa: F811
    """With the shipped roles, GPUPool's user may create a PyTorchJob in a project's
    namespace (bound there when GPUPool made or adopted it) and nowhere else."""
    fake = kube.require_fake()
    fake.install_crds()
    backend = KubernetesBackend(kube.cluster())
    install_manifests_role(backend.api.api_client)
    backend.api.create_namespace({"metadata": {"name": "team-tools"}})  # another tool's
    fake.allow(cluster_role()["rules"])
    objects = k8s.CustomObjectsApi(backend.api.api_client)

    def create(namespace: str, name: str) -> dict:
        return objects.create_namespaced_custom_object(
            "kubeflow.org", "v1", namespace, "pytorchjobs", pytorch_job(name)
        )

    for namespace in ("team-tools", "kube-system", org.project_a.namespace):
        with pytest.raises(k8s.ApiException) as refused:
            create(namespace, "bert")
        assert refused.value.status == 403
        assert message(refused.value).endswith(
            'cannot create resource "pytorchjobs" in API group "kubeflow.org" in the namespace '
            f'"{namespace}"'
        )
    backend.ensure_namespace(org.project_a.namespace, org.project_a.name)
    assert create(org.project_a.namespace, "bert")["metadata"]["namespace"] == "gp-ml-vision"
    binding = fake.objects[f"{RBAC_API}/rolebindings"][(org.project_a.namespace, MANIFESTS_ROLE)]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupool", "namespace": "gpupool"}
    ]
    with pytest.raises(k8s.ApiException) as refused:
        create("team-tools", "bert")
    assert refused.value.status == 403
    assert fake.denied[-1] == ("create", "pytorchjobs", "team-tools")


def test_a_kubeconfig_of_a_user_is_bound_as_that_user(kube, org):  # noqa: F811
    """Outside the cluster (an admin's kubeconfig), the RoleBinding names the User the API
    server says the credentials are."""
    fake = kube.require_fake()
    fake.rbac_user = "alice@example.org"
    backend = KubernetesBackend(kube.cluster())
    backend.ensure_namespace(org.project_a.namespace, org.project_a.name)
    binding = fake.objects[f"{RBAC_API}/rolebindings"][(org.project_a.namespace, MANIFESTS_ROLE)]
    assert binding["subjects"] == [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice@example.org"}
    ]
    assert binding["roleRef"]["name"] == MANIFESTS_ROLE


def test_an_admin_may_make_the_role_bindings_and_keep_gpupool_from_binding(kube, org):  # noqa: F811
    """Without the two rbac.authorization.k8s.io rules, GPUPool's pods still go ahead in a
    project namespace, and a manifest is created where an admin made the RoleBinding."""
    fake = kube.require_fake()
    fake.install_crds()
    backend = KubernetesBackend(kube.cluster())
    install_manifests_role(backend.api.api_client)
    namespace = org.project_a.namespace
    backend.api.create_namespace({"metadata": {"name": namespace}})
    account = {"kind": "ServiceAccount", "name": "gpupool", "namespace": "gpupool"}
    k8s.RbacAuthorizationV1Api(backend.api.api_client).create_namespaced_role_binding(
        namespace,
        {"metadata": {"name": "by-the-admin"}, "subjects": [account],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": MANIFESTS_ROLE}},
    )  # fmt: skip
    rules = [r for r in cluster_role()["rules"] if r["apiGroups"] != ["rbac.authorization.k8s.io"]]
    fake.allow(rules)
    backend.ensure_namespace(namespace, org.project_a.name)  # adopted; no error
    assert fake.denied == [("create", "rolebindings", namespace)]
    objects = k8s.CustomObjectsApi(backend.api.api_client)
    made = objects.create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs", pytorch_job("bert")
    )
    assert made["metadata"]["namespace"] == namespace


def test_a_server_without_self_subject_reviews_gets_no_role_binding_and_pods_go_ahead(kube, org):  # noqa: F811
    """Before Kubernetes 1.28 (404): GPUPool cannot know whom to bind; the namespace is made
    all the same, and an admin makes the RoleBindings."""
    fake = kube.require_fake()
    fake.inject("404", 1, method="POST", path="/selfsubjectreviews")
    backend = KubernetesBackend(kube.cluster())
    backend.ensure_namespace(org.project_a.namespace, org.project_a.name)
    assert ("", org.project_a.namespace) in fake.objects["namespaces"]
    assert not fake.objects.get(f"{RBAC_API}/rolebindings")
