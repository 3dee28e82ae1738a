"""Distributed workloads find their peers: a headless Service, per-pod DNS names, the
environment PyTorch and torchrun read, an MPI hostfile; 127.0.0.1 on the local backend."""

from __future__ import annotations

import sys
from decimal import Decimal

import pytest

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.local import LocalBackend
from clusters.models import Backend, Cluster
from clusters.podspecs import pod_specs_for
from clusters.reconcile import cluster_reconcile
from scheduling.models import PodAllocation
from scheduling.models import WorkloadState as S
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - fixture
from tests.clusters.test_kubernetes_backend import setup  # noqa: F401 - fixture
from tests.clusters.test_local_backend import wait_until

NS = "gp-ml-vision"


def distributed(org, name: str, pods: int = 2, gpus: int = 1, **fields):
    fields.setdefault("command", ["sh", "-c", "sleep 3600"])
    return make_workload(
        org.project_a,
        org.researcher,
        name,
        kind="distributed",
        pods=pods,
        min_pods=pods,
        gpus=Decimal(gpus),
        **fields,
    )


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_a_distributed_workload_gets_a_headless_service_dns_names_and_its_rendezvous(
    kube,  # noqa: F811
    setup,  # noqa: F811
    org,
):
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = distributed(org, "ddp", pods=2, gpus=2)
    admit(
        workload,
        nodes[0],
        pods=[{"gpu_indices": [0, 1]}, {"node": nodes[1], "gpu_indices": [0, 1]}],
    )
    cluster_reconcile(cluster)
    wid = workload.pk
    # Names carry the installation's and the Cluster record's identities, as pods' do.
    headless = k8s_name(cluster, f"gp-{wid}")
    service = {s["metadata"]["name"]: s for s in fake.services()}[headless]
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS record per pod
    assert service["spec"]["publishNotReadyAddresses"] is True
    owner = KubernetesBackend(cluster).owner
    assert service["spec"]["selector"] == {**owner.labels, "gpupool.io/workload-id": str(wid)}
    assert owner.owns(service["metadata"]["labels"])
    master = f"{k8s_name(cluster, f'gp-{wid}-0')}.{headless}.{NS}.svc"
    for index in (0, 1):
        pod = fake.pod(NS, k8s_name(cluster, f"gp-{wid}-{index}"))
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (
            pod["metadata"]["name"],
            headless,
        )
        assert len(pod["spec"]["hostname"]) <= 63
        env = _env(pod)
        assert {k: env[k] for k in env if k.startswith(("PET_", "MASTER_")) or k in RANKS} == {
            "MASTER_ADDR": master,
            "MASTER_PORT": "29500",
            "WORLD_SIZE": "4",  # 2 pods x 2 GPUs
            "RANK": str(index * 2),  # the pod's first process
            "LOCAL_RANK": "0",
            "NODE_RANK": str(index),
            "PET_NNODES": "2",
            "PET_NODE_RANK": str(index),
            "PET_NPROC_PER_NODE": "2",
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29500",
        }
        assert env["GPUPOOL_HOSTFILE"] == "/etc/gpupool/hostfile"
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "gpupool-hostfile", "mountPath": "/etc/gpupool", "readOnly": True} in mounts
    hostfile = fake.objects["configmaps"][(NS, f"{headless}-hostfile")]
    assert hostfile["data"]["hostfile"] == "".join(
        f"{k8s_name(cluster, f'gp-{wid}-{i}')}.{headless}.{NS}.svc slots=2\n" for i in (0, 1)
    )
    assert hostfile["metadata"]["ownerReferences"][0]["uid"] == service["metadata"]["uid"]
    cluster_reconcile(cluster)  # pods run: the hostfile could be mounted
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


RANKS = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"}


def test_the_headless_service_and_hostfile_go_when_the_workload_ends(
    kube,  # noqa: F811
    setup,  # noqa: F811
    org,
):
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = distributed(org, "ending")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}, {"gpu_indices": [1]}])
    cluster_reconcile(cluster)
    fake.api = KubernetesBackend(cluster).api
    headless = k8s_name(cluster, f"gp-{workload.pk}")
    fake.api.delete_namespaced_service(headless, NS)  # lost: made again
    assert not fake.objects["configmaps"]  # the garbage collector took its hostfile
    cluster_reconcile(cluster)
    assert (NS, headless) in fake.objects["services"]
    assert (NS, f"{headless}-hostfile") in fake.objects["configmaps"]
    for index in (0, 1):
        fake.finish(NS, k8s_name(cluster, f"gp-{workload.pk}-{index}"), exit_code=0)
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.SUCCEEDED
    assert fake.pods() == []
    assert fake.services() == [] and fake.objects["configmaps"] == {}


def test_other_kinds_get_no_rendezvous(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = make_workload(
        org.project_a, org.researcher, "single", gpus=1, command=["sh", "-c", "sleep 1"]
    )
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    pod = fake.pod(NS, k8s_name(cluster, f"gp-{workload.pk}-0"))
    assert "hostname" not in pod["spec"] and "subdomain" not in pod["spec"]
    assert not {"MASTER_ADDR", "RANK", "PET_NNODES"} & set(_env(pod))
    assert fake.services() == [] and fake.objects["configmaps"] == {}


# --- the fake server is as strict as the real one here ---------------------------------------
def test_the_fake_refuses_bad_dns_names_and_waits_for_a_missing_config_map(kube):  # noqa: F811
    fake = kube.require_fake()
    api = KubernetesBackend(kube.cluster("raw")).api
    api.create_namespace({"metadata": {"name": "w"}})
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "nodeName": "gpu-a",
            "hostname": "Not_A_Label",
            "containers": [{"name": "main", "image": "x"}],
        },
    }
    with pytest.raises(Exception, match="422") as refused:
        api.create_namespaced_pod("w", pod)
    assert "spec.hostname" in refused.value.body
    pod["spec"]["hostname"] = "p"
    pod["spec"]["volumes"] = [{"name": "h", "configMap": {"name": "absent"}}]
    api.create_namespaced_pod("w", pod)
    waiting = fake.pod("w", "p")["status"]["containerStatuses"][0]["state"]["waiting"]
    assert (waiting["reason"], fake.pod("w", "p")["status"]["phase"]) == (
        "ContainerCreating",
        "Pending",
    )
    with pytest.raises(Exception, match="422"):
        api.create_namespaced_config_map("w", {"metadata": {"name": "c"}, "data": {"a b": "x"}})
    with pytest.raises(Exception, match="422"):
        owner = {"apiVersion": "v1", "kind": "Service", "name": "s"}  # no uid
        api.create_namespaced_config_map(
            "w", {"metadata": {"name": "c", "ownerReferences": [owner]}}
        )


# --- the local backend ----------------------------------------------------------------------
RENDEZVOUS = """
import os, socket
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((os.environ["MASTER_ADDR"], port))
    server.settimeout(20)
    peer, _ = server.accept()
    print("rank 0 met rank", peer.recv(16).decode(), "of", os.environ["WORLD_SIZE"])
else:
    import time
    for _ in range(200):
        try:
            socket.create_connection((os.environ["MASTER_ADDR"], port), 1).sendall(b"1")
            break
        except OSError:
            time.sleep(0.1)
"""


def test_local_distributed_pods_meet_on_127_0_0_1_at_a_port_of_their_own(org):
    cluster = make_cluster(config={"node_name": "here"})
    node = make_node(cluster, "here")
    workload = distributed(org, "local-ddp", gpus=0, command=[sys.executable, "-c", RENDEZVOUS])
    admit(workload, node, pods=[{}, {}])
    other = distributed(org, "other", gpus=0)
    admit(other, node, pods=[{}, {}])
    specs = pod_specs_for(list(PodAllocation.objects.order_by("workload", "pod_index")), cluster)
    ports = {s.workload_id: s.env["MASTER_PORT"] for s in specs}
    assert {s.env["MASTER_ADDR"] for s in specs} == {"127.0.0.1"}
    assert ports[workload.pk] != ports[other.pk]  # two jobs on one machine do not collide
    other.allocations.all().delete()
    other.delete()

    def finished():
        cluster_reconcile(cluster)
        workload.refresh_from_db()
        return workload.state == S.SUCCEEDED

    wait_until(finished)
    log = LocalBackend(cluster).pod_logs(f"gp-{workload.pk}-0", "")
    assert "rank 0 met rank 1 of 2" in log


def test_a_gang_admitted_with_its_minimum_of_pods_counts_only_those(org):
    cluster = make_cluster("sim", backend=Backend.SIMULATED)
    node = make_node(cluster, "n")
    workload = distributed(org, "sim-ddp", pods=3, gpus=0)
    workload.min_pods = 2
    workload.save()
    admit(workload, node, pods=[{}, {}])  # the cycle placed 2 of its 3 pods
    specs = pod_specs_for(list(PodAllocation.objects.all()), Cluster.objects.get(pk=cluster.pk))
    envs = [{k: s.env[k] for k in ("RANK", "WORLD_SIZE", "PET_NNODES")} for s in specs]
    assert envs == [
        {"RANK": "0", "WORLD_SIZE": "2", "PET_NNODES": "2"},
        {"RANK": "1", "WORLD_SIZE": "2", "PET_NNODES": "2"},
    ]
    assert {s.env["MASTER_ADDR"] for s in specs} == {"127.0.0.1"}  # not Kubernetes


def test_an_elastic_training_job_restarts_its_pods_with_the_new_world_size(
    kube,  # noqa: F811
    setup,  # noqa: F811
    org,
):
    fake = kube.require_fake()
    cluster, nodes = setup
    workload = make_workload(
        org.project_a, org.researcher, "el", kind="training", pods=4, min_pods=1,
        elastic=True, gpus=Decimal(1), command=["sh", "-c", "sleep 3600"],
    )  # fmt: skip
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}, {"gpu_indices": [1]}])
    cluster_reconcile(cluster)
    wid = workload.pk
    names = [k8s_name(cluster, f"gp-{wid}-{i}") for i in range(3)]
    env = _env(fake.pod(NS, names[1]))
    assert (env["GPUPOOL_RANK"], env["GPUPOOL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("1", "2", "2")
    assert k8s_name(cluster, f"gp-{wid}") in {s["metadata"]["name"] for s in fake.services()}
    # The cycle grew it to 3 pods; it does not handle resizing: its pods restart.
    PodAllocation.objects.create(workload=workload, pod_index=2, node=nodes[1], gpu_indices=[0])
    workload.restarting = True
    workload.save()
    for _ in range(5):
        cluster_reconcile(cluster)
        workload.refresh_from_db()
        if not workload.restarting and all(fake.pod(NS, n) for n in names):
            break
    envs = [_env(fake.pod(NS, name)) for name in names]
    assert [(e["GPUPOOL_RANK"], e["WORLD_SIZE"], e["NODE_RANK"]) for e in envs] == [
        ("0", "3", "0"),
        ("1", "3", "1"),
        ("2", "3", "2"),
    ]
    assert workload.state in (S.ADMITTED, S.RUNNING) and not workload.restarting
