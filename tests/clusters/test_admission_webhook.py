"""The pod webhook (clusters/admission.py, clusters/webhook.py): every pod of a project that
enforces GPUPool's scheduler is given it (issue 26, "Enforcement, per project").

First the endpoint, called as kube-apiserver calls it; then end to end, through the fake API
server calling the webhook of its MutatingWebhookConfiguration."""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import io
import json
import socket
import ssl
import threading
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import create_from_dict

from clusters import admission
from clusters.backends.kubernetes.manifests import MPS_ROOT
from clusters.enforcement import enforcement_sync
from clusters.models import Backend, Cluster
from clusters.native_sharing import gpu_config_of, missing_parts
from clusters.sharing import POD_PIPE_DIRECTORY
from clusters.tasks import sync_inventory
from clusters.webhook_cert import Target, webhook_cert_ensure
from portal.models import Project
from portal.services import organisation as org_services
from scheduling.models import Workload, WorkloadState
from tests.clusters.conftest import agents_report
from tests.clusters.fake_apiserver import json_patch
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_deploy_manifests import SCHEMA_VERSIONS, render
from tests.clusters.test_kubernetes_native import pod_body, step

pytestmark = pytest.mark.timeout(60)


def pod(name: str = "trainer", **spec) -> dict:
    """A pod as the webhook sees it: the API server's defaults applied."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "pytorch/pytorch:2.3"}],
            **spec,
        },
    }


def review(obj: dict, namespace: str, *, operation: str = "CREATE", uid: str = "") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "object": obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


@pytest.fixture
def hook(db, org):
    """The URL kube-apiserver calls for a cluster, and the enforcing project's namespace."""
    cluster = Cluster.objects.create(
        name="kube", backend=Backend.KUBERNETES, config={"scheduler_name": "gpupool-a"}
    )
    org.project_a.enforce_scheduler = True
    org.project_a.save(update_fields=["enforce_scheduler"])
    return reverse("pods_admission", args=[cluster.uid]), org.project_a.namespace


def post(client, url: str, body: dict | bytes):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(url, data, content_type="application/json")


def patch_of(answer: dict) -> list[dict]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


SET = [{"op": "add", "path": "/spec/schedulerName", "value": "gpupool-a"}]


def test_a_pod_of_an_enforcing_project_gets_the_clusters_scheduler(client, hook):
    url, ns = hook
    sent = review(pod(), ns, uid="7f1c-uid")
    answer = post(client, url, sent)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert body["response"]["uid"] == "7f1c-uid"
    assert body["response"]["allowed"] is True
    assert patch_of(body) == SET
    assert "spec.schedulerName set to gpupool-a" in body["response"]["warnings"][0]


def test_a_pod_without_a_scheduler_name_gets_one_too(client, hook):
    url, ns = hook
    bare = pod()
    del bare["spec"]["schedulerName"]
    assert patch_of(post(client, url, review(bare, ns)).json()) == SET


def test_a_namespace_whose_project_does_not_enforce_is_answered_unchanged(client, hook, org):
    url, _ = hook
    for ns in (org.project_b.namespace, "kube-system", "nobodys"):
        body = post(client, url, review(pod(), ns)).json()
        assert body["response"] == {"uid": body["response"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    "changed",
    [
        {"spec": {"schedulerName": "gpupool-a"}},  # ours already
        {"spec": {"schedulerName": "volcano"}},  # a user's explicit choice
        {"spec": {"nodeName": "gpu-a"}},  # bound already
        {"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}},  # static pod
        {"metadata": {"labels": {"gpupool.io/enforce-scheduler": "false"}}},
        {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": "dcgm",
                        "uid": "u1",
                        "controller": True,
                    }
                ]
            }
        },
    ],
    ids=["ours", "another-scheduler", "bound", "mirror", "opted-out", "daemonset"],
)
def test_pods_the_rule_leaves_alone_are_answered_unchanged(client, hook, changed):
    url, ns = hook
    obj = pod()
    for part, fields in changed.items():
        obj[part].update(fields)
    assert patch_of(post(client, url, review(obj, ns)).json()) == []


def test_a_replicaset_pod_is_changed_like_a_bare_one(client, hook):
    url, ns = hook
    obj = pod()
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d", "uid": "u2",
         "controller": True}
    ]  # fmt: skip
    assert patch_of(post(client, url, review(obj, ns)).json()) == SET


def test_only_a_pod_create_is_changed(client, hook):
    url, ns = hook
    assert patch_of(post(client, url, review(pod(), ns, operation="UPDATE")).json()) == []
    binding = review(pod(), ns)
    binding["request"]["subResource"] = "binding"
    assert patch_of(post(client, url, binding).json()) == []


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}}',
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}',
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 7}}',
        b"\xff\xfe",
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["json", "list", "v1beta1", "no-request", "uid", "utf8", "deep"],
)
def test_a_malformed_review_is_400_with_a_reason_never_500(client, hook, body):
    url, _ = hook
    answer = post(client, url, body)
    assert answer.status_code == 400
    assert answer.json()["detail"]


# Over the webhook's own bound (2 MiB) but under Django's (2.5 MiB); over both.
@pytest.mark.parametrize("size", [2 * 1024 * 1024 + 1024, 3 * 1024 * 1024])
def test_a_review_larger_than_etcd_could_store_is_400_in_json(client, hook, size):
    url, ns = hook
    big = pod()
    big["metadata"]["annotations"] = {"a": "x" * size}
    answer = post(client, url, review(big, ns))
    assert answer.status_code == 400
    assert answer.json()["detail"]


def test_an_unknown_cluster_is_404_and_get_is_405(client, hook):
    url, ns = hook
    unknown = reverse("pods_admission", args=[uuid.uuid4()])
    assert post(client, unknown, review(pod(), ns)).status_code == 404
    assert client.get(url).status_code == 405


def test_the_endpoint_needs_no_session_and_no_csrf_token(hook):
    from django.test import Client

    url, ns = hook
    strict = Client(enforce_csrf_checks=True)
    assert patch_of(post(strict, url, review(pod(), ns)).json()) == SET


def test_mutations_are_a_list_of_small_functions_each_adding_its_operations():
    context = admission.Context("ns", "gpupool", "p", enforce_scheduler=True)
    extra = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    ops = admission.mutations_for(pod(), context, [admission.set_scheduler, lambda p, c: extra])
    assert ops == [SET[0] | {"value": "gpupool"}, *extra]
    unchanged = copy.deepcopy(pod())
    admission.mutations_for(unchanged, context)
    assert unchanged == pod()  # the pod itself is never changed: the patch says it


def test_an_admin_opts_a_project_in_through_the_api_and_the_page_says_so(client_as, org):
    api = client_as(org.dept_admin)
    url = f"/api/v1/projects/{org.project_a.pk}/"
    answer = api.patch(url, {"enforce_scheduler": True}, content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["enforce_scheduler"] is True
    org.project_a.refresh_from_db()
    assert org.project_a.enforce_scheduler is True
    page = api.get(reverse("project_detail", args=[org.project_a.pk])).content.decode()
    assert "GPUPool, for every pod" in page
    bad = api.patch(url, {"enforce_scheduler": "maybe"}, content_type="application/json")
    assert bad.status_code == 400


def test_a_researcher_cannot_opt_a_project_in(client_as, org):
    api = client_as(org.researcher)
    url = f"/api/v1/projects/{org.project_a.pk}/"
    answer = api.patch(url, {"enforce_scheduler": True}, content_type="application/json")
    assert answer.status_code in (403, 404)
    org.project_a.refresh_from_db()
    assert org.project_a.enforce_scheduler is False


def test_the_edit_form_saves_the_choice(client_as, org):
    page = client_as(org.dept_admin)
    url = reverse("project_edit", args=[org.project_a.pk])
    form = {"name": "ml-vision", "namespace": org.project_a.namespace, "enforce_scheduler": "on"}
    answer = page.post(url, form)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    org.project_a.refresh_from_db()
    assert org.project_a.enforce_scheduler is True


# --- end to end: the fake API server calls the webhook of deploy/webhook/ --------------------
WEBHOOK = Path(__file__).resolve().parents[2] / "deploy" / "webhook"
SERVICE = ("gpupool", "gpupool-webhook")


def install_webhook(api_client, kinds: tuple[str, ...] = ()) -> None:
    """What `kubectl apply -k deploy/webhook` makes (on top of deploy/: the namespace), but
    the CronJob, which the fake does not serve (its schema is checked below); only `kinds`
    when given."""
    core = k8s.CoreV1Api(api_client)
    if not any(n.metadata.name == "gpupool" for n in core.list_namespace().items):
        core.create_namespace({"metadata": {"name": "gpupool"}})
    for obj in render(WEBHOOK):
        if obj["kind"] != "CronJob" and obj["kind"] in (kinds or (obj["kind"],)):
            create_from_dict(api_client, copy.deepcopy(obj), namespace="gpupool")


@pytest.fixture
def webhooked(kube, org, live_server, settings):  # noqa: F811
    """A cluster with the webhook installed, its certificate made, served by the portal."""
    fake = kube.require_fake()
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "localhost"]
    cluster = kube.cluster()
    kube.nodes(cluster)  # the org's pool a100 is adopted: the projects have quota on it
    api_client = k8s_config.new_client_from_config_dict(kube.kubeconfig)
    install_webhook(api_client)
    fake.webhook_backends[SERVICE] = live_server.url
    webhook_cert_ensure(cluster, Target(), now=timezone.now())
    return cluster, k8s.CoreV1Api(api_client)


def opt_in(org, project) -> None:
    """As an admin does on the project's page: the namespace is labelled on commit."""
    org_services.project_update(
        actor=org.dept_admin, project=project, name=project.name,
        namespace=project.namespace, enforce_scheduler=True,
    )  # fmt: skip


def kubectl_pod(name: str) -> dict:
    """A pod as `kubectl run` makes it: no schedulerName."""
    body = pod_body(name, gpus=1)
    del body["spec"]["schedulerName"]
    return body


def test_an_opted_in_projects_pod_gets_gpupools_scheduler_and_is_bound(webhooked, org):
    cluster, core = webhooked
    opt_in(org, org.project_a)
    ns = org.project_a.namespace
    labels = core.read_namespace(ns).metadata.labels
    assert labels[admission.ENFORCE_LABEL] == "true"
    core.create_namespaced_pod(ns, kubectl_pod("trainer"))
    assert core.read_namespaced_pod("trainer", ns).spec.scheduler_name == "gpupool"
    step(cluster)
    workload = Workload.objects.get(spec__native__namespace=ns)
    assert (workload.project, workload.state) == (org.project_a, WorkloadState.RUNNING)
    assert core.read_namespaced_pod("trainer", ns).spec.node_name in ("gpu-a", "gpu-b")


def test_a_pod_of_a_project_that_did_not_opt_in_is_left_to_the_default_scheduler(webhooked, org):
    cluster, core = webhooked
    opt_in(org, org.project_a)
    ns = org.project_b.namespace
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_pod(ns, kubectl_pod("web"))
    assert core.read_namespaced_pod("web", ns).spec.scheduler_name == "default-scheduler"
    step(cluster)
    assert not Workload.objects.filter(spec__native__namespace=ns).exists()
    assert core.read_namespaced_pod("web", ns).spec.node_name is None


def test_opting_out_removes_the_label_so_the_api_server_stops_calling(webhooked, org, kube):  # noqa: F811
    cluster, core = webhooked
    opt_in(org, org.project_a)
    project = org.project_a
    org_services.project_update(
        actor=org.dept_admin, project=project, name=project.name,
        namespace=project.namespace, enforce_scheduler=False,
    )  # fmt: skip
    assert admission.ENFORCE_LABEL not in core.read_namespace(project.namespace).metadata.labels
    calls = len(kube.fake.requests)
    core.create_namespaced_pod(project.namespace, kubectl_pod("after"))
    pod_ = core.read_namespaced_pod("after", project.namespace)
    assert pod_.spec.scheduler_name == "default-scheduler"
    assert len(kube.fake.requests) == calls + 2  # the create and the read: no webhook failure
    assert kube.fake.webhook_failures == []


def test_with_failure_policy_fail_a_pod_is_refused_while_the_portal_is_down(
    webhooked,
    org,
    kube,  # noqa: F811
    settings,
):
    cluster, core = webhooked
    opt_in(org, org.project_a)
    settings.GPUPOOL_WEBHOOK_FAILURE_POLICY = "Fail"
    webhook_cert_ensure(cluster, Target(), now=timezone.now())
    kube.fake.webhook_backends[SERVICE] = "http://127.0.0.1:9"  # the portal is down
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(org.project_a.namespace, kubectl_pod("refused"))
    assert err.value.status == 500
    message = json.loads(err.value.body)["message"]
    assert message.startswith('Internal error occurred: failed calling webhook "pods.scheduler')


def test_with_failure_policy_ignore_a_pod_is_created_unchanged_while_the_portal_is_down(
    webhooked,
    org,
    kube,  # noqa: F811
):
    cluster, core = webhooked
    opt_in(org, org.project_a)
    kube.fake.webhook_backends[SERVICE] = "http://127.0.0.1:9"
    core.create_namespaced_pod(org.project_a.namespace, kubectl_pod("unchanged"))
    pod_ = core.read_namespaced_pod("unchanged", org.project_a.namespace)
    assert pod_.spec.scheduler_name == "default-scheduler"
    assert len(kube.fake.webhook_failures) == 1


# --- the certificate -------------------------------------------------------------------------
def stored_tls(core) -> dict[str, bytes]:
    data = core.read_namespaced_secret("gpupool-webhook-tls", "gpupool").data
    return {k: base64.b64decode(v) for k, v in data.items()}


def test_the_cert_command_makes_a_cert_for_the_service_and_sets_the_ca_bundle(kube, org):  # noqa: F811
    kube.require_fake()
    cluster = kube.cluster()
    api_client = k8s_config.new_client_from_config_dict(kube.kubeconfig)
    install_webhook(api_client)
    out = io.StringIO()
    call_command("webhook_cert", stdout=out)
    assert "a new certificate for gpupool-webhook.gpupool.svc" in out.getvalue()
    tls = stored_tls(k8s.CoreV1Api(api_client))
    cert = x509.load_pem_x509_certificate(tls["tls.crt"])
    ca = x509.load_pem_x509_certificate(tls["ca.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpupool-webhook.gpupool.svc" in names.get_values_for_type(x509.DNSName)
    key = serialization.load_pem_private_key(tls["tls.key"], None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    [hook] = (
        k8s.AdmissionregistrationV1Api(api_client)
        .read_mutating_webhook_configuration("gpupool")
        .webhooks
    )
    assert base64.b64decode(hook.client_config.ca_bundle) == tls["ca.crt"]
    assert hook.client_config.service.path == f"/k8s/admission/{cluster.uid}/pods/"
    assert hook.failure_policy == "Ignore"


def test_a_tls_client_trusting_only_the_ca_bundle_accepts_the_served_cert(kube, org, tmp_path):  # noqa: F811
    """What kube-apiserver checks: the chain to the caBundle and the Service's DNS name,
    through a real TLS handshake with the files uvicorn is given (--ssl-certfile/keyfile)."""
    kube.require_fake()
    cluster = kube.cluster()
    api_client = k8s_config.new_client_from_config_dict(kube.kubeconfig)
    install_webhook(api_client)
    webhook_cert_ensure(cluster, Target(), now=timezone.now())
    tls = stored_tls(k8s.CoreV1Api(api_client))
    (tmp_path / "tls.crt").write_bytes(tls["tls.crt"])
    (tmp_path / "tls.key").write_bytes(tls["tls.key"])
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        connection, _ = listener.accept()
        with contextlib.suppress(ssl.SSLError, OSError):
            served.wrap_socket(connection, server_side=True).close()

    def handshake(name: str) -> None:
        caller = ssl.create_default_context(cadata=tls["ca.crt"].decode())
        thread = threading.Thread(target=accept)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port)) as raw:
                caller.wrap_socket(raw, server_hostname=name).close()
        finally:
            thread.join()

    handshake("gpupool-webhook.gpupool.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake("gpupool-portal.gpupool.svc")
    listener.close()


def test_the_cert_command_keeps_a_good_cert_and_renews_one_near_its_end(kube, org):  # noqa: F811
    kube.require_fake()
    cluster = kube.cluster()
    api_client = k8s_config.new_client_from_config_dict(kube.kubeconfig)
    install_webhook(api_client)
    core = k8s.CoreV1Api(api_client)
    now = timezone.now()
    webhook_cert_ensure(cluster, Target(), now=now, days=365)
    first = stored_tls(core)
    webhook_cert_ensure(cluster, Target(), now=now + dt.timedelta(days=300))
    assert stored_tls(core) == first
    webhook_cert_ensure(cluster, Target(), now=now + dt.timedelta(days=340))
    renewed = stored_tls(core)
    assert renewed["tls.crt"] != first["tls.crt"] and renewed["ca.crt"] != first["ca.crt"]


def test_the_cert_command_needs_the_cluster_named_when_there_are_several(kube, org):  # noqa: F811
    kube.cluster("one")
    kube.cluster("two")
    with pytest.raises(CommandError, match="--cluster"):
        call_command("webhook_cert")


def test_deploy_webhook_is_valid_against_the_kubernetes_schemas():
    objects = render(WEBHOOK)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "CronJob", "Deployment", "MutatingWebhookConfiguration", "Secret", "Service"
    ]  # fmt: skip
    for obj in objects:
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    [config] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    [hook] = config["webhooks"]
    assert hook["namespaceSelector"] == {"matchLabels": {admission.ENFORCE_LABEL: "true"}}
    assert (hook["sideEffects"], hook["timeoutSeconds"]) == ("None", 5)


# --- the namespaces' labels --------------------------------------------------------------------
def test_each_inventory_sync_makes_the_labels_match_the_projects(kube, org):  # noqa: F811
    """Level-triggered: a change the on-commit sync missed is made by the next inventory
    sync; a namespace labelled by hand that is not GPUPool's is left alone."""
    cluster = kube.cluster()
    kube.nodes(cluster)
    core = k8s.CoreV1Api(k8s_config.new_client_from_config_dict(kube.kubeconfig))
    by_hand = kube.namespace("by-hand")
    core.create_namespace(
        {"metadata": {"name": by_hand, "labels": {admission.ENFORCE_LABEL: "true"}}}
    )
    Project.objects.filter(pk=org.project_a.pk).update(enforce_scheduler=True)  # no on-commit
    sync_inventory(cluster.pk)
    ns = org.project_a.namespace
    assert core.read_namespace(ns).metadata.labels[admission.ENFORCE_LABEL] == "true"
    Project.objects.filter(pk=org.project_a.pk).update(enforce_scheduler=False)
    sync_inventory(cluster.pk)
    assert admission.ENFORCE_LABEL not in core.read_namespace(ns).metadata.labels
    assert core.read_namespace(by_hand).metadata.labels[admission.ENFORCE_LABEL] == "true"


def test_a_refused_label_is_the_clusters_error_not_an_exception(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)
    Project.objects.filter(pk=org.project_a.pk).update(enforce_scheduler=True)
    fake.forbidden_namespaces.add(org.project_a.namespace)
    [error] = enforcement_sync(cluster)
    assert error.startswith(f"namespace {org.project_a.namespace}: gpupool.io/enforce-scheduler:")


FRACTION = "gpupool.io/gpu-fraction"


def share(name: str = "half", **meta) -> dict:
    """A pod asking for half a GPU by annotation, nothing else of sharing in its spec."""
    body = pod(name)
    body["metadata"] = {**body["metadata"], "annotations": {FRACTION: "0.5"}, **meta}
    return body


def test_a_pod_asking_a_gpu_share_gets_what_sharing_needs_beside_the_scheduler(client, hook):
    """The second mutation (clusters/native_sharing.py): hostIPC, the MPS root, its GPU
    environment from a ConfigMap named after the pod; the patched pod lacks nothing."""
    url, ns = hook
    ops = patch_of(post(client, url, review(share(), ns)).json())
    assert ops[0] == SET[0]
    patched = json_patch(share(), ops)
    assert patched["spec"]["hostIPC"] is True
    assert missing_parts(patched, mps_root=MPS_ROOT) == []
    assert gpu_config_of(patched) == "half-gpupool-gpu"


def test_a_job_pod_made_from_generate_name_gets_a_config_map_of_its_own(client, hook):
    """A Job's pods have no name at admission: two of one template get two ConfigMaps."""
    url, ns = hook
    names = set()
    for uid in ("0f3a9c1e-aaaa", "77b2d4e0-bbbb"):
        body = share()
        body["metadata"] = {"generateName": "train-", "annotations": {FRACTION: "0.5"}}
        ops = patch_of(post(client, url, review(body, ns, uid=uid)).json())
        names.add(gpu_config_of(json_patch(body, ops)))
    assert names == {"train-0f3a9c1e-gpupool-gpu", "train-77b2d4e0-gpupool-gpu"}


def test_a_pod_asking_no_share_or_left_to_another_scheduler_gets_no_sharing_parts(client, hook):
    url, ns = hook
    assert patch_of(post(client, url, review(pod(), ns)).json()) == SET
    volcano = share()
    volcano["spec"]["schedulerName"] = "volcano"
    assert patch_of(post(client, url, review(volcano, ns)).json()) == []


def test_an_opted_in_projects_half_gpu_pod_is_made_ready_queued_and_runs(webhooked, org):
    """End to end: `kubectl run` of a pod with only the annotation: the webhook gives it
    the scheduler and the sharing parts; GPUPool queues it as a fraction, writes its GPU
    ConfigMap, binds it, and the kubelet starts it."""
    cluster, core = webhooked
    opt_in(org, org.project_a)
    ns = org.project_a.namespace
    body = kubectl_pod("half")
    body["metadata"]["annotations"] = {FRACTION: "0.5"}
    del body["spec"]["containers"][0]["resources"]["limits"]
    core.create_namespaced_pod(ns, body)
    made = core.read_namespaced_pod("half", ns)
    assert (made.spec.scheduler_name, made.spec.host_ipc) == ("gpupool", True)
    # Its GPU's pipe folder alone, from the MPS root (clusters/native_sharing.py).
    [mount] = made.spec.containers[0].volume_mounts
    assert (mount.mount_path, mount.sub_path_expr) == (POD_PIPE_DIRECTORY, "$(GPUPOOL_MPS_PIPE)")
    for _ in range(3):  # the reservation pod's device, its MPS daemon, then the binding
        step(cluster)
        agents_report(cluster)
    workload = Workload.objects.get(spec__native__namespace=ns)
    assert (workload.gpu_request, float(workload.gpus)) == ("fraction", 0.5)
    assert core.read_namespaced_config_map("half-gpupool-gpu", ns).data["NVIDIA_VISIBLE_DEVICES"]
    assert core.read_namespaced_pod("half", ns).status.phase == "Running"
