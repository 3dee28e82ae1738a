"""Dynamic MIG on Kubernetes, end to end without a GPU: the portal publishes each node's
layout on its Node (the in-suite API server), the node's agent reads it with the agent's
RBAC, makes the instances through the NVML stand-in and reports their devices over HTTP to
the portal (live server), and the MIG pod starts with its device."""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from clusters.agent.kubenode import KubeNode, NodeMig
from clusters.agent.miglayout import ANNOTATION, LayoutInvalid, layout_decode, layout_encode
from clusters.agent.shipper import Shipper
from clusters.backends.kubernetes import KubernetesBackend
from clusters.metrics.services import node_token_issue
from clusters.mig import mig_sync
from clusters.models import Cluster, Gpu, MigInstance, Node, NodePool
from clusters.reconcile import cluster_reconcile
from tests.clusters.conftest import admit, make_workload
from tests.clusters.fake_nvml import FakeGpu, FakeNvml
from tests.clusters.kube import (
    k8s_name,
    kube,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.timeout(90)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
H100 = ("NVIDIA H100 80GB HBM3", 81559)
MIG_NODE = "gpu-m"


def rules(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return next(d for d in docs if d["kind"] == "ClusterRole")["rules"]


AGENT_RULES = rules(DEPLOY / "agent" / "rbac.yaml")
CONTROLLER_RULES = rules(DEPLOY / "base" / "rbac.yaml")


@pytest.fixture
def mig_cluster(kube):  # noqa: F811
    """A node of two H100s whose agent reported both in MIG mode, synced into the portal."""
    fake = kube.require_fake()
    fake.add_node(
        MIG_NODE, gpus=2, model="NVIDIA-H100-80GB-HBM3", labels={"gpupool.io/node-pool": "h100"}
    )
    cluster = kube.cluster()
    kube.nodes(cluster)
    node = Node.objects.get(cluster=cluster, name=MIG_NODE)
    node.mig_report = {"layout": "", "mig_mode": [0, 1], "devices": {}, "errors": []}
    node.save(update_fields=["mig_report"])
    kube.nodes(cluster)  # the inventory takes MIG mode from the agent's report
    return cluster, node


def node_agent(fake, tmp_path, nvml: FakeNvml) -> NodeMig:
    token = tmp_path / "token"
    token.write_text("agent-service-account-token")
    return NodeMig(KubeNode(fake.url, MIG_NODE, token_file=token, ca_file=tmp_path / "no-ca"), nvml)


def layout_on(fake, name: str = MIG_NODE) -> dict:
    annotations = fake.objects["nodes"][("", name)]["metadata"].get("annotations") or {}
    return layout_decode(annotations[ANNOTATION])


def test_the_inventory_takes_mig_mode_from_the_nodes_agent(mig_cluster):
    _, node = mig_cluster
    assert list(Gpu.objects.filter(node=node).values_list("index", "mig_enabled")) == [
        (0, True),
        (1, True),
    ]
    other = Node.objects.get(cluster=node.cluster, name="gpu-a")
    assert not Gpu.objects.filter(node=other, mig_enabled=True).exists()


def test_the_backend_publishes_each_nodes_layout_once_and_keeps_its_id(kube, mig_cluster):  # noqa: F811
    cluster, node = mig_cluster
    fake = kube.fake
    gpu0 = Gpu.objects.get(node=node, index=0)
    MigInstance.objects.create(gpu=gpu0, profile="3g.40gb", start=4)
    MigInstance.objects.create(gpu=gpu0, profile="1g.10gb", start=0)
    fake.allow(CONTROLLER_RULES)
    assert mig_sync(cluster, KubernetesBackend(cluster)) == []
    layout = layout_on(fake)
    assert layout["gpus"] == {0: [("1g.10gb", 0), ("3g.40gb", 4)], 1: []}
    assert layout["destroy"] is True
    owner = KubernetesBackend(cluster).owner
    assert layout["owner"] == f"{owner.installation}/{owner.cluster}"
    before = len(fake.requests)
    assert mig_sync(cluster, KubernetesBackend(cluster)) == []
    assert fake.requests[before:] == []  # unchanged: neither listed nor written again
    assert layout_on(fake)["id"] == layout["id"]
    assert list(MigInstance.objects.values_list("uuid", flat=True)) == ["", ""]  # not reported
    assert fake.denied == []
    # Another shape: a new layout under a new id.
    MigInstance.objects.filter(start=0).delete()
    mig_sync(cluster, KubernetesBackend(cluster))
    assert layout_on(fake)["gpus"][0] == [("3g.40gb", 4)]
    assert layout_on(fake)["id"] != layout["id"]


def test_a_pool_that_forbids_repartitioning_publishes_a_layout_that_destroys_nothing(
    kube,  # noqa: F811
    mig_cluster,
):
    cluster, node = mig_cluster
    NodePool.objects.filter(name="h100").update(mig_repartition=False)
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=1), profile="7g.80gb", start=0)
    mig_sync(cluster, KubernetesBackend(cluster))
    assert layout_on(kube.fake)["destroy"] is False


def test_a_layout_another_gpupool_published_is_left_alone_with_an_error(kube, mig_cluster):  # noqa: F811
    cluster, node = mig_cluster
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=0), profile="1g.10gb", start=0)
    theirs = json.dumps({"id": "0123456789abcdef", "owner": "someone/else", "destroy": True,
                         "gpus": {"0": [["7g.80gb", 0]]}})  # fmt: skip
    KubernetesBackend(cluster).api.patch_node(
        MIG_NODE, {"metadata": {"annotations": {ANNOTATION: theirs}}}
    )
    errors = mig_sync(cluster, KubernetesBackend(cluster))
    assert errors == [
        f"node {MIG_NODE}: its MIG layout is published by another GPUPool (someone/else); "
        "not changed"
    ]
    assert layout_on(kube.fake)["owner"] == "someone/else"


@pytest.mark.django_db(transaction=True)
def test_a_mig_pod_starts_with_the_device_its_nodes_agent_made_and_reported(
    kube,  # noqa: F811
    mig_cluster,
    org,
    live_server,
    tmp_path,
):
    """1. the cycle wants a 3g.40gb at slice 4 of GPU 0 for an admitted pod; 2. a pass
    publishes it and holds the pod back; 3. the agent, bound to the agent's role, makes it
    and reports; 4. the next pass stores the device and starts the pod on it."""
    cluster, node = mig_cluster
    fake = kube.fake
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=0), profile="3g.40gb", start=4)
    work = make_workload(org.project_a, org.researcher, "mig", command=["sleep", "9"])
    admit(work, node, pods=[{"mig_gpu_index": 0, "mig_profile": "3g.40gb", "mig_start": 4}])
    fake.allow(CONTROLLER_RULES)
    cluster_reconcile(cluster)
    assert fake.pods() == []  # no device yet: it would see no GPU, or all of them
    _, token = node_token_issue(actor=None, node=node)
    nvml = FakeNvml([FakeGpu(*H100, mig=True), FakeGpu(*H100, mig=True)])
    fake.allow(AGENT_RULES)
    report = node_agent(fake, tmp_path, nvml).sync(Shipper(live_server.url, token))
    (gi,) = nvml.gpus[0].gis
    (ci,) = gi.cis
    assert (gi.start, gi.size) == (4, 4)
    assert report["devices"] == {"0": {"4": ci.uuid}} and report["errors"] == []
    node.refresh_from_db()
    assert node.mig_report["layout"] == layout_on(fake)["id"]
    assert node.mig_report["mig_mode"] == [0, 1]
    fake.allow(CONTROLLER_RULES)
    cluster_reconcile(cluster)
    assert MigInstance.objects.get().uuid == ci.uuid
    pod = fake.pod(org.project_a.namespace, k8s_name(cluster, f"gp-{work.pk}-0"))
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == ci.uuid == env["CUDA_VISIBLE_DEVICES"]
    assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"][0]["resources"])
    assert fake.denied == []
    # A new layout on the node (another GPU) leaves the known device in place until the
    # agent reports the new layout: the running pod is not touched.
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=1), profile="1g.10gb", start=0)
    cluster_reconcile(cluster)
    assert MigInstance.objects.get(start=4).uuid == ci.uuid
    assert fake.pod(org.project_a.namespace, k8s_name(cluster, f"gp-{work.pk}-0")) is not None


@pytest.mark.django_db(transaction=True)
def test_a_placement_nvml_refuses_is_the_clusters_error_and_the_pod_waits(
    kube,  # noqa: F811
    mig_cluster,
    org,
    live_server,
    tmp_path,
):
    """An instance made by hand on a pool that forbids repartitioning overlaps the one
    wanted: the agent destroys nothing, NVML refuses the placement, the cluster shows it."""
    cluster, node = mig_cluster
    fake = kube.fake
    NodePool.objects.filter(name="h100").update(mig_repartition=False)
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=0), profile="2g.20gb", start=0)
    work = make_workload(org.project_a, org.researcher, "mig", command=["sleep", "9"])
    admit(work, node, pods=[{"mig_gpu_index": 0, "mig_profile": "2g.20gb", "mig_start": 0}])
    cluster_reconcile(cluster)
    nvml = FakeNvml([FakeGpu(*H100, mig=True), FakeGpu(*H100, mig=True)])
    by_hand = nvml.nvmlDeviceGetHandleByIndex(0)
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 1, 1
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(by_hand, 0, ctypes.byref(placement))  # 1g at 1
    _, token = node_token_issue(actor=None, node=node)
    report = node_agent(fake, tmp_path, nvml).sync(Shipper(live_server.url, token))
    assert [(gi.start, gi.size) for gi in nvml.gpus[0].gis] == [(1, 1)]  # kept
    assert report["devices"] == {}
    (error,) = report["errors"]
    assert error.startswith("GPU 0: cannot create 2g.20gb at 0: ")  # INSUFFICIENT_RESOURCES
    result = cluster_reconcile(cluster)
    cluster.refresh_from_db()
    assert f"node {MIG_NODE}: {error}" in cluster.last_error
    assert f"node {MIG_NODE}: {error}" in result.errors
    assert cluster.reachable and fake.pods() == []
    assert MigInstance.objects.get().uuid == ""


def test_the_agents_role_reads_a_node_and_nothing_more(kube, tmp_path):  # noqa: F811
    fake = kube.require_fake()
    fake.allow(AGENT_RULES)
    token = tmp_path / "token"
    token.write_text("t")
    assert KubeNode(fake.url, "gpu-a", token_file=token).annotation(ANNOTATION) == ""
    api = KubernetesBackend(Cluster(name="x"), kubeconfig=fake.kubeconfig(),
                            installation="i").api  # fmt: skip
    for call, args in ((api.list_node, ()), (api.patch_node, ("gpu-a", {"metadata": {}}))):
        with pytest.raises(ApiException) as err:
            call(*args)
        assert err.value.status == 403
    assert [d[:2] for d in fake.denied] == [("list", "nodes"), ("patch", "nodes")]


def test_an_agent_that_cannot_read_its_node_changes_nothing(kube, tmp_path):  # noqa: F811
    fake = kube.require_fake()
    fake.allow([])  # no role bound
    nvml = FakeNvml([FakeGpu(*H100, mig=True)])

    class NoPortal:
        def report_mig(self, report):
            raise AssertionError("nothing to report")

    assert node_agent(fake, tmp_path, nvml).sync(NoPortal()) is None
    assert nvml.gpus[0].gis == []


def test_a_layout_removed_by_hand_is_published_again_at_the_next_resync(kube, mig_cluster):  # noqa: F811
    cluster, node = mig_cluster
    fake = kube.fake
    MigInstance.objects.create(gpu=Gpu.objects.get(node=node, index=0), profile="1g.10gb", start=0)
    mig_sync(cluster, KubernetesBackend(cluster))
    first = layout_on(fake)["id"]
    KubernetesBackend(cluster).api.patch_node(
        MIG_NODE, {"metadata": {"annotations": {ANNOTATION: None}}}
    )
    mig_sync(cluster, KubernetesBackend(cluster))  # within resync_s: trusts what it wrote
    assert ANNOTATION not in fake.objects["nodes"][("", MIG_NODE)]["metadata"]["annotations"]
    cluster.config = {**cluster.config, "resync_s": 0}
    mig_sync(cluster, KubernetesBackend(cluster))
    assert layout_on(fake)["gpus"] == {0: [("1g.10gb", 0)], 1: []}
    assert layout_on(fake)["id"] != first


def test_the_agent_reports_a_change_at_once_and_an_unchanged_report_only_now_and_then(
    kube,  # noqa: F811
    tmp_path,
):
    fake = kube.require_fake()
    nvml = FakeNvml([FakeGpu(*H100, mig=True)])
    fake.add_node(MIG_NODE, gpus=1)

    class Portal:
        def __init__(self):
            self.reports = []

        def report_mig(self, report):
            self.reports.append(report)
            return True

    portal = Portal()
    agent = node_agent(fake, tmp_path, nvml)
    agent.sync(portal)
    agent.sync(portal)
    assert portal.reports == [{"layout": "", "mig_mode": [0], "devices": {}, "errors": []}]
    agent.resend_s = 0
    agent.sync(portal)
    assert len(portal.reports) == 2


# --- the layout's format: what the agent accepts from the Node ------------------------------


def test_a_layout_decodes_to_what_was_encoded():
    text = layout_encode("0123456789abcdef", "i/c", {6: [("3g.40gb", 4), ("1g.10gb", 0)], 7: []},
                         destroy=False)  # fmt: skip
    assert layout_decode(text) == {
        "id": "0123456789abcdef",
        "owner": "i/c",
        "destroy": False,
        "gpus": {6: [("1g.10gb", 0), ("3g.40gb", 4)], 7: []},
    }


GOOD_LAYOUT = {"id": "0123456789abcdef", "owner": "i/c", "destroy": True, "gpus": {"0": []}}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"id": "x"}, "no layout id"),
        ({"destroy": "yes"}, "destroy must be true or false"),
        ({"gpus": {"64": []}}, "is not an index below 64"),
        ({"gpus": {"-1": []}}, "is not an index below 64"),
        ({"gpus": {"0": [["1g.10gb", 8]]}}, "is not an index below 8"),
        ({"gpus": {"0": [["1g.10gb", True]]}}, "is not an index below 8"),
        ({"gpus": {"0": [["rm -rf", 0]]}}, "an instance is [profile, start]"),
        ({"gpus": {"0": [["1g.10gb", 0]] * 9}}, "at most 8 instances"),
        ({"gpus": {str(i): [] for i in range(65)}}, "at most 64 entries"),
    ],
)
def test_a_malformed_layout_is_refused_whole(change, why):
    with pytest.raises(LayoutInvalid, match=re.escape(why)):
        layout_decode(json.dumps({**GOOD_LAYOUT, **change}))


def test_a_layout_that_is_not_json_or_too_long_is_refused():
    with pytest.raises(LayoutInvalid, match="not JSON"):
        layout_decode("{")
    with pytest.raises(LayoutInvalid, match="longer than"):
        layout_decode(" " * (64 * 1024 + 1))


def test_the_agent_syncs_mig_on_the_node_it_is_told_with_the_pods_service_account():
    from clusters.agent.main import node_mig, parse_args

    args = parse_args(["--mig-node", "gpu-7", "--kube-api", "https://10.0.0.1:443"])
    mig = node_mig(args, FakeNvml([]))
    assert (mig.node.api, mig.node.name) == ("https://10.0.0.1:443", "gpu-7")
    assert str(mig.node.token_file) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert str(mig.node.ca_file) == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    assert node_mig(parse_args(["--kube-api", "https://x"]), FakeNvml([])) is None
    assert node_mig(parse_args(["--mig-node", "n", "--kube-api", ""]), FakeNvml([])) is None
