"""Mutating admission webhooks for the fake API server, as kube-apiserver calls them
(k8s.io/apiserver/pkg/admission/plugin/webhook/mutating): on a pod CREATE, after the
server's defaults and its own mutating plugins (Priority), before validation and the
validating plugins (Pod Security).

- The MutatingWebhookConfigurations stored in the server (admissionregistration.k8s.io/v1,
  `check_configuration` refuses what the real one refuses on create), in order of their
  names, each one's webhooks in order.
- A webhook is called when a rule matches (operations, apiGroups, apiVersions, resources,
  scope), its namespaceSelector selects the namespace's labels and its objectSelector the
  pod's (an absent selector selects everything).
- Where: `clientConfig.url`, or `clientConfig.service`: the Service must exist with that
  port; the fake has no pod network, so `api.webhook_backends[(namespace, name)]` says where
  its pods listen (plain http: the fake does not speak TLS, but an empty caBundle fails as
  the real server's certificate check would: the portal's certificate is self-signed).
- The call: an AdmissionReview v1 with a fresh uid, `?timeout=<timeoutSeconds>s`, within
  that many seconds (default 10). The answer must be 200 and an admission.k8s.io/v1
  AdmissionReview whose response.uid is the request's; a JSONPatch that does not apply is a
  failure to call too. A failure: failurePolicy Fail (v1's default) refuses the create with
  the real server's 500 "Internal error occurred: failed calling webhook ..."; Ignore
  creates the pod as if the webhook were not there.
- `allowed: false` refuses with the webhook's status (its code, else 400).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
import uuid
from typing import Any

STORE = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
REVIEW = "admission.k8s.io/v1"
SIDE_EFFECTS = ("None", "NoneOnDryRun")
FAILURE_POLICIES = ("Ignore", "Fail")
MATCH_POLICIES = ("Exact", "Equivalent")
OPERATIONS = ("*", "CREATE", "UPDATE", "DELETE", "CONNECT")
QUALIFIED = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?){2,}")


class CallFailed(Exception):
    """The webhook could not be called or answered wrongly: failurePolicy decides."""


def check_configuration(obj: dict) -> None:
    """What the real server's validation refuses on create (ValidateMutatingWebhookConfiguration),
    for the fields this uses; 422 Invalid naming the field."""
    from tests.clusters.fake_apiserver import ApiError

    def invalid(field: str, why: str) -> None:
        raise ApiError(422, "Invalid", f"MutatingWebhookConfiguration: {field}: {why}")

    names = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        at = f"webhooks[{i}]"
        if not QUALIFIED.fullmatch(hook.get("name") or ""):
            invalid(f"{at}.name", "should be a domain with at least three segments")
        if hook["name"] in names:
            invalid(f"{at}.name", f'Duplicate value: "{hook["name"]}"')
        names.add(hook["name"])
        if hook.get("sideEffects") not in SIDE_EFFECTS:
            invalid(f"{at}.sideEffects", f"Unsupported value: must be one of {SIDE_EFFECTS}")
        versions = hook.get("admissionReviewVersions") or []
        if not versions or not set(versions) & {"v1", "v1beta1"}:
            invalid(f"{at}.admissionReviewVersions", "must include at least one of v1, v1beta1")
        _check_policies(hook, at, invalid)
        _check_client(hook.get("clientConfig") or {}, at, invalid)


def _check_policies(hook: dict, at: str, invalid: Any) -> None:
    if hook.get("failurePolicy", "Fail") not in FAILURE_POLICIES:
        invalid(f"{at}.failurePolicy", f"Unsupported value: must be one of {FAILURE_POLICIES}")
    if hook.get("matchPolicy", "Equivalent") not in MATCH_POLICIES:
        invalid(f"{at}.matchPolicy", f"Unsupported value: must be one of {MATCH_POLICIES}")
    if not 1 <= int(hook.get("timeoutSeconds", 10)) <= 30:
        invalid(f"{at}.timeoutSeconds", "the timeout value must be between 1 and 30 seconds")
    for rule in hook.get("rules") or []:
        if any(op not in OPERATIONS for op in rule.get("operations") or []):
            invalid(f"{at}.rules.operations", f"Unsupported value: must be one of {OPERATIONS}")


def _check_client(client: dict, at: str, invalid: Any) -> None:
    if ("url" in client) == ("service" in client):
        invalid(f"{at}.clientConfig", "exactly one of url or service is required")
    if "url" in client and not str(client["url"]).startswith("https://"):
        invalid(f"{at}.clientConfig.url", "'https' is the only allowed URL scheme")
    path = (client.get("service") or {}).get("path", "/")
    if "service" in client and not str(path).startswith("/"):
        invalid(f"{at}.clientConfig.service.path", "must start with a '/'")


def mutate_pod(api: Any, pod: dict, ns: str, *, dry_run: bool = False) -> None:
    """Call every matching webhook on the pod about to be created; the pod is patched in
    place, or ApiError refuses the create."""
    from tests.clusters.fake_apiserver import ApiError

    namespace_labels = api.objects["namespaces"][("", ns)]["metadata"].get("labels") or {}
    configurations = sorted(
        api.objects.get(STORE, {}).values(), key=lambda c: c["metadata"]["name"]
    )
    for configuration in configurations:
        for hook in configuration.get("webhooks") or []:
            if not _matches(hook, namespace_labels, pod):
                continue
            try:
                patched = _call(api, hook, pod, ns, dry_run)
            except CallFailed as exc:
                api.webhook_failures.append((hook["name"], str(exc)))
                if hook.get("failurePolicy", "Fail") == "Ignore":
                    continue
                message = f'Internal error occurred: failed calling webhook "{hook["name"]}": {exc}'
                raise ApiError(500, "InternalError", message) from None
            pod.clear()
            pod.update(patched)


def _matches(hook: dict, namespace_labels: dict, pod: dict) -> bool:
    from tests.clusters.fake_generic import selects

    rule_matches = any(_rule_matches(rule) for rule in hook.get("rules") or [])
    namespaces = hook.get("namespaceSelector")
    objects = hook.get("objectSelector")
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        rule_matches
        and (namespaces is None or selects(namespaces, namespace_labels))
        and (objects is None or selects(objects, pod_labels))
    )


def _rule_matches(rule: dict) -> bool:
    def has(field: str, wanted: str) -> bool:
        return any(v in ("*", wanted) for v in rule.get(field) or [])

    scope = rule.get("scope", "*")
    return (
        has("operations", "CREATE")
        and has("apiGroups", "")
        and has("apiVersions", "v1")
        and (has("resources", "pods") or has("resources", "*/*"))
        and scope in ("*", "Namespaced")
    )


def _call(api: Any, hook: dict, pod: dict, ns: str, dry_run: bool) -> dict:
    """The pod after the webhook's patch; CallFailed for anything but a good answer."""
    from tests.clusters.fake_apiserver import ApiError, json_patch

    timeout = int(hook.get("timeoutSeconds", 10))
    shown, target = _where(api, hook.get("clientConfig") or {}, timeout)
    uid = str(uuid.uuid4())
    body = json.dumps(_review(api, uid, pod, ns, dry_run)).encode()
    request = urllib.request.Request(
        target,
        data=body,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            payload = answer.read()
    except urllib.error.HTTPError as exc:
        raise CallFailed(f'failed to call webhook: Post "{shown}": HTTP {exc.code}') from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CallFailed(f'failed to call webhook: Post "{shown}": {reason}') from None
    response = _response(payload, uid)
    if response.get("allowed") is not True:
        status = response.get("status") or {}
        why = status.get("message") or "without explanation"
        message = f'admission webhook "{hook["name"]}" denied the request: {why}'
        raise ApiError(
            int(status.get("code") or 400), status.get("reason") or "BadRequest", message
        )
    if "patch" not in response:
        return pod
    if response.get("patchType") != "JSONPatch":
        raise CallFailed(f"unsupported patch type {response.get('patchType')!r}")
    try:
        operations = json.loads(base64.b64decode(response["patch"]))
        return json_patch(pod, operations)
    except (ValueError, TypeError, ApiError) as exc:
        raise CallFailed(f"the webhook's patch does not apply: {exc}") from None


def _where(api: Any, client: dict, timeout: int) -> tuple[str, str]:
    """(the URL as the real server names it in errors, where the fake sends the review)."""
    query = f"?timeout={timeout}s"
    if "url" in client:
        return client["url"] + query, client["url"] + query
    service = client["service"]
    ns, name, port = service["namespace"], service["name"], int(service.get("port", 443))
    path = service.get("path", "/")
    shown = f"https://{name}.{ns}.svc:{port}{path}{query}"
    failed = f'failed to call webhook: Post "{shown}"'
    found = api.objects["services"].get((ns, name))
    if found is None:
        raise CallFailed(f'{failed}: service "{name}" not found')
    if port not in [p.get("port") for p in found["spec"].get("ports") or []]:
        raise CallFailed(f'{failed}: no service port {port} found for service "{name}"')
    if not client.get("caBundle"):  # the system's roots do not know a self-signed CA
        raise CallFailed(
            f"{failed}: tls: failed to verify certificate: x509: certificate signed by "
            "unknown authority"
        )
    backend = api.webhook_backends.get((ns, name), "http://127.0.0.1:9")  # nobody listens on 9
    return shown, backend.rstrip("/") + path + query


def _review(api: Any, uid: str, pod: dict, ns: str, dry_run: bool) -> dict:
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    resource = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "apiVersion": REVIEW,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": (pod.get("metadata") or {}).get("name", ""),
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {"username": api.rbac_user, "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def _response(payload: bytes, uid: str) -> dict:
    """The review's response, checked as the real server checks it."""
    try:
        review = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise CallFailed("the webhook's answer is not JSON") from None
    if not isinstance(review, dict) or (review.get("apiVersion"), review.get("kind")) != (
        REVIEW,
        "AdmissionReview",
    ):
        raise CallFailed(f"expected webhook response of {REVIEW}, Kind=AdmissionReview")
    response = review.get("response")
    if not isinstance(response, dict):
        raise CallFailed("webhook response was absent")
    if response.get("uid") != uid:
        raise CallFailed(f'expected response.uid="{uid}", got "{response.get("uid")}"')
    return response
