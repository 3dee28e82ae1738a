"""A manifest submitted as YAML (`gpupool submit -f`, the form, the API) is created in the
project's namespace with GPUPool's scheduler named, then queued and bound by the intake like
an object made with kubectl; every refusal names its field (issue 26)."""

from __future__ import annotations

import copy

import pytest
import yaml
from django.core.exceptions import PermissionDenied
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from rest_framework.test import APIClient

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.native import SUBMISSION, ManifestRefused
from clusters.manifest_kinds import pod_templates
from clusters.manifest_submit import manifest_submit
from clusters.models import Cluster, NodePool
from clusters.sharing import POD_PIPE_DIRECTORY
from portal.errors import ValidationFailed
from portal.models import AuditLog
from scheduling.bounds import MANIFEST_MAX_BYTES
from scheduling.models import Workload, WorkloadState
from tests import factories as f
from tests.clusters.conftest import agents_report
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import job_body, pod_body, step
from tests.scheduling.test_cli import gp, logged_in  # noqa: F401 - the fixtures

S = WorkloadState
ENFORCE = "pod-security.kubernetes.io/enforce"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster(kube, org):  # noqa: F811
    cluster = kube.cluster()
    kube.nodes(cluster)  # the org's pool a100 is adopted: the project has quota on it
    if kube.fake is not None:
        kube.fake.job_controller = True
    return cluster


def core(kube) -> k8s.CoreV1Api:  # noqa: F811
    return k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))


@pytest.fixture
def restricted(kube, org, cluster):  # noqa: F811
    """The project's namespace, made by its team's admin to enforce `restricted`."""
    ns = org.project_a.namespace
    core(kube).create_namespace({"metadata": {"name": ns, "labels": {ENFORCE: "restricted"}}})
    return ns


def job_yaml(name: str = "sweep", parallelism: int = 2, **meta) -> str:
    body = job_body(name, parallelism, **meta)
    del body["spec"]["template"]["spec"]["schedulerName"]  # GPUPool sets it
    return yaml.safe_dump(body)


def pod_yaml(name: str = "lone", **spec) -> str:
    body = {"apiVersion": "v1", "kind": "Pod", **pod_body(name)}
    body["spec"].update(spec)
    return yaml.safe_dump(body)


def refusal(org, text: str, **kwargs) -> dict:
    with pytest.raises(ValidationFailed) as caught:
        manifest_submit(actor=org.researcher, project=org.project_a, text=text, **kwargs)
    return caught.value.errors


def test_a_job_submitted_as_yaml_is_created_in_the_project_namespace_then_queued_and_bound(
    kube,  # noqa: F811
    org,
    cluster,
):
    fake = kube.require_fake()
    ns = org.project_a.namespace
    made = manifest_submit(actor=org.researcher, project=org.project_a, text=job_yaml())
    assert (made.kind, made.name, made.namespace, made.cluster) == ("Job", "sweep", ns, "kube")
    job = fake.objects["batch/v1/jobs"][(ns, "sweep")]
    assert job["spec"]["template"]["spec"]["schedulerName"] == "gpupool"
    assert job["metadata"]["annotations"]["gpupool.io/submitted-by"] == "rita"
    assert made.uid == job["metadata"]["uid"]
    step(cluster)
    (workload,) = Workload.objects.filter(spec__native__owner__name="sweep")
    assert (workload.project, workload.kind, workload.pods) == (org.project_a, "distributed", 2)
    cluster_pods = [p for p in fake.pods() if p["metadata"]["namespace"] == ns]
    assert len(cluster_pods) == 2
    assert all(p["spec"].get("nodeName") for p in cluster_pods)
    workload.refresh_from_db()
    assert workload.state in (S.ADMITTED, S.RUNNING)
    audit = AuditLog.objects.get(action="manifest.submit")
    assert (audit.actor, audit.after["name"], audit.after["namespace"]) == (
        org.researcher,
        "sweep",
        ns,
    )


def test_a_pod_given_the_project_namespace_is_created_and_one_naming_another_is_refused(
    kube,  # noqa: F811
    org,
    cluster,
):
    ns = org.project_a.namespace
    made = manifest_submit(
        actor=org.researcher, project=org.project_a, text=pod_yaml(), cluster=cluster
    )
    pod = core(kube).read_namespaced_pod("lone", ns)
    assert (made.kind, pod.spec.scheduler_name) == ("Pod", "gpupool")
    elsewhere = yaml.safe_load(pod_yaml("away"))
    elsewhere["metadata"]["namespace"] = "kube-system"
    errors = refusal(org, yaml.safe_dump(elsewhere))
    assert "metadata.namespace: this project's namespace is " + ns in errors["manifest"][0]
    assert "kube-system" in errors["manifest"][0]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: [unclosed", "Not valid YAML"),
        ("apiVersion: v1\nkind: Pod\n---\napiVersion: v1\nkind: Pod\n",
         "One object per submission: this text has more than one YAML document"),
        ("- a list", "Give one Kubernetes object"),
        ("a: &x [1]\nb: *x\n", "anchors and aliases"),
        ("[" * 20_000 + "]" * 20_000, "Nested more than 32 levels deep"),
        (yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}),
         "kind: apps/v1 Deployment may not be submitted to project ml-vision; allowed there: "
         "v1 Pod, batch/v1 Job"),
        (yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "spec": {}}),
         "apiVersion/kind: GPUPool cannot create v1 Service; it creates v1 Pod, batch/v1 Job"),
        ("x: " + "y" * MANIFEST_MAX_BYTES, "At most 128 KiB"),
    ],
    ids=[
        "malformed", "two-documents", "a-list", "aliases", "too-deep", "deployment", "service",
        "too-large",
    ],
)  # fmt: skip
def test_bad_text_is_refused_on_the_manifest_field_before_the_cluster_is_asked(
    kube,  # noqa: F811
    org,
    cluster,
    text,
    says,
):
    errors = refusal(org, text)
    assert says in errors["manifest"][0]
    assert list(errors) == ["manifest"]


def test_a_kind_the_admin_does_not_allow_is_refused(kube, org, cluster, settings):  # noqa: F811
    settings.GPUPOOL_MANIFEST_KINDS = ["v1 Pod"]  # the project allows Jobs; the platform not
    errors = refusal(org, job_yaml())
    (message,) = errors["manifest"]
    assert (
        "batch/v1 Job may not be submitted to project ml-vision; allowed there: v1 Pod " in message
    )


def test_a_privileged_pod_in_a_restricted_project_is_refused_before_the_server(
    kube,  # noqa: F811
    org,
    restricted,
):
    ns = restricted
    body = yaml.safe_load(job_yaml("priv", 1))
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"] = {"privileged": True}
    body["spec"]["template"]["spec"]["hostNetwork"] = True
    errors = refusal(org, yaml.safe_dump(body))
    assert errors["manifest"] == [
        f"spec.template.spec: namespace {ns} enforces the restricted Pod Security level, which "
        "forbids hostNetwork: true; privileged container 'main'."
    ]
    assert k8s.BatchV1Api(core(kube).api_client).list_namespaced_job(ns).items == []


def test_a_pod_security_refusal_of_the_api_server_is_the_manifest_field_error(org, restricted):
    errors = refusal(org, pod_yaml())  # runs as root, may escalate: restricted says no
    (message,) = errors["manifest"]
    assert message.startswith("The cluster refused it: 403 Forbidden")
    assert 'violates PodSecurity "restricted:latest"' in message


def test_a_create_whose_answer_was_lost_finds_its_own_object_and_a_name_taken_is_refused(
    kube,  # noqa: F811
    org,
    cluster,
):
    """A retried create (its first answer lost to a timeout, the object made) meets its
    own object: 409, read back, taken as made when it carries this submission's id."""
    ns = org.project_a.namespace
    backend = KubernetesBackend(cluster)
    backend.ensure_namespace(ns)
    body = yaml.safe_load(job_yaml("slow", 1))
    body["metadata"].update(namespace=ns, annotations={SUBMISSION: "first-try"})

    def create(body: dict) -> dict:
        return backend.create_manifest(body, "jobs", pod_templates(body))

    made = create(copy.deepcopy(body))  # the try whose answer was lost
    assert create(copy.deepcopy(body))["metadata"]["uid"] == made["metadata"]["uid"]
    body["metadata"]["annotations"][SUBMISSION] = "another-submission"
    with pytest.raises(ManifestRefused, match='409 Conflict: .*"slow" already exists'):
        create(body)


def test_a_job_whose_pods_the_namespace_would_refuse_is_refused_before_it_is_made(
    kube,  # noqa: F811
    org,
    restricted,
):
    """The API server admits any Job; its pods are refused later. A dry run of one asks now."""
    (message,) = refusal(org, job_yaml("rooted", 1))["manifest"]
    assert message.startswith(
        "The cluster refused it: spec.template: its pods would be refused: 403 Forbidden: "
    )
    assert 'violates PodSecurity "restricted:latest"' in message
    batch = k8s.BatchV1Api(core(kube).api_client)
    assert batch.list_namespaced_job(restricted).items == []
    assert core(kube).list_namespaced_pod(restricted).items == []


def half(body: dict) -> dict:
    """The pod (or a Job's template) asks for half a GPU instead of a whole one."""
    pod = body["spec"]["template"] if body["kind"] == "Job" else body
    pod.setdefault("metadata", {})["annotations"] = {"gpupool.io/gpu-fraction": "0.5"}
    del pod["spec"]["containers"][0]["resources"]["limits"]
    return body


def test_a_pod_asking_half_a_gpu_is_given_what_sharing_needs_queued_and_runs(
    kube,  # noqa: F811
    org,
    cluster,
):
    made = manifest_submit(
        actor=org.researcher,
        project=org.project_a,
        text=yaml.safe_dump(half(yaml.safe_load(pod_yaml()))),
    )
    pod = core(kube).read_namespaced_pod(made.name, made.namespace)
    assert pod.spec.host_ipc is True
    assert pod.spec.containers[0].env_from[-1].config_map_ref.name == "lone-gpupool-gpu"
    # Its GPU's pipe folder alone, from the MPS root (clusters/native_sharing.py).
    [mount] = pod.spec.containers[0].volume_mounts
    assert (mount.mount_path, mount.sub_path_expr) == (POD_PIPE_DIRECTORY, "$(GPUPOOL_MPS_PIPE)")
    for _ in range(3):  # the reservation pod's device, its MPS daemon, then the binding
        step(cluster)
        agents_report(cluster)
    workload = Workload.objects.get(spec__native__namespace=made.namespace)
    assert (workload.gpu_request, float(workload.gpus)) == ("fraction", 0.5)
    assert core(kube).read_namespaced_pod(made.name, made.namespace).status.phase == "Running"


def test_a_job_asking_a_gpu_share_needs_a_project_that_enforces_the_scheduler(
    kube,  # noqa: F811
    org,
    cluster,
):
    """Its pods are named by the Job controller: only the project's webhook can give each
    its own GPU ConfigMap."""
    text = yaml.safe_dump(half(yaml.safe_load(job_yaml())))
    assert (
        "only in a project that enforces GPUPool's scheduler" in refusal(org, text)["manifest"][0]
    )


def test_a_pod_asking_a_gpu_share_in_a_baseline_namespace_is_refused_for_host_ipc(
    kube,  # noqa: F811
    org,
    restricted,
):
    text = yaml.safe_dump(half(yaml.safe_load(pod_yaml())))
    message = refusal(org, text)["manifest"][0]
    assert "enforces the restricted Pod Security level" in message and "hostIPC" in message


def test_another_scheduler_is_refused(kube, org, cluster):  # noqa: F811
    other = pod_yaml(schedulerName="default-scheduler")
    assert (
        "spec.schedulerName: pods submitted here are scheduled by gpupool"
        in (refusal(org, other)["manifest"][0])
    )


def test_gpupools_own_labels_and_annotations_are_refused_its_user_ones_pass(
    kube,  # noqa: F811
    org,
    cluster,
):
    """Its identity or `bound-by` would make the object look like one GPUPool made or bound."""
    body = yaml.safe_load(pod_yaml())
    body["metadata"]["labels"] = {"gpupool.io/installation": "x", "gpupool.io/kind": "training"}
    assert refusal(org, yaml.safe_dump(body))["manifest"][0].startswith(
        "metadata.labels[gpupool.io/installation]: GPUPool's own; of its keys only "
    )
    body["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "gpupool"}
    assert (
        "metadata.labels[app.kubernetes.io/managed-by]"
        in refusal(org, yaml.safe_dump(body))["manifest"][0]
    )
    job = yaml.safe_load(job_yaml("bound", 1))
    job["spec"]["template"]["metadata"] = {"annotations": {"gpupool.io/bound-by": "a.b"}}
    assert refusal(org, yaml.safe_dump(job))["manifest"][0].startswith(
        "spec.template.metadata.annotations[gpupool.io/bound-by]: GPUPool's own"
    )
    job["spec"]["template"]["metadata"] = {"labels": {"gpupool.io/priority-class": "build"}}
    assert manifest_submit(actor=org.researcher, project=org.project_a, text=yaml.safe_dump(job))


def test_the_cluster_must_be_chosen_among_several_and_hold_the_project_quota(
    kube,  # noqa: F811
    org,
    cluster,
):
    second = kube.cluster("second")
    NodePool.objects.create(name="h100", cluster=second)
    assert (
        "no quota on second; one of kube" in refusal(org, pod_yaml(), cluster=second)["cluster"][0]
    )
    f.make_project_quota(org.project_a, NodePool.objects.get(name="h100"), gpus=1)
    assert refusal(org, pod_yaml())["cluster"] == ["Choose the cluster: kube, second."]
    Cluster.objects.filter(pk=second.pk).update(enabled=False)
    assert (
        manifest_submit(actor=org.researcher, project=org.project_a, text=pod_yaml()).cluster
        == "kube"
    )


def test_an_outsider_may_not_submit_to_the_project(kube, org, cluster):  # noqa: F811
    with pytest.raises(PermissionDenied):
        manifest_submit(actor=org.outsider, project=org.project_a, text=pod_yaml())
    assert not AuditLog.objects.filter(action="manifest.submit").exists()


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_api_creates_it_and_says_what_and_where(kube, org, cluster):  # noqa: F811
    answer = api_as(org.researcher).post(
        "/api/v1/manifests/",
        {"project": "ml-vision", "cluster": "kube", "manifest": job_yaml("by-api", 1)},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    ns = org.project_a.namespace
    assert {k: body[k] for k in ("api_version", "kind", "name", "namespace", "cluster")} == {
        "api_version": "batch/v1", "kind": "Job", "name": "by-api", "namespace": ns,
        "cluster": "kube",
    }  # fmt: skip
    assert "gpupool list --project ml-vision" in body["message"]


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"manifest": "kind: [x"}, "manifest", "Not valid YAML"),
        ({"cluster": "nowhere"}, "cluster", "No enabled Kubernetes cluster nowhere."),
        ({"project": "nlp"}, "project", "No project nlp that you can see."),
        ({"manifest": ""}, "manifest", "may not be blank"),
    ],
)
def test_the_api_names_the_field_of_each_refusal(kube, org, cluster, data, field, says):  # noqa: F811
    data = {"project": "ml-vision", "manifest": pod_yaml(), **data}
    answer = api_as(org.researcher).post("/api/v1/manifests/", data, format="json")
    assert answer.status_code == 400
    assert list(answer.json()) == [field]
    assert says in answer.json()[field][0]


def test_the_api_refuses_who_may_not_submit_to_the_project(kube, org, cluster):  # noqa: F811
    viewer = f.make_user("vic")
    f.make_membership(viewer, role=f.Role.VIEWER, project=org.project_a)
    data = {"project": "ml-vision", "manifest": pod_yaml()}
    assert api_as(viewer).post("/api/v1/manifests/", data, format="json").status_code == 403
    outsider = api_as(org.outsider).post("/api/v1/manifests/", data, format="json")
    assert outsider.status_code == 400  # a project one cannot see is not named to them
    assert APIClient().post("/api/v1/manifests/", data, format="json").status_code in (401, 403)
    assert core(kube).list_namespaced_pod(org.project_a.namespace).items == []


@pytest.mark.django_db(transaction=True)
def test_gpupool_submit_f_creates_it_and_prints_where_refusals_exit_non_zero(
    kube,  # noqa: F811
    org,
    cluster,
    logged_in,  # noqa: F811
    tmp_path,
):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(job_yaml("by-cli", 1))
    out = logged_in("submit", "-f", str(manifest), "--project", "ml-vision")
    ns = org.project_a.namespace
    assert f"Created Job {ns}/by-cli on cluster kube." in out
    job = k8s.BatchV1Api(core(kube).api_client).read_namespaced_job("by-cli", ns)
    assert job.spec.template.spec.scheduler_name == "gpupool"
    manifest.write_text(job_yaml("again", 1, namespace="default"))
    out = logged_in("submit", "-f", str(manifest), "--project", "ml-vision", ok=False)
    assert f"manifest: metadata.namespace: this project's namespace is {ns}" in out
    out = logged_in("submit", "-f", str(manifest), "training", "x", ok=False)
    assert "Give either -f MANIFEST or a kind to submit, not both." in out


def test_the_from_yaml_form_creates_it_and_shows_refusals_beside_the_text(
    kube,  # noqa: F811
    org,
    cluster,
    client_as,
):
    page = client_as(org.researcher)
    assert page.get("/workloads/new-yaml/").status_code == 200
    assert b'href="/workloads/new-yaml/"' in page.get("/workloads/new/training/").content
    ns = org.project_a.namespace
    form = {"project": org.project_a.pk, "cluster": "", "manifest": job_yaml("by-form", 1)}
    answer = page.post("/workloads/new-yaml/", form, follow=True)
    assert answer.redirect_chain == [("/workloads/?project=ml-vision", 302)]
    assert f"Created Job {ns}/by-form on cluster kube." in answer.content.decode()
    assert k8s.BatchV1Api(core(kube).api_client).read_namespaced_job("by-form", ns)
    form["manifest"] = job_yaml("elsewhere", 1, namespace="default")
    answer = page.post("/workloads/new-yaml/", form)
    assert answer.status_code == 200
    errors = answer.context["form"].errors
    assert list(errors) == ["manifest"]
    assert "metadata.namespace: this project&#x27;s namespace is" in _row(answer, "manifest")


def _row(answer, field: str) -> str:
    """The form row of `field`: its input, help and errors (no nested div for a textarea)."""
    html = answer.content.decode()
    start = html.index(f'id="row-{field}"')
    return html[start : html.index("</div>", start)]


def test_the_from_yaml_form_offers_only_projects_one_may_submit_to(kube, org, cluster, client_as):  # noqa: F811
    page = client_as(org.outsider)
    form = {"project": org.project_a.pk, "manifest": pod_yaml()}
    answer = page.post("/workloads/new-yaml/", form)
    assert "project" in answer.context["form"].errors
    assert core(kube).list_namespaced_pod(org.project_a.namespace).items == []
    anonymous = client_as(None).get("/workloads/new-yaml/")
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]
