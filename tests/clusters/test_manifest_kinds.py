"""Manifests of the kinds users apply with kubectl (a Deployment, a StatefulSet, a JobSet, a
PyTorchJob, a RayJob, a LeaderWorkerSet...) submitted to GPUPool: created in the project's
namespace with every pod template naming GPUPool's scheduler, checked before anything is
written, then queued and bound by the native intake under their top owner; only the kinds
the project allows (issue 26).

No operator runs in the in-suite API server: each test makes what the kind's controller
would (its ReplicaSet, Jobs, RayCluster, pods) from the stored object's own templates."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.conf import settings
from kubernetes import client as k8s
from rest_framework.test import APIClient

from clusters.manifest_kinds import KINDS, NAMES, pod_templates
from clusters.manifest_submit import manifest_submit
from portal.errors import ValidationFailed
from portal.models import AuditLog, Project
from scheduling.models import WorkloadState
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import native_workloads, pod_body, step
from tests.clusters.test_manifest_submit import cluster, core, restricted  # noqa: F401
from tests.clusters.test_native_owners import TRAINING_KINDS, controlled_by

S = WorkloadState
pytestmark = pytest.mark.timeout(60)
NS = "gp-ml-vision"  # project_a's namespace
KUBEFLOW, RAY, JOBSET = "kubeflow.org/v1", "ray.io/v1", "jobset.x-k8s.io/v1alpha2"
LWS = "leaderworkerset.x-k8s.io/v1"


@pytest.fixture
def every_kind(kube, org, cluster):  # noqa: F811
    """The cluster with its operators' CRDs, and project A allowing every kind."""
    fake = kube.require_fake()
    fake.install_crds()
    Project.objects.filter(pk=org.project_a.pk).update(manifest_kinds=NAMES)
    org.project_a.refresh_from_db()
    return fake


def template(app: str, restart: str = "Never") -> dict:
    """A pod template of one GPU, without a scheduler (GPUPool sets it)."""
    spec = pod_body("x")["spec"]
    del spec["schedulerName"]
    spec["restartPolicy"] = restart
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def workload_spec(app: str) -> dict:
    return {"selector": {"matchLabels": {"app": app}}, "template": template(app, "Always")}


MANIFESTS = {
    "Deployment": ("apps/v1", {"replicas": 2, **workload_spec("serve")}),
    "StatefulSet": ("apps/v1", {"serviceName": "db", **workload_spec("db")}),
    "CronJob": ("batch/v1", {"schedule": "0 3 * * *", "jobTemplate": {
        "spec": {"template": template("nightly")}}}),
    "JobSet": (JOBSET, {"replicatedJobs": [{"name": "main", "replicas": 2, "template": {
        "spec": {"parallelism": 1, "completions": 1, "template": template("set")}}}]}),
    "PyTorchJob": (KUBEFLOW, {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": template("bert")},
        "Worker": {"replicas": 2, "template": template("bert")}}}),
    "RayJob": (RAY, {"entrypoint": "python run.py", "rayClusterSpec": {
        "headGroupSpec": {"rayStartParams": {}, "template": template("ray", "Always")},
        "workerGroupSpecs": [{"groupName": "gpu", "minReplicas": 1, "replicas": 1,
                              "template": template("ray", "Always")}]}}),
    "LeaderWorkerSet": (LWS, {"leaderWorkerTemplate": {
        "size": 2, "workerTemplate": template("vllm", "Always")}}),
}  # fmt: skip


def manifest(kind: str, name: str = "") -> dict:
    api_version, spec = MANIFESTS[kind]
    name = name or kind.lower()
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name},
            "spec": copy.deepcopy(spec)}  # fmt: skip


def every_manifest(prefix: str = "") -> list[dict]:
    """A manifest of every kind GPUPool creates but Pod and Job (the RBAC test submits each:
    tests/clusters/test_kubernetes_rbac.py)."""
    found = [manifest(kind, f"{prefix}{kind.lower()}") for kind in MANIFESTS]
    for kind, field in TRAINING_KINDS.items():
        if kind != "PyTorchJob":
            meta = {"name": f"{prefix}{kind.lower()}"}
            spec = {field: {"Worker": {"replicas": 1, "template": template("w")}}}
            found.append({"apiVersion": KUBEFLOW, "kind": kind, "metadata": meta, "spec": spec})
    ray = manifest("RayJob")["spec"]["rayClusterSpec"]
    found.append({"apiVersion": RAY, "kind": "RayCluster",
                  "metadata": {"name": f"{prefix}raycluster"}, "spec": ray})  # fmt: skip
    return found


def test_every_kind_but_pod_and_job_has_a_manifest_for_the_rbac_test():
    kinds = {(body["apiVersion"], body["kind"]) for body in every_manifest()}
    assert kinds | {("v1", "Pod"), ("batch/v1", "Job")} == set(KINDS)


def submit(org, body: dict, project=None):
    project = project or org.project_a
    return manifest_submit(actor=org.researcher, project=project, text=yaml.safe_dump(body))


def refusal(org, body: dict, project=None) -> str:
    with pytest.raises(ValidationFailed) as caught:
        submit(org, body, project)
    assert list(caught.value.errors) == ["manifest"]
    (message,) = caught.value.errors["manifest"]
    return message


def stored(fake, body: dict) -> dict:
    group_version, plural = body["apiVersion"], body["kind"].lower() + "s"
    return fake.objects[f"{group_version}/{plural}"][(NS, body["metadata"]["name"])]


def objects(kube) -> k8s.CustomObjectsApi:  # noqa: F811
    return k8s.CustomObjectsApi(core(kube).api_client)


def make(kube, api_version: str, plural: str, body: dict) -> dict:  # noqa: F811
    group, _, version = api_version.rpartition("/")
    kind = {"apiVersion": api_version}
    return objects(kube).create_namespaced_custom_object(group, version, NS, plural, kind | body)


def pods_of(kube, owner: dict, pod_template: dict, names: list[str], **meta) -> None:  # noqa: F811
    """The pods a controller makes from `pod_template`, owned by `owner`."""
    labels = {**(pod_template.get("metadata") or {}).get("labels", {}), **meta.pop("labels", {})}
    for name in names:
        body = {"metadata": {"name": name, "labels": labels,
                             "ownerReferences": [controlled_by(owner)], **meta},
                "spec": copy.deepcopy(pod_template["spec"])}  # fmt: skip
        core(kube).create_namespaced_pod(NS, body)


def owned(name: str, owner: dict) -> dict:
    return {"name": name, "ownerReferences": [controlled_by(owner)]}


# What each kind's controller makes from the stored object: (owner shown, pods, workloads).
def deployment_controller(kube, fake, obj):  # noqa: F811
    body = {"kind": "ReplicaSet", "metadata": owned("deployment-1", obj), "spec": obj["spec"]}
    replica_set = make(kube, "apps/v1", "replicasets", body)
    pods_of(kube, replica_set, obj["spec"]["template"], ["deployment-1-a", "deployment-1-b"])
    return 2, 2


def stateful_set_controller(kube, fake, obj):  # noqa: F811
    pods_of(kube, obj, obj["spec"]["template"], ["statefulset-0"])
    return 1, 1


def cron_job_controller(kube, fake, obj):  # noqa: F811
    spec = copy.deepcopy(obj["spec"]["jobTemplate"]["spec"])
    job = {"kind": "Job", "metadata": {"name": "cronjob-29012",
           "ownerReferences": [controlled_by(obj)]}, "spec": spec}  # fmt: skip
    make(kube, "batch/v1", "jobs", job)
    fake.run_controllers()  # the Job controller makes its pod
    return 1, 1


def job_set_controller(kube, fake, obj):  # noqa: F811
    replicated = obj["spec"]["replicatedJobs"][0]
    for index in range(replicated["replicas"]):
        job = {"kind": "Job", "metadata": {"name": f"jobset-main-{index}",
               "ownerReferences": [controlled_by(obj)]},
               "spec": copy.deepcopy(replicated["template"]["spec"])}  # fmt: skip
        make(kube, "batch/v1", "jobs", job)
    fake.run_controllers()
    return 2, 1


def pytorch_job_controller(kube, fake, obj):  # noqa: F811
    specs = obj["spec"]["pytorchReplicaSpecs"]
    pods_of(kube, obj, specs["Master"]["template"], ["pytorchjob-master-0"])
    pods_of(kube, obj, specs["Worker"]["template"], ["pytorchjob-worker-0", "pytorchjob-worker-1"])
    return 3, 1


def ray_job_controller(kube, fake, obj):  # noqa: F811
    spec = obj["spec"]["rayClusterSpec"]
    body = {"kind": "RayCluster", "metadata": owned("rayjob-raycluster", obj), "spec": spec}
    ray_cluster = make(kube, RAY, "rayclusters", body)
    pods_of(kube, ray_cluster, spec["headGroupSpec"]["template"], ["rayjob-head"])
    pods_of(kube, ray_cluster, spec["workerGroupSpecs"][0]["template"], ["rayjob-worker-0"])
    return 2, 1


def leader_worker_set_controller(kube, fake, obj):  # noqa: F811
    leaders = make(kube, "apps/v1", "statefulsets", {"kind": "StatefulSet", "metadata": {
        "name": "leaderworkerset", "ownerReferences": [controlled_by(obj)]},
        "spec": {**workload_spec("vllm"), "serviceName": "vllm"}})  # fmt: skip
    lws = "leaderworkerset.sigs.k8s.io"
    labels = {f"{lws}/name": "leaderworkerset", f"{lws}/group-index": "0",
              f"{lws}/group-key": "3e2387793"}  # fmt: skip
    worker = obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    pods_of(kube, leaders, worker, ["leaderworkerset-0", "leaderworkerset-0-1"],
            labels=labels, annotations={f"{lws}/size": "2"})  # fmt: skip
    return 2, 1


CONTROLLERS = {
    "Deployment": deployment_controller,
    "StatefulSet": stateful_set_controller,
    "CronJob": cron_job_controller,
    "JobSet": job_set_controller,
    "PyTorchJob": pytorch_job_controller,
    "RayJob": ray_job_controller,
    "LeaderWorkerSet": leader_worker_set_controller,
}


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_each_kind_is_created_naming_gpupool_then_its_pods_are_queued_bound_and_shown_with_it(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
    kind,
):
    fake = every_kind
    made = submit(org, manifest(kind))
    assert (made.kind, made.namespace, made.name) == (kind, NS, kind.lower())
    obj = stored(fake, manifest(kind))
    assert made.uid == obj["metadata"]["uid"]
    templates = pod_templates(obj)
    assert templates and all(t["spec"]["schedulerName"] == "gpupool" for _, t in templates)
    pods, workloads = CONTROLLERS[kind](kube, fake, obj)
    step(cluster)
    found = native_workloads()
    assert len(found) == workloads
    assert {(w.project, w.spec["native"]["owner"]["kind"]) for w in found} == {
        (org.project_a, kind)
    }
    assert {w.spec["native"]["owner"]["name"] for w in found} == {kind.lower()}
    ours = [p for p in fake.pods() if p["metadata"]["namespace"] == NS]
    assert len(ours) == pods and all(p["spec"].get("nodeName") for p in ours)
    assert {w.state for w in native_workloads()} <= {S.ADMITTED, S.RUNNING}


KUBERAY_SUBMITTER = {  # ray-operator's GetDefaultSubmitterTemplate, as GPUPool writes it out
    "name": "ray-job-submitter",
    "image": "pytorch/pytorch:2.3",  # the head's
    "resources": {
        "limits": {"cpu": "1", "memory": "1Gi"},
        "requests": {"cpu": "500m", "memory": "200Mi"},
    },
}


def ray_job_submitter(kube, fake, obj: dict) -> None:  # noqa: F811
    """KubeRay (K8sJobMode), once the RayCluster is ready: the submitter Job, owned by the
    RayJob, from its submitterPodTemplate; the Job controller makes its pod."""
    job = {"kind": "Job", "metadata": owned("rayjob-submitter", obj),
           "spec": {"backoffLimit": 2,
                    "template": copy.deepcopy(obj["spec"]["submitterPodTemplate"])}}  # fmt: skip
    make(kube, "batch/v1", "jobs", job)
    fake.run_controllers()


def test_a_rayjobs_submitter_names_gpupool_and_is_a_workload_of_its_own_under_the_rayjob(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
):
    """The default submitter (none given, K8sJobMode) is KubeRay's, written out naming
    GPUPool; its pod, made after the cluster is ready, is not one of the gang's (which
    neither waits for it nor takes it in) but a workload of its own, shown under the RayJob."""
    fake = every_kind
    submit(org, manifest("RayJob"))
    obj = stored(fake, manifest("RayJob"))
    submitter = obj["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["schedulerName"] == "gpupool" and submitter["restartPolicy"] == "Never"
    assert submitter["containers"] == [KUBERAY_SUBMITTER]
    ray_job_controller(kube, fake, obj)
    step(cluster)
    (gang,) = native_workloads()
    assert gang.state in (S.ADMITTED, S.RUNNING)
    ray_job_submitter(kube, fake, obj)
    step(cluster)
    gang_after, alone = native_workloads()
    slots = gang_after.spec["native"]["pods"]
    assert gang_after.pk == gang.pk and slots == gang.spec["native"]["pods"]
    assert [slot[0] for slot in slots] == ["rayjob-head", "rayjob-worker-0"]
    assert alone.spec["native"]["owner"]["kind"] == "RayJob"
    assert alone.spec["native"]["owner"]["name"] == "rayjob"
    assert (alone.pods, float(alone.gpus)) == (1, 0.0) and alone.state in (S.ADMITTED, S.RUNNING)
    (pod,) = [p for p in fake.pods() if p["metadata"]["name"].startswith("rayjob-submitter-")]
    assert pod["spec"]["nodeName"] and pod["spec"]["schedulerName"] == "gpupool"


@pytest.mark.parametrize("mode", ["HTTPMode", "InteractiveMode", "SidecarMode"])
def test_a_rayjob_whose_mode_makes_no_submitter_pod_gets_no_submitter_template(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
    mode,
):
    body = manifest("RayJob")
    body["spec"]["submissionMode"] = mode
    submit(org, body)
    assert "submitterPodTemplate" not in stored(every_kind, body)["spec"]


def test_a_rayjobs_own_submitter_template_is_kept_and_checked_as_its_other_templates(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
):
    body = manifest("RayJob")
    body["spec"]["submitterPodTemplate"] = template("submit")
    submit(org, body)
    kept = stored(every_kind, body)["spec"]["submitterPodTemplate"]
    assert kept["metadata"] == {"labels": {"app": "submit"}}
    assert kept["spec"]["schedulerName"] == "gpupool"
    body = manifest("RayJob", "other")
    body["spec"]["submitterPodTemplate"] = template("submit")
    body["spec"]["submitterPodTemplate"]["spec"]["schedulerName"] = "volcano"
    assert refusal(org, body).startswith(
        "spec.submitterPodTemplate.spec.schedulerName: pods submitted here are scheduled by "
        "gpupool (not 'volcano')"
    )


def test_a_kind_whose_crd_is_not_installed_is_refused_and_nothing_is_written(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
):
    fake = kube.require_fake()
    Project.objects.filter(pk=org.project_a.pk).update(manifest_kinds=NAMES)
    org.project_a.refresh_from_db()
    message = refusal(org, manifest("PyTorchJob"))
    assert message.startswith(
        "The cluster refused it: apiVersion/kind: the cluster does not serve pytorchjobs of "
        "kubeflow.org/v1 (is the PyTorchJob CRD installed?)"
    )
    assert fake.pods() == [] and not fake.objects.get("kubeflow.org/v1/pytorchjobs")
    assert not AuditLog.objects.filter(action="manifest.submit").exists()


def test_a_kind_the_project_does_not_allow_is_refused_naming_it_until_an_admin_allows_it(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
):
    fake = kube.require_fake()
    fake.install_crds()
    message = refusal(org, manifest("PyTorchJob"))
    assert message.startswith(
        "kind: kubeflow.org/v1 PyTorchJob may not be submitted to project ml-vision; "
        "allowed there: v1 Pod, batch/v1 Job"
    )
    url = f"/api/v1/projects/{org.project_a.pk}/"
    kinds = ["v1 Pod", "kubeflow.org/v1 PyTorchJob"]
    answer = api_as(org.dept_admin).patch(url, {"manifest_kinds": kinds}, format="json")
    assert answer.status_code == 200 and answer.json()["manifest_kinds"] == kinds
    org.project_a.refresh_from_db()
    assert submit(org, manifest("PyTorchJob")).kind == "PyTorchJob"
    assert "batch/v1 Job may not be submitted" in refusal(org, manifest_job())


def manifest_job() -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": template("j")}}  # fmt: skip


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_only_the_departments_admins_set_the_kinds_and_only_among_the_platforms(org, settings):
    url = f"/api/v1/projects/{org.project_a.pk}/"
    wanted = {"manifest_kinds": ["apps/v1 Deployment"]}
    assert api_as(org.researcher).patch(url, wanted, format="json").status_code == 403
    assert api_as(org.outsider).patch(url, wanted, format="json").status_code == 404
    settings.GPUPOOL_MANIFEST_KINDS = ["v1 Pod", "batch/v1 Job", "apps/v1 Deploymnt"]
    for kinds in (["apps/v1 Deployment"], ["apps/v1 Deploymnt"]):  # a typo is never offered
        answer = api_as(org.dept_admin).patch(url, {"manifest_kinds": kinds}, format="json")
        assert answer.status_code == 400
        assert answer.json()["manifest_kinds"] == [
            f"{kinds[0]}: not a kind the platform allows; choose among v1 Pod, batch/v1 Job."
        ]
    too_many = {"manifest_kinds": ["v1 Pod"] * 33}
    assert "manifest_kinds" in api_as(org.dept_admin).patch(url, too_many, format="json").json()
    org.project_a.refresh_from_db()
    assert org.project_a.manifest_kinds == ["v1 Pod", "batch/v1 Job"]  # unchanged


def test_the_project_form_offers_the_platforms_kinds_and_new_projects_allow_pod_and_job(
    org, client_as
):
    page = client_as(org.dept_admin).get(f"/projects/{org.project_a.pk}/edit/")
    assert page.status_code == 200
    assert b'value="kubeflow.org/v1 PyTorchJob"' in page.content
    data = {"name": "ml-vision", "namespace": NS, "description": "",
            "manifest_kinds": ["v1 Pod", "ray.io/v1 RayJob"]}  # fmt: skip
    answer = client_as(org.dept_admin).post(f"/projects/{org.project_a.pk}/edit/", data)
    assert answer.status_code == 302
    org.project_a.refresh_from_db()
    assert org.project_a.manifest_kinds == ["v1 Pod", "ray.io/v1 RayJob"]
    shown = client_as(org.researcher).get(f"/projects/{org.project_a.pk}/")
    assert b"v1 Pod, ray.io/v1 RayJob" in shown.content
    audit = AuditLog.objects.filter(action="project.update").latest("pk")
    assert audit.after["manifest_kinds"] == ["v1 Pod", "ray.io/v1 RayJob"]
    new = client_as(org.dept_admin).post(
        "/projects/new/", {"department": org.dept_a.pk, "name": "fresh", "manifest_kinds": []}
    )
    assert new.status_code == 302  # it may allow none
    assert Project.objects.get(name="fresh").manifest_kinds == []
    created = api_as(org.dept_admin).post(
        "/api/v1/projects/", {"department": org.dept_a.pk, "name": "fresher"}, format="json"
    )
    assert created.json()["manifest_kinds"] == ["v1 Pod", "batch/v1 Job"]


@pytest.mark.parametrize(
    ("kind", "change", "says"),
    [
        ("RayJob", lambda spec: spec.pop("rayClusterSpec"),
         "spec.rayClusterSpec: required (it holds a pod template)."),
        ("JobSet", lambda spec: spec.update(replicatedJobs=[]),
         "spec.replicatedJobs: JobSet has no pod template."),
        ("PyTorchJob", lambda spec: spec["pytorchReplicaSpecs"]["Worker"].pop("template"),
         "spec.pytorchReplicaSpecs.Worker.template: required (it holds a pod template)."),
        ("Deployment", lambda spec: spec["template"].pop("spec"),
         "spec.template.spec: a pod template needs a spec (a mapping)."),
        ("PyTorchJob", lambda spec: spec["pytorchReplicaSpecs"].update(Worker=[1]),
         "spec.pytorchReplicaSpecs.Worker: a mapping."),
        ("RayJob", lambda spec: spec["rayClusterSpec"].update(
            workerGroupSpecs=[copy.deepcopy(spec["rayClusterSpec"]["workerGroupSpecs"][0])
                              for _ in range(16)]),  # and the head, the submitter: 18
         "spec: at most 16 pod templates in one object."),
    ],
    ids=["rayjob-without-cluster", "jobset-without-jobs", "replica-without-template",
         "template-without-spec", "replica-not-a-mapping", "too-many-templates"],
)  # fmt: skip
def test_a_kind_without_its_pod_templates_is_refused_naming_the_path_before_the_cluster(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
    kind,
    change,
    says,
):
    body = manifest(kind)
    change(body["spec"])
    before = len(every_kind.requests)
    assert refusal(org, body) == says
    assert every_kind.requests[before:] == []  # the cluster was not asked


def test_pods_of_every_template_are_checked_for_the_namespaces_pod_security(
    kube,  # noqa: F811
    org,
    restricted,  # noqa: F811
    every_kind,
):
    """The baseline checks before the cluster; the rest by a dry-run pod of each template."""
    body = manifest("PyTorchJob")
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["hostIPC"] = True
    assert refusal(org, body) == (
        "spec.pytorchReplicaSpecs.Worker.template.spec: namespace gp-ml-vision enforces the "
        "restricted Pod Security level, which forbids hostIPC: true."
    )
    message = refusal(org, manifest("Deployment"))
    assert message.startswith("The cluster refused it: spec.template: its pods would be refused")
    assert 'violates PodSecurity "restricted:latest"' in message
    assert not every_kind.objects.get("apps/v1/deployments") and every_kind.pods() == []


def test_a_template_asking_a_gpu_share_needs_a_project_that_enforces_the_scheduler(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
):
    body = manifest("LeaderWorkerSet")
    worker = body["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    worker["metadata"]["annotations"] = {"gpupool.io/gpu-fraction": "0.5"}
    message = refusal(org, body)
    assert message.startswith(
        "spec.leaderWorkerTemplate.workerTemplate.metadata.annotations: the pods of a "
        "LeaderWorkerSet share GPUs"
    )
    Project.objects.filter(pk=org.project_a.pk).update(enforce_scheduler=True)
    org.project_a.refresh_from_db()
    made = submit(org, body)
    assert made.kind == "LeaderWorkerSet"


def test_gpupools_own_keys_and_another_scheduler_are_refused_in_every_template(
    kube,  # noqa: F811
    org,
    cluster,  # noqa: F811
    every_kind,
):
    body = manifest("RayJob")
    worker = body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    worker["spec"]["schedulerName"] = "volcano"
    assert refusal(org, body).startswith(
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.schedulerName: pods submitted "
        "here are scheduled by gpupool (not 'volcano')"
    )
    body = manifest("JobSet")
    job = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    job["metadata"]["labels"]["gpupool.io/workload"] = "7"
    assert refusal(org, body).startswith(
        "spec.replicatedJobs[0].template.spec.template.metadata.labels[gpupool.io/workload]: "
        "GPUPool's own"
    )


def test_the_platforms_default_kinds_are_every_kind_gpupool_can_create():
    assert settings.GPUPOOL_MANIFEST_KINDS == NAMES
