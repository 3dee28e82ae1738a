"""The pod webhook (clusters/admission.py, clusters/webhook.py): every pod of a project that
enforces GPUPool's scheduler is given it (issue 26, "Enforcement, per project").

First the endpoint, called as kube-apiserver calls it; then end to end, through the fake API
server calling the webhook of its MutatingWebhookConfiguration."""

from __future__ import annotations

import base64
import copy
import json
import uuid

import pytest
from django.urls import reverse

from clusters import admission
from clusters.models import Backend, Cluster

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
    ids=["ours", "another-scheduler", "bound", "mirror", "daemonset"],
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
    context = admission.Context("ns", "gpupool", "p")
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
