"""The fake API server calls mutating admission webhooks on pod creates as a real one
(Kubernetes 1.30+) does: k8s.io/apiserver/pkg/admission/plugin/webhook (mutating/
dispatcher.go, generic/webhook.go for the matching, request/admissionreview.go for the
answer's checks) and admissionregistration/validation for the configuration. Each test
talks to it over HTTP with the official client; a small webhook in the test answers."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tests.clusters.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(30)
NS = "team-a"
Answer = Callable[[dict], tuple[int, dict]]


def patch_scheduler(review: dict) -> tuple[int, dict]:
    operations = [{"op": "add", "path": "/spec/schedulerName", "value": "gpupool"}]
    return 200, answer(review["request"]["uid"], patch=operations)


def answer(uid: str, *, allowed: bool = True, patch: list | None = None, **more) -> dict:
    response = {"uid": uid, "allowed": allowed, **more}
    if patch is not None:
        response |= {
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()),
        }
        response["patch"] = response["patch"].decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class Webhook:
    """A webhook server on a free port: `answer` makes each reply; `reviews` were received."""

    def __init__(self, reply: Answer = patch_scheduler):
        self.reply = reply
        self.reviews: list[dict] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append(review)
                outer.paths.append(self.path)
                code, body = outer.reply(review)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node("gpu-a", gpus=2)
        yield server


@pytest.fixture
def api_client(fake):
    client = k8s_config.new_client_from_config_dict(fake.kubeconfig())
    core = k8s.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": NS, "labels": {"enforce": "yes"}}})
    core.create_namespace({"metadata": {"name": "hooks"}})
    core.create_namespaced_service(
        "hooks", {"metadata": {"name": "hook"}, "spec": {"ports": [{"port": 443}]}}
    )
    return client


@pytest.fixture
def hook(fake):
    webhook = Webhook()
    fake.webhook_backends[("hooks", "hook")] = webhook.url
    yield webhook
    webhook.server.shutdown()


def configuration(**changes) -> dict:
    webhook = {
        "name": "pods.scheduler.example.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 2,
        "clientConfig": {
            "service": {"name": "hook", "namespace": "hooks", "path": "/mutate", "port": 443},
            "caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----").decode(),
        },
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
            }
        ],
        "namespaceSelector": {"matchLabels": {"enforce": "yes"}},
        **changes,
    }
    return {"metadata": {"name": "gpupool"}, "webhooks": [webhook]}


def install(api_client, **changes) -> None:
    admission = k8s.AdmissionregistrationV1Api(api_client)
    admission.create_mutating_webhook_configuration(configuration(**changes))


def pod(name: str = "p", labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }


def create(api_client, body: dict, ns: str = NS) -> dict:
    core = k8s.CoreV1Api(api_client)
    core.create_namespaced_pod(ns, body)
    return api_client.sanitize_for_serialization(
        core.read_namespaced_pod(body["metadata"]["name"], ns)
    )


def refusal(api_client, body: dict) -> tuple[int, str]:
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(api_client).create_namespaced_pod(NS, body)
    return err.value.status, json.loads(err.value.body)["message"]


def test_a_matching_webhook_gets_a_v1_review_of_the_defaulted_pod_and_its_patch_is_applied(
    fake, api_client, hook
):
    install(api_client)
    stored = create(api_client, pod())
    assert stored["spec"]["schedulerName"] == "gpupool"
    [review] = hook.reviews
    request = review["request"]
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", NS, "p")
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"  # defaulted first
    assert hook.paths == ["/mutate?timeout=2s"]


def test_namespace_and_object_selectors_decide_which_pods_are_sent(fake, api_client, hook):
    k8s.CoreV1Api(api_client).create_namespace({"metadata": {"name": "other"}})
    opt_out = {"matchExpressions": [{"key": "skip", "operator": "NotIn", "values": ["true"]}]}
    install(api_client, objectSelector=opt_out)
    assert create(api_client, pod("a"), "other")["spec"]["schedulerName"] == "default-scheduler"
    skipped = create(api_client, pod("b", {"skip": "true"}))
    assert skipped["spec"]["schedulerName"] == "default-scheduler"
    assert create(api_client, pod("c", {"skip": "no"}))["spec"]["schedulerName"] == "gpupool"
    assert [r["request"]["name"] for r in hook.reviews] == ["c"]


def test_an_answer_with_another_uid_is_a_failure_to_call_the_webhook(fake, api_client, hook):
    hook.reply = lambda review: (200, answer("not-" + review["request"]["uid"]))
    install(api_client)
    code, message = refusal(api_client, pod())
    assert code == 500
    assert message.startswith(
        'Internal error occurred: failed calling webhook "pods.scheduler.example.io": '
        "expected response.uid="
    )
    assert fake.pods() == []


def test_failure_policy_ignore_creates_the_pod_unchanged_when_the_webhook_is_down(fake, api_client):
    fake.webhook_backends[("hooks", "hook")] = "http://127.0.0.1:9"  # nobody listens
    install(api_client, failurePolicy="Ignore")
    assert create(api_client, pod())["spec"]["schedulerName"] == "default-scheduler"
    [(name, why)] = fake.webhook_failures
    assert "Connection refused" in why or "refused" in why


def test_failure_policy_fail_refuses_the_create_with_the_real_servers_message(fake, api_client):
    install(api_client)  # no backend: nobody listens where the Service points
    code, message = refusal(api_client, pod())
    assert code == 500
    assert message.startswith(
        'Internal error occurred: failed calling webhook "pods.scheduler.example.io": '
        'failed to call webhook: Post "https://hook.hooks.svc:443/mutate?timeout=2s": '
    )


def test_a_webhook_that_answers_too_late_is_a_failure(fake, api_client, hook):
    def slow(review: dict) -> tuple[int, dict]:
        threading.Event().wait(1.5)
        return patch_scheduler(review)

    hook.reply = slow
    install(api_client, timeoutSeconds=1)
    assert refusal(api_client, pod())[0] == 500


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (lambda r: (500, {}), "HTTP 500"),
        (lambda r: (200, {"kind": "AdmissionReview", "apiVersion": "v1beta1"}), "expected"),
        (
            lambda r: (200, answer(r["request"]["uid"], patch=[{"op": "remove", "path": "/x"}])),
            "patch does not apply",
        ),
    ],
    ids=["http-500", "wrong-kind", "bad-patch"],
)
def test_a_wrong_answer_is_a_failure_to_call(fake, api_client, hook, reply, why):
    hook.reply = reply
    install(api_client)
    code, message = refusal(api_client, pod())
    assert code == 500 and why in message


def test_an_empty_ca_bundle_fails_as_the_certificate_check_would(fake, api_client, hook):
    install(api_client, clientConfig={"service": {"name": "hook", "namespace": "hooks"}})
    code, message = refusal(api_client, pod())
    assert code == 500 and "x509: certificate signed by unknown authority" in message
    assert hook.reviews == []


def test_a_service_that_does_not_exist_is_a_failure(fake, api_client, hook):
    client = {"service": {"name": "gone", "namespace": "hooks"}, "caBundle": "Y2E="}
    install(api_client, clientConfig=client)
    assert 'service "gone" not found' in refusal(api_client, pod())[1]


def test_a_denial_refuses_the_create_with_the_webhooks_status(fake, api_client, hook):
    status = {"code": 403, "message": "no GPUs for you"}
    hook.reply = lambda r: (200, answer(r["request"]["uid"], allowed=False, status=status))
    install(api_client)
    assert refusal(api_client, pod()) == (
        403,
        'admission webhook "pods.scheduler.example.io" denied the request: no GPUs for you',
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"sideEffects": "Unknown"}, "sideEffects"),
        ({"name": "two.segments"}, "name"),
        ({"admissionReviewVersions": ["v2"]}, "admissionReviewVersions"),
        ({"failurePolicy": "Sometimes"}, "failurePolicy"),
        ({"timeoutSeconds": 31}, "timeoutSeconds"),
        ({"clientConfig": {"url": "http://hook.example.com/"}}, "clientConfig.url"),
        ({"clientConfig": {}}, "clientConfig"),
    ],
    ids=["side-effects", "name", "versions", "failure-policy", "timeout", "http", "no-client"],
)
def test_the_server_refuses_a_configuration_the_real_one_refuses(api_client, changes, field):
    with pytest.raises(ApiException) as err:
        install(api_client, **changes)
    assert err.value.status == 422
    assert f"webhooks[0].{field}" in json.loads(err.value.body)["message"]


def test_rbac_resource_names_allow_only_requests_naming_them(fake, api_client):
    core = k8s.CoreV1Api(api_client)
    core.create_namespaced_secret("hooks", {"metadata": {"name": "tls"}})
    core.create_namespaced_secret("hooks", {"metadata": {"name": "other"}})
    fake.allow([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tls"],
                 "verbs": ["get", "create", "list"]}])  # fmt: skip
    assert core.read_namespaced_secret("tls", "hooks").metadata.name == "tls"
    for call in (
        lambda: core.read_namespaced_secret("other", "hooks"),
        lambda: core.list_namespaced_secret("hooks"),
        lambda: core.create_namespaced_secret("hooks", {"metadata": {"name": "tls2"}}),
    ):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403
