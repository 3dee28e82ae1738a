"""Ports and SSH on Kubernetes, against the strict fake API server: a pod's ports on its own
ClusterIP Service (what the portal's proxy and SSH tunnel dial), published on nodes or
through an Ingress class where the cluster's admin chose it, never the SSH server's."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from kubernetes import client as k8s
from rest_framework.test import APIClient

from clusters.backends import PodSpec, PortSpec
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.manifests import ingress_host, ingress_hosts
from clusters.backends.kubernetes.ownership import Owner
from clusters.backends.sshd import SSH_ENV
from clusters.reconcile import cluster_reconcile
from clusters.services import cluster_register, cluster_update
from portal.errors import ValidationFailed
from portal.models import SshKey
from scheduling.lifecycle import workload_transition
from scheduling.models import WorkloadState
from tests.clusters.conftest import admit, make_workload
from tests.clusters.fake_apiserver import ApiError, _validate_service
from tests.clusters.fake_generic import _ingress
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
PORTS = [
    {"name": "tensorboard", "port": 6006, "protocol": "http"},
    {"name": "debug", "port": 5678, "protocol": "tcp"},
    {"name": "ssh", "port": 2222, "protocol": "tcp"},
]


def build(org, name: str = "build"):
    SshKey.objects.create(user=org.researcher, name="laptop", key_type="ssh-ed25519",
                          body="AAAAC3NzaC1lZDI1NTE5AAAAIB", comment="rita", bits=256,
                          fingerprint="SHA256:x")  # fmt: skip
    return make_workload(
        org.project_a, org.researcher, name, command=["python", "train.py"],
        spec={"ports": PORTS, "ssh": True},
    )  # fmt: skip


def run(kube_, cluster, workload):
    admit(workload, kube_.nodes(cluster)[0])
    cluster_reconcile(cluster)
    return kube_.fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))


def test_an_ssh_workload_runs_sshd_before_its_command_with_the_owners_keys(kube, org):  # noqa: F811
    kube.require_fake()
    cluster = kube.cluster()
    workload = build(org)
    pod = run(kube, cluster, workload)
    [container] = pod["spec"]["containers"]
    assert container["command"][:2] == ["sh", "-c"]
    assert container["command"][3:] == ["gpupool-ssh", "python", "train.py"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[SSH_ENV] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB rita"
    assert env["GPUPOOL_PORT_SSH"] == "2222"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "tensorboard": 6006, "debug": 5678, "ssh": 2222,
    }  # fmt: skip
    # One ClusterIP Service with every port: nothing is published on the nodes.
    [service] = kube.fake.services()
    assert service["spec"]["type"] == "ClusterIP"
    assert all("nodePort" not in p for p in service["spec"]["ports"])
    name = service["metadata"]["name"]
    assert workload.allocations.get().ports == {
        "tensorboard": f"{name}.gp-ml-vision.svc:6006",
        "debug": f"{name}.gp-ml-vision.svc:5678",
        "ssh": f"{name}.gp-ml-vision.svc:2222",
    }


def test_a_nodeport_cluster_publishes_every_port_but_ssh_and_drops_them_with_the_pod(
    kube,  # noqa: F811
    org,
):
    fake = kube.require_fake()
    cluster = kube.cluster(publish_ports="nodeport")
    workload = build(org)
    run(kube, cluster, workload)
    services = {s["metadata"]["name"]: s for s in fake.services()}
    own = k8s_name(cluster, f"gp-{workload.pk}-0")
    published = services[f"{own}-np"]
    assert published["spec"]["type"] == "NodePort"
    ports = {p["name"]: p for p in published["spec"]["ports"]}
    assert set(ports) == {"tensorboard", "debug"}  # never ssh
    assert all(30000 <= p["nodePort"] <= 32767 for p in ports.values())  # the server's pick
    assert published["metadata"]["ownerReferences"][0]["uid"] == services[own]["metadata"]["uid"]
    workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    assert fake.services() == []  # the published Service went with the pod's own


def test_an_ingress_cluster_gets_a_host_per_http_port_in_its_class(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster(
        publish_ports="ingress", ingress_class="nginx", ingress_domain="apps.example.com"
    )
    workload = build(org)
    run(kube, cluster, workload)
    [ingress] = fake.objects["networking.k8s.io/v1/ingresses"].values()
    own = k8s_name(cluster, f"gp-{workload.pk}-0")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    [rule] = ingress["spec"]["rules"]  # the HTTP port only: not debug (TCP), not ssh
    tag = KubernetesBackend(cluster).owner.tag  # the installation's and the record's ids
    assert rule["host"] == f"tensorboard-{workload.pk}-0-{tag}.apps.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": own, "port": {"number": 6006}}
    # Reconciling again changes nothing (the Service exists: no second Ingress is tried).
    cluster_reconcile(cluster)
    assert len(fake.objects["networking.k8s.io/v1/ingresses"]) == 1
    workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")
    cluster_reconcile(cluster)
    assert fake.objects["networking.k8s.io/v1/ingresses"] == {}  # collected with its Service


def test_an_ingress_host_another_installation_holds_is_refused_not_shared(kube, org):  # noqa: F811
    """Two installations publishing one workload id on one cluster and domain get hosts of
    their own; a host held by an Ingress that is not ours is refused (the cluster's error)
    and the pod runs unpublished, instead of sharing the host with another tenant's."""
    fake = kube.require_fake()
    config = {"publish_ports": "ingress", "ingress_class": "nginx"}
    cluster = kube.cluster(**config, ingress_domain="apps.example.com")
    first = build(org, "first")
    second = make_workload(org.project_a, org.researcher, "second", command=["x"],
                           spec={"ports": PORTS[:1]})  # fmt: skip
    node = kube.nodes(cluster)[0]
    theirs = KubernetesBackend(cluster, installation=str(uuid.uuid4()))
    ports = (PortSpec("tensorboard", 6006),)
    spec = replace(pod_spec(first.pk), namespace="gp-theirs", node_name=node.name, ports=ports)
    theirs.reconcile([spec], grace_period_s=0)  # the other installation's pod and Ingress
    admit(first, node)
    assert cluster_reconcile(cluster).errors == []
    hosts = {i["metadata"]["name"]: ingress_hosts(i) for i in ingresses(fake)}
    assert hosts[theirs.owner.object_name(spec.name)] == {ingress_host(
        "tensorboard", spec, theirs.owner, "apps.example.com")}  # fmt: skip
    assert hosts[k8s_name(cluster, f"gp-{first.pk}-0")] == {ingress_host(
        "tensorboard", spec, KubernetesBackend(cluster).owner, "apps.example.com")}  # fmt: skip
    assert len(set.union(*hosts.values())) == 2
    # Someone else's Ingress holds the host the second workload would get.
    wanted = ingress_host(
        "tensorboard", pod_spec(second.pk), KubernetesBackend(cluster).owner, "apps.example.com"
    )
    squatter = {"metadata": {"name": "squatter"}, "spec": {"ingressClassName": "nginx", "rules": [
        {"host": wanted, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {
            "service": {"name": "elsewhere", "port": {"number": 80}}}}]}}]}}  # fmt: skip
    networking = k8s.NetworkingV1Api(KubernetesBackend(cluster).api.api_client)
    networking.create_namespaced_ingress("default", squatter)
    admit(second, node)
    cluster_reconcile(cluster)
    cluster.refresh_from_db()
    assert f"host {wanted} is taken by ingress default/squatter, which is not this GPUPool's" in (
        cluster.last_error
    )
    assert len(ingresses(fake)) == 3  # theirs, the first's and the squatter's: none for it
    assert fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{second.pk}-0")) is not None


def ingresses(fake) -> list[dict]:
    return list(fake.objects["networking.k8s.io/v1/ingresses"].values())


def pod_spec(workload_id: int, pod_index: int = 0) -> PodSpec:
    name = f"gp-{workload_id}-{pod_index}"
    return PodSpec(name=name, namespace="ns", workload_id=workload_id, pod_index=pod_index,
                   node_name="n", project="p", image="x", command=())  # fmt: skip


def test_an_ingress_host_keeps_a_dns_label_whatever_the_ids():
    spec = pod_spec(10**19 - 1, 9999)
    owner = Owner(installation="F" * 36, cluster="e" * 36)
    host = ingress_host("a" * 15, spec, owner, "apps.example.com")
    label = host.split(".")[0]
    assert len(label) <= 63 and label == label.lower() and not label.endswith("-")
    assert host.endswith(".apps.example.com")


# --- the fake's own strictness for these kinds ---------------------------------------------


def test_the_fake_takes_two_ingresses_with_one_host_as_a_real_api_server_does(kube):  # noqa: F811
    """Host conflicts are the Ingress controller's affair, not the API server's: GPUPool
    must look for them itself."""
    kube.require_fake()
    api = KubernetesBackend(kube.cluster()).api
    networking = k8s.NetworkingV1Api(api.api_client)
    for name in ("one", "two"):
        body = {"metadata": {"name": name}, "spec": {"rules": [{"host": "same.example.com",
                "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {
                    "name": name, "port": {"number": 80}}}}]}}]}}  # fmt: skip
        networking.create_namespaced_ingress("default", body)
    items = networking.list_ingress_for_all_namespaces().items
    assert sorted(i.metadata.name for i in items) == ["one", "two"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "Balanced", "ports": [{"port": 80}]}, "spec.type: Unsupported value"),
        ({"ports": [{"port": 80, "nodePort": 30080}]}, "may not be used when `type` is"),
        ({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}, "nodePort: Invalid"),
        ({"ports": [{"port": 80}, {"port": 81}]}, "names are required and unique"),
        ({"ports": [{"name": "Web_UI", "port": 80}]}, "name: Invalid value"),
        ({"ports": [{"port": 70000}]}, "port: Invalid value"),
        ({"ports": []}, "spec.ports: Required value"),
    ],
)
def test_the_fake_refuses_services_the_real_api_server_refuses(spec, message):
    with pytest.raises(ApiError, match=message):
        _validate_service({"spec": spec}, set())


def test_the_fake_assigns_free_node_ports_like_the_real_one():
    service = {"spec": {"type": "NodePort", "ports": [{"name": "a", "port": 80},
                                                      {"name": "b", "port": 81}]}}  # fmt: skip
    _validate_service(service, {30000})
    assert [p["nodePort"] for p in service["spec"]["ports"]] == [30001, 30002]
    assert service["spec"]["ports"][0]["targetPort"] == 80


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"host": "Bad_Host", "http": {"paths": []}}, "host: Invalid value"),
        ({"host": "a.example.com"}, "http.paths: Required value"),
        ({"http": {"paths": [{"path": "/",
                              "backend": {"service": {"name": "s", "port": {"number": 1}}}}]}},
         "pathType: Unsupported value"),
        ({"http": {"paths": [{"path": "x", "pathType": "Prefix",
                              "backend": {"service": {"name": "s", "port": {"number": 1}}}}]}},
         "must be an absolute path"),
        ({"http": {"paths": [{"path": "/", "pathType": "Prefix",
                              "backend": {"service": {"name": "s", "port": {}}}}]}},
         "exactly one of name or number"),
    ],
)  # fmt: skip
def test_the_fake_refuses_ingresses_the_real_api_server_refuses(rule, message):
    with pytest.raises(ApiError, match=message):
        _ingress({"spec": {"ingressClassName": "nginx", "rules": [rule]}})


# --- the admin's choice, per cluster -------------------------------------------------------


def test_publishing_is_a_kubernetes_clusters_choice_and_an_ingress_needs_class_and_domain(
    kube,  # noqa: F811
    org,
):
    cluster = kube.cluster()
    fields = {"name": cluster.name, "node_pool_label": cluster.node_pool_label,
              "topology_labels": cluster.topology_labels}  # fmt: skip
    with pytest.raises(ValidationFailed) as refused:
        bad = {"publish_ports": "ingress", "ingress_class": "", "ingress_domain": "Bad_Domain"}
        cluster_update(actor=org.platform_admin, cluster=cluster, **fields, **bad)
    assert set(refused.value.errors) == {"ingress_class", "ingress_domain"}
    cluster_update(actor=org.platform_admin, cluster=cluster, **fields, publish_ports="ingress",
                   ingress_class="nginx", ingress_domain="apps.example.com")  # fmt: skip
    cluster.refresh_from_db()
    assert (cluster.config["publish_ports"], cluster.config["ingress_class"]) == (
        "ingress",
        "nginx",
    )
    assert cluster.config["retries"] == 3  # the rest of its configuration is kept
    cluster_update(actor=org.platform_admin, cluster=cluster, **fields, publish_ports="")
    cluster.refresh_from_db()
    assert not {"publish_ports", "ingress_class", "ingress_domain"} & set(cluster.config)
    with pytest.raises(ValidationFailed, match="Only Kubernetes clusters publish ports"):
        cluster_register(actor=org.platform_admin, name="here", backend="local",
                         publish_ports="nodeport")  # fmt: skip


def test_the_clusters_api_refuses_an_unknown_publishing_naming_the_field(org):
    api = APIClient()
    api.force_authenticate(org.platform_admin)
    body = {"name": "sim", "backend": "simulated", "publish_ports": "everywhere"}
    response = api.post("/api/v1/clusters/", body, format="json")
    assert response.status_code == 400 and "publish_ports" in response.json()
    body = {"name": "sim", "backend": "simulated", "publish_ports": "nodeport"}
    response = api.post("/api/v1/clusters/", body, format="json")
    assert response.status_code == 400
    assert response.json()["publish_ports"] == ["Only Kubernetes clusters publish ports."]
