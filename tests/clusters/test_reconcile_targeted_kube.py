"""The targeted reconcile on Kubernetes (issue 25): a pass with nothing to do reads the
allocations' index and acts on no pod; what a kept pod lacks (its Service, its Binding,
removed out of band) hands its workload over, so it is made again at once instead of
waiting for the full pass every `GPUPOOL_RECONCILE_FULL_EVERY_S`; kept sharers keep the
reservation pod of their GPU."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.backends.kubernetes import KubernetesBackend
from clusters.reconcile import reconcile_pass
from tests.clusters.conftest import admit, make_workload
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_ports_ssh import PORTS

pytestmark = pytest.mark.timeout(60)
NS = "gp-ml-vision"


def a_pass(cluster, *, full: bool, clean: bool = True):
    """One pass with a backend of its own, as each beat task makes one."""
    result = reconcile_pass(cluster, KubernetesBackend(cluster), full=full)
    assert result.reachable and (result.errors == [] or not clean), result.errors
    return result


def two_running(kube_, cluster, org, **config):
    """A workload with ports (a Service of its own) and a half-GPU sharer, made by a full
    pass."""
    cluster.config.update(config)
    cluster.save()
    node = kube_.nodes(cluster)[0]
    served = make_workload(org.project_a, org.researcher, "served", spec={"ports": PORTS[:1]})
    shared = make_workload(org.project_a, org.researcher, "shared")
    admit(served, node, pods=[{"gpu_indices": [0]}])
    admit(shared, node, pods=[{"shared_gpu_index": 1, "gpu_share": 0.5}])
    a_pass(cluster, full=True)
    return served, shared


def test_a_pass_with_nothing_to_do_keeps_every_pod_and_writes_nothing(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    two_running(kube, cluster, org)
    a_pass(cluster, full=True)  # the reservation's device is known now
    before = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in fake.pods()}
    fake.requests.clear()
    result = a_pass(cluster, full=False)
    assert (result.full, result.created, result.deleted) == (False, 0, 0)
    # No pod, binding or Service written (the system namespace and PriorityClass are
    # still ensured with a create answered 409 each pass: the backend's per-pass cache).
    writes = [path for method, path in fake.requests if method != "GET"]
    assert [p for p in writes if "/pods" in p or "/services" in p] == []
    after = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in fake.pods()}
    assert after == before  # the sharer's reservation pod too


def test_a_service_deleted_out_of_band_is_made_again_by_the_targeted_pass(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    served, _ = two_running(kube, cluster, org)
    name = k8s_name(cluster, f"gp-{served.pk}-0")
    core = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))
    core.delete_namespaced_service(name, NS)  # as someone with kubectl would
    assert fake.services() == []
    result = a_pass(cluster, full=False)
    assert not result.full
    assert [s["metadata"]["name"] for s in fake.services()] == [name]


def test_a_pod_whose_binding_was_lost_is_bound_by_the_targeted_pass(kube, org):  # noqa: F811
    """`pin: binding`: a pod created whose Binding failed waits unbound; the next pass,
    targeted, binds it."""
    fake = kube.require_fake()
    cluster = kube.cluster(pin="binding")
    node = kube.nodes(cluster)[0]
    workload = make_workload(org.project_a, org.researcher, "train")
    admit(workload, node, pods=[{"gpu_indices": [0]}])
    name = k8s_name(cluster, f"gp-{workload.pk}-0")
    fake.inject("500", 10, method="POST", path="/binding")  # not a RoleBinding
    a_pass(cluster, full=True, clean=False)
    fake.faults.clear()
    assert not fake.pod(NS, name)["spec"].get("nodeName")
    a_pass(cluster, full=False)
    assert fake.pod(NS, name)["spec"]["nodeName"] == node.name
