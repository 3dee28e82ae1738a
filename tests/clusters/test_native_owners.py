"""Pods made by operators are one workload per top owner (issue 26): the intake walks their
controllers up (a JobSet's Jobs, a Kubeflow training job, a RayJob's RayCluster, a CronJob's
Job, a Deployment's ReplicaSet, a LeaderWorkerSet's group), sizes the gang from the owner's
spec, shows the top owner on pages, and suspends that owner when the portal stops it.

The tests create the owners and their pods as the operators would (no operator runs: the
fake serves their kinds as custom resources, tests/clusters/test_fake_apiserver_native.py),
and drive the portal's real path: reconcile (intake), cycle, reconcile (binding)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from clusters.backends.kubernetes.owners import OWNER_KINDS
from clusters.reconcile import cluster_reconcile
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_stop
from tests.clusters.fake_generic import CUSTOM_KINDS
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import (
    NS,
    job_body,
    native_workloads,
    pod_body,
    pod_scheduled,
    setup,  # noqa: F401 - the fixture
    step,
)

S = WorkloadState
pytestmark = pytest.mark.timeout(60)
KUBEFLOW, RAY, JOBSET = "kubeflow.org/v1", "ray.io/v1", "jobset.x-k8s.io/v1alpha2"


def controlled_by(obj: dict) -> dict:
    """An ownerReference to `obj` as its controller, as an operator writes it."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def custom(core, api_version: str, plural: str, body: dict) -> dict:
    group, _, version = api_version.rpartition("/")
    objects = k8s.CustomObjectsApi(core.api_client)
    return objects.create_namespaced_custom_object(group, version, NS, plural, body)


def read_custom(core, api_version: str, plural: str, name: str) -> dict:
    group, _, version = api_version.rpartition("/")
    objects = k8s.CustomObjectsApi(core.api_client)
    return objects.get_namespaced_custom_object(group, version, NS, plural, name)


def owned_pods(core, owner: dict, names: list[str], gpus: int = 1, **meta) -> None:
    """Pods an operator makes for `owner`."""
    for name in names:
        core.create_namespaced_pod(
            NS, pod_body(name, gpus, ownerReferences=[controlled_by(owner)], **meta)
        )


def replica_set_of_a_deployment(core, name: str, replicas: int = 1) -> dict:
    """A Deployment and its ReplicaSet `<name>-1`, as the Deployment controller makes it."""
    apps = k8s.AppsV1Api(core.api_client)
    template = {"metadata": {"labels": {"app": name}}, "spec": pod_body("x")["spec"]}
    template["spec"]["restartPolicy"] = "Always"
    spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
    deployment = apps.create_namespaced_deployment(NS, {"metadata": {"name": name}, "spec": spec})
    owner = as_dict(core, deployment, "apps/v1", "Deployment")
    body = {
        "metadata": {"name": f"{name}-1", "ownerReferences": [controlled_by(owner)]},
        "spec": spec,
    }
    return as_dict(core, apps.create_namespaced_replica_set(NS, body), "apps/v1", "ReplicaSet")


def as_dict(core, model, api_version: str, kind: str) -> dict:
    """A typed client's answer as the server sent it (the client drops apiVersion, kind)."""
    found = core.api_client.sanitize_for_serialization(model)
    return found | {"apiVersion": api_version, "kind": kind}


def bound_pods(fake) -> list[str]:
    return sorted(p["metadata"]["name"] for p in fake.pods() if p["spec"].get("nodeName"))


def stop_and_reconcile(cluster, org, workload: Workload) -> None:
    workload_stop(actor=org.researcher, workload=workload)
    cluster_reconcile(cluster)


def owner_reads(fake) -> list[str]:
    """GETs of owner objects (not pods, namespaces, nodes) the API server answered."""
    core = ("/api/v1/", "/version")
    return [path for method, path in fake.requests if method == "GET" and not path.startswith(core)]


@pytest.fixture
def operators(kube, setup):  # noqa: F811
    """The cluster, with the operators' CRDs installed: (fake, cluster, core client)."""
    fake = kube.require_fake()
    fake.install_crds()
    return (fake, *setup)


def job_template(parallelism: int) -> dict:
    body = job_body("unused", parallelism)
    return {"spec": body["spec"]}


def test_a_jobsets_jobs_are_one_gang_read_once_and_stopping_suspends_the_jobset(operators, org):
    fake, cluster, core = operators
    jobset = custom(core, JOBSET, "jobsets", {
        "apiVersion": JOBSET, "kind": "JobSet", "metadata": {"name": "llm"},
        "spec": {"replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": job_template(1)},
            {"name": "workers", "replicas": 2, "template": job_template(1)},
        ]},
    })  # fmt: skip
    batch = k8s.BatchV1Api(core.api_client)
    for name in ("llm-driver-0", "llm-workers-0", "llm-workers-1"):  # as its controller does
        job = job_body(name, parallelism=1)
        job["metadata"]["ownerReferences"] = [controlled_by(jobset)]
        batch.create_namespaced_job(NS, job)
    fake.run_controllers()  # the Job controller makes a pod per Job
    step(cluster)
    (workload,) = native_workloads()
    assert (workload.kind, workload.pods, workload.min_pods) == ("distributed", 3, 3)
    native = workload.spec["native"]
    assert (native["owner"]["kind"], native["owner"]["name"]) == ("JobSet", "llm")
    assert native["target"]["uid"] == jobset["metadata"]["uid"]
    assert len(bound_pods(fake)) == 3
    # A queued gang's pods are placed by its record: no owner is read again.
    fake.requests.clear()
    cluster_reconcile(cluster)
    assert owner_reads(fake) == []
    workload.refresh_from_db()
    assert workload.state == S.RUNNING
    stop_and_reconcile(cluster, org, workload)
    assert read_custom(core, JOBSET, "jobsets", "llm")["spec"]["suspend"] is True


def pytorch_job(core, name: str, workers: int) -> dict:
    """A PyTorchJob of a Master and `workers` Workers, as its user applies it."""
    replica = {"template": job_template(1)["spec"]["template"]}
    return custom(core, KUBEFLOW, "pytorchjobs", {
        "apiVersion": KUBEFLOW, "kind": "PyTorchJob", "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, **replica}, "Worker": {"replicas": workers, **replica},
        }},
    })  # fmt: skip


def test_a_pytorchjob_is_a_gang_of_its_replicas_and_waits_for_all_of_them(operators, org):
    fake, cluster, core = operators
    job = pytorch_job(core, "bert", workers=3)
    owned_pods(core, job, ["bert-master-0", "bert-worker-0"])
    step(cluster)
    assert native_workloads() == []  # queued once the gang is whole
    assert "2 of 4 pods exist" in pod_scheduled(fake.pod(NS, "bert-worker-0"))["message"]
    owned_pods(core, job, ["bert-worker-1", "bert-worker-2"])
    step(cluster)
    (workload,) = native_workloads()
    assert (workload.pods, workload.min_pods) == (4, 4)
    assert workload.spec["native"]["owner"]["kind"] == "PyTorchJob"
    assert len(bound_pods(fake)) == 4
    stop_and_reconcile(cluster, org, workload)
    spec = read_custom(core, KUBEFLOW, "pytorchjobs", "bert")["spec"]
    assert spec["runPolicy"] == {"suspend": True}


def test_a_pending_gangs_pods_deleted_wait_for_its_owner_until_it_says_it_failed(operators, org):
    fake, cluster, core = operators
    job = pytorch_job(core, "huge", workers=2)
    names = ["huge-master-0", "huge-worker-0", "huge-worker-1"]
    owned_pods(core, job, names, gpus=8)  # 24 GPUs: more than the cluster has
    step(cluster)
    (workload,) = native_workloads()
    assert workload.state == S.PENDING
    for name in names:  # its operator restarts the job (makes its pods again later)
        core.delete_namespaced_pod(name, NS)
    fake.complete_deletions()
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert workload.state == S.PENDING
    with fake.lock:  # the operator's status: the job failed
        stored = fake.objects["kubeflow.org/v1/pytorchjobs"][(NS, "huge")]
        stored["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    cluster_reconcile(cluster)
    workload.refresh_from_db()
    assert (workload.state, workload.message) == (S.STOPPED, "PyTorchJob huge failed.")


def test_a_rayjobs_cluster_is_one_gang_owned_by_the_rayjob_which_is_suspended(operators, org):
    fake, cluster, core = operators
    head = {"rayStartParams": {}, "template": job_template(1)["spec"]["template"]}
    workers = {"groupName": "gpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 5, **head}
    ray_spec = {"headGroupSpec": head, "workerGroupSpecs": [workers]}
    ray_job = custom(core, RAY, "rayjobs", {
        "apiVersion": RAY, "kind": "RayJob", "metadata": {"name": "tune"},
        "spec": {"entrypoint": "python tune.py", "rayClusterSpec": ray_spec},
    })  # fmt: skip
    ray_cluster = custom(core, RAY, "rayclusters", {
        "apiVersion": RAY, "kind": "RayCluster",
        "metadata": {"name": "tune-raycluster", "ownerReferences": [controlled_by(ray_job)]},
        "spec": ray_spec,
    })  # fmt: skip
    owned_pods(core, ray_cluster, ["tune-head", "tune-gpu-worker-0", "tune-gpu-worker-1"])
    step(cluster)
    (workload,) = native_workloads()
    assert (workload.pods, workload.min_pods) == (3, 3)
    native = workload.spec["native"]
    assert (native["owner"]["kind"], native["target"]["kind"]) == ("RayJob", "RayJob")
    assert workload.name == "tune"
    assert len(bound_pods(fake)) == 3
    stop_and_reconcile(cluster, org, workload)
    assert read_custom(core, RAY, "rayjobs", "tune")["spec"]["suspend"] is True
    assert "suspend" not in read_custom(core, RAY, "rayclusters", "tune-raycluster")["spec"]


def test_a_cronjobs_run_is_a_workload_of_its_own_shown_with_the_cronjob(operators, org, client_as):
    fake, cluster, core = operators
    batch = k8s.BatchV1Api(core.api_client)
    cron = batch.create_namespaced_cron_job(NS, {
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": job_template(2)},
    })  # fmt: skip
    owner = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
             "uid": cron.metadata.uid, "controller": True}  # fmt: skip
    run = job_body("nightly-29012", parallelism=2)
    run["metadata"]["ownerReferences"] = [owner]
    batch.create_namespaced_job(NS, run)
    fake.run_controllers()
    step(cluster)
    (workload,) = native_workloads()
    assert (workload.name, workload.pods) == ("nightly-29012", 2)
    assert len(bound_pods(fake)) == 2
    origin = client_as(org.researcher).get(f"/api/v1/workloads/{workload.pk}/").json()["origin"]
    assert (origin["kind"], origin["name"]) == ("CronJob", "nightly")
    page = client_as(org.researcher).get(f"/workloads/{workload.pk}/").content.decode()
    assert f"Job {NS}/nightly-29012 of CronJob {NS}/nightly" in page
    stop_and_reconcile(cluster, org, workload)
    assert batch.read_namespaced_job("nightly-29012", NS).spec.suspend is True
    assert batch.read_namespaced_cron_job("nightly", NS).spec.suspend is False  # runs go on


def test_a_deployments_pods_are_workloads_of_their_own_shown_with_the_deployment(
    operators, org, client_as
):
    fake, cluster, core = operators
    replica_set = replica_set_of_a_deployment(core, "serve", replicas=2)
    owned_pods(core, replica_set, ["serve-1-a", "serve-1-b"], labels={"app": "serve"})
    step(cluster)
    first, second = native_workloads()
    assert [(w.name, w.pods, w.kind) for w in (first, second)] == [
        ("serve-1-a", 1, "training"),
        ("serve-1-b", 1, "training"),
    ]
    assert {w.spec["native"]["owner"]["kind"] for w in (first, second)} == {"Deployment"}
    assert bound_pods(fake) == ["serve-1-a", "serve-1-b"]
    origin = client_as(org.researcher).get(f"/api/v1/workloads/{first.pk}/").json()["origin"]
    assert origin["summary"].startswith(f"Deployment {NS}/serve")
    stop_and_reconcile(cluster, org, first)
    fake.complete_deletions()
    assert bound_pods(fake) == ["serve-1-b"]  # the stopped one's pod is deleted


def test_a_leaderworkersets_group_is_one_gang_of_its_size(operators, org):
    fake, cluster, core = operators
    apps = k8s.AppsV1Api(core.api_client)
    template = {"metadata": {"labels": {"app": "lws"}}, "spec": pod_body("x")["spec"]}
    template["spec"]["restartPolicy"] = "Always"
    leaders = apps.create_namespaced_stateful_set(NS, {"metadata": {"name": "vllm"}, "spec": {
        "selector": {"matchLabels": {"app": "lws"}}, "template": template, "serviceName": "vllm",
    }})  # fmt: skip
    owner = as_dict(core, leaders, "apps/v1", "StatefulSet")
    lws = "leaderworkerset.sigs.k8s.io"
    labels = {f"{lws}/name": "vllm", f"{lws}/group-index": "0", f"{lws}/group-key": "3e2387793"}
    annotations = {f"{lws}/size": "3"}
    owned_pods(core, owner, ["vllm-0", "vllm-0-1"], labels=labels, annotations=annotations)
    step(cluster)
    assert native_workloads() == []
    assert "2 of 3 pods exist" in pod_scheduled(fake.pod(NS, "vllm-0"))["message"]
    owned_pods(core, owner, ["vllm-0-2"], labels=labels, annotations=annotations)
    step(cluster)
    (workload,) = native_workloads()
    native = workload.spec["native"]
    assert (workload.name, workload.pods) == ("vllm-0", 3)
    assert (native["owner"]["kind"], native["owner"]["name"]) == ("LeaderWorkerSet", "vllm")
    assert len(bound_pods(fake)) == 3


def test_an_owner_whose_crd_is_missing_groups_by_the_pods_controller_and_says_so(
    kube,  # noqa: F811
    setup,  # noqa: F811
    org,
):
    """No MPIJob CRD (the operator was uninstalled, its pods remain): the pass goes on;
    the pods are grouped by their controller, with an event saying why (not where the
    gang annotation asked for just that)."""
    fake = kube.require_fake()
    cluster, core = setup
    for name, uid, annotated in (
        ("allreduce", "0b6f3f8e-2f7a-4d37-9a59-6d3c1f5e2a10", {}),
        ("sized", "5d0c1f7e-8a47-4a3e-b1a4-0f9e2c6d7b21", {"gpupool.io/min-available": "1"}),
    ):
        ghost = {"apiVersion": KUBEFLOW, "kind": "MPIJob", "metadata": {"name": name, "uid": uid}}
        workers = [f"{name}-launcher", f"{name}-worker-0"][: 1 if annotated else 2]
        owned_pods(core, ghost, workers, annotations=annotated)
    core.create_namespaced_pod(NS, pod_body("alone"))
    result = cluster_reconcile(cluster)
    assert result.errors == []
    gangs = sorted((w.name, w.pods, w.spec["native"]["owner"]["kind"]) for w in native_workloads())
    assert gangs == [("allreduce", 2, "MPIJob"), ("alone", 1, "Pod"), ("sized", 1, "MPIJob")]
    said = [e for e in fake.events(NS) if e["reason"] == "OwnerNotRead"]
    assert sorted(e["involvedObject"]["name"] for e in said) == [
        "allreduce-launcher",
        "allreduce-worker-0",
    ]
    assert "does not serve mpijobs" in said[0]["message"]


def test_a_second_pass_does_not_check_the_projects_namespace_again(kube, setup, org):  # noqa: F811
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("trainer"))
    cluster_reconcile(cluster)
    assert any(path.startswith(f"/api/v1/namespaces/{NS}") for _, path in fake.requests)
    fake.requests.clear()
    cluster_reconcile(cluster)
    namespace_requests = [
        (method, path)
        for method, path in fake.requests
        if path in ("/api/v1/namespaces", f"/api/v1/namespaces/{NS}")
    ]
    assert namespace_requests == []
    assert native_workloads()[0].state in (S.PENDING, S.ADMITTED)


TRAINING_KINDS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}


def every_owner_kind(core) -> None:
    """One owner of each kind GPUPool reads (and suspends), each with a pod of 1 GPU, as
    their operators make them: a JobSet's Job (its pod: the Job controller's, run after),
    each Kubeflow training job, a RayJob's RayCluster, a RayCluster alone, a Deployment's
    ReplicaSet (tests/clusters/test_kubernetes_rbac.py: the verbs they need)."""
    template = job_template(1)
    jobset = custom(core, JOBSET, "jobsets", {
        "apiVersion": JOBSET, "kind": "JobSet", "metadata": {"name": "set"},
        "spec": {"replicatedJobs": [{"name": "main", "replicas": 1, "template": template}]},
    })  # fmt: skip
    job = job_body("set-main-0", parallelism=1)
    job["metadata"]["ownerReferences"] = [controlled_by(jobset)]
    k8s.BatchV1Api(core.api_client).create_namespaced_job(NS, job)
    replica = {"replicas": 1, "template": template["spec"]["template"]}
    for kind, field in TRAINING_KINDS.items():
        name = kind.lower()
        body = {"apiVersion": KUBEFLOW, "kind": kind, "metadata": {"name": name},
                "spec": {field: {"Worker": replica}}}  # fmt: skip
        owned_pods(core, custom(core, KUBEFLOW, f"{name}s", body), [f"{name}-worker-0"])
    head = {"rayStartParams": {}, "template": template["spec"]["template"]}
    ray_job = custom(core, RAY, "rayjobs", {
        "apiVersion": RAY, "kind": "RayJob", "metadata": {"name": "rayjob"},
        "spec": {"entrypoint": "python run.py"},
    })  # fmt: skip
    for name, owners in (("rayjob-cluster", [controlled_by(ray_job)]), ("raycluster", [])):
        ray_cluster = custom(core, RAY, "rayclusters", {
            "apiVersion": RAY, "kind": "RayCluster",
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"headGroupSpec": head},
        })  # fmt: skip
        owned_pods(core, ray_cluster, [f"{name}-head"])
    owned_pods(core, replica_set_of_a_deployment(core, "web"), ["web-1-x"], labels={"app": "web"})


def operators_remove_suspended(fake) -> None:
    """What the operators do once their owners are suspended: no pod runs (no operator runs
    here, so the owners are deleted, and the garbage collector takes their pods)."""
    with fake.lock:
        for api_version, plural in CUSTOM_KINDS:
            store = f"{api_version}/{plural}"
            for ns, name in list(fake.objects.get(store, {})):
                if (ns, name) in fake.objects[store]:
                    fake._delete(store, ns, name)


@pytest.mark.parametrize(
    ("kind", "spec", "size"),
    [
        (("batch/v1", "Job"), {}, 1),
        (("batch/v1", "Job"), {"parallelism": 4, "completions": 2}, 2),
        (("batch/v1", "Job"), {"parallelism": 3}, 3),  # a work queue: no completions
        (
            (JOBSET, "JobSet"),
            {"replicatedJobs": [
                {"name": "a", "template": {"spec": {"parallelism": 2, "completions": 2}}},
                {"name": "b", "replicas": 3, "template": {"spec": {}}},
            ]},
            5,  # replicas default 1; a Job template's parallelism default 1
        ),
        ((KUBEFLOW, "MPIJob"), {"mpiReplicaSpecs": {"Launcher": {}, "Worker": {"replicas": 4}}}, 5),
        ((KUBEFLOW, "JAXJob"), {"jaxReplicaSpecs": {"Worker": {"replicas": 2}}}, 2),
        ((RAY, "RayCluster"), {"headGroupSpec": {}}, 1),
        (
            (RAY, "RayCluster"),
            {"headGroupSpec": {}, "workerGroupSpecs": [
                {"groupName": "a", "minReplicas": 2, "replicas": 4}, {"groupName": "b"}]},
            3,  # the head and the minimum of each group (default 0)
        ),
    ],
)  # fmt: skip
def test_each_owner_kinds_gang_size_comes_from_its_spec_with_the_operators_defaults(
    kind, spec, size
):
    assert OWNER_KINDS[kind].size({"spec": spec}) == size
