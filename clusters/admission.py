"""The mutating admission webhook that makes every pod of an opted-in project use GPUPool's
scheduler (Run:ai's "enforce the scheduler", per project; docs/kubernetes-native.md).

kube-apiserver POSTs an `admission.k8s.io/v1` AdmissionReview to
`/k8s/admission/<cluster uid>/pods/` (deploy/webhook/: the MutatingWebhookConfiguration
selects only namespaces labelled `gpupool.io/enforce-scheduler=true`, which GPUPool sets on
the namespaces of projects with `enforce_scheduler`, and only pod CREATEs). `review_answer`
reads it and answers an AdmissionReview with the same `response.uid`, always `allowed`
(this webhook never refuses a pod: whether a failure to answer refuses it is the
configuration's failurePolicy, the admin's choice), and a JSONPatch made by MUTATIONS.

Each mutation is a small function `(pod, context) -> list of JSONPatch operations`, called
for pods of any project's namespace the configuration selects (a namespace that is no
project's is answered unchanged); each decides from the context whether it applies, and
sees the pod as submitted (the API server's defaults applied), so they must not touch the
same fields. Add one to MUTATIONS to make another change (and widen the configuration's
namespaceSelector if it must reach namespaces that do not enforce the scheduler).

What `set_scheduler` leaves alone (and why):
- a namespace whose project did not opt in (the selector's label may be stale or set by
  hand): only the database says which projects opted in;
- a pod labelled `gpupool.io/enforce-scheduler: "false"` (the configuration's
  objectSelector leaves it out already);
- a pod that names GPUPool's scheduler already, or another scheduler than the default one
  (a user who names Volcano or a custom scheduler chose it; like Run:ai, only the default
  scheduler is replaced; what such a pod holds counts as foreign use);
- mirror (static) pods: the kubelet made them and the API server only mirrors them;
- DaemonSet pods: their controller pins each to its node through node affinity for the
  default scheduler;
- pods created with `spec.nodeName` set: they are bound already, past any scheduler.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
ENFORCE_LABEL = "gpupool.io/enforce-scheduler"  # "true" on a namespace; "false" on a pod opts out
DEFAULT_SCHEDULER = "default-scheduler"
MIRROR = "kubernetes.io/config.mirror"
# A review wraps one pod (and, on CREATE, no old object), which etcd stores in at most
# 1.5 MiB (its default request limit): a larger body is not a real review. Django's
# DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB) refuses one before the view is reached.
REVIEW_MAX_BYTES = 2 * 1024 * 1024


class ReviewInvalid(Exception):
    """The body is not an AdmissionReview this webhook can answer (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a mutation may know besides the pod."""

    namespace: str
    scheduler_name: str
    project: str  # the project whose namespace it is
    enforce_scheduler: bool  # the project's choice
    request_uid: str = ""  # the review's: unique to this pod's creation
    mps_root: str = ""  # the cluster's node agents' MPS root (its config `mps_root`)


Mutation = Callable[[dict, Context], list[dict]]


def set_scheduler(pod: dict, context: Context) -> list[dict]:
    """`spec.schedulerName` = GPUPool's for a pod the default scheduler would place (see the
    module's list of what is left alone)."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if not context.enforce_scheduler or spec.get("schedulerName") not in (
        None,
        "",
        DEFAULT_SCHEDULER,
    ):
        return []
    if (meta.get("labels") or {}).get(ENFORCE_LABEL) == "false":  # as the objectSelector
        return []
    if MIRROR in (meta.get("annotations") or {}) or spec.get("nodeName"):
        return []
    owners = meta.get("ownerReferences") or []
    if any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners):
        return []
    # "add" replaces a member that is there (RFC 6902 4.1): one operation either way.
    return [{"op": "add", "path": "/spec/schedulerName", "value": context.scheduler_name}]


def give_gpu_share(pod: dict, context: Context) -> list[dict]:
    """A pod GPUPool will schedule (it names GPUPool's scheduler, or `set_scheduler` gives
    it) that asks for part of a GPU (`gpupool.io/gpu-fraction`, `gpupool.io/gpu-memory`)
    gets what sharing needs and a pod cannot be given once made (clusters/native_sharing.py):
    hostIPC, its GPU's MPS pipe mounted from the MPS root, its GPU environment from a
    ConfigMap GPUPool writes before it binds the pod. A pod made from `generateName` (a
    Job's) has no name yet: its ConfigMap's name takes the review's uid, unique to this
    creation."""
    # Imported here: the portal's processes start without the Kubernetes client.
    from clusters.backends.kubernetes.manifests import MPS_ROOT  # noqa: PLC0415
    from clusters.native_sharing import config_map_of_new_pod, sharing_patch  # noqa: PLC0415

    named = (pod.get("spec") or {}).get("schedulerName") == context.scheduler_name
    if not named and not set_scheduler(pod, context):
        return []
    config_map = config_map_of_new_pod(pod, salt=context.request_uid[:8])
    return sharing_patch(pod, config_map=config_map, mps_root=context.mps_root or MPS_ROOT)


MUTATIONS: list[Mutation] = [set_scheduler, give_gpu_share]


def review_request(body: bytes) -> dict:
    """The review's `request`, checked as far as answering needs; ReviewInvalid else."""
    if len(body) > REVIEW_MAX_BYTES:
        raise ReviewInvalid(f"the review is larger than {REVIEW_MAX_BYTES} bytes")
    try:
        review = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReviewInvalid(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise ReviewInvalid("not an AdmissionReview")
    if review.get("apiVersion") != API_VERSION:
        raise ReviewInvalid(f"apiVersion must be {API_VERSION} (admissionReviewVersions: [v1])")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewInvalid("request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        raise ReviewInvalid("request.uid must be a string of 1 to 128 characters")
    for field in ("namespace", "operation"):
        if not isinstance(request.get(field, ""), str):
            raise ReviewInvalid(f"request.{field} must be a string")
    if not isinstance(request.get("object") or {}, dict):
        raise ReviewInvalid("request.object must be an object")
    return request


def is_pod_create(request: dict) -> bool:
    kind = request.get("kind") or {}
    return (
        request.get("operation") == "CREATE"
        and isinstance(kind, dict)
        and (kind.get("group"), kind.get("kind")) == ("", "Pod")
        and not request.get("subResource")
    )


def mutations_for(pod: dict, context: Context, mutations: list[Mutation] = MUTATIONS) -> list:
    return [operation for mutate in mutations for operation in mutate(pod, context)]


def review_answer(uid: str, operations: list[dict], warnings: list[str]) -> dict:
    """The AdmissionReview kube-apiserver expects back: the request's uid, allowed, and the
    operations (if any) as a base64 JSONPatch."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if operations:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def changed_warning(operations: list[dict], context: Context) -> list[str]:
    """What `kubectl` shows its user ("Warning: ..."), when the scheduler was set."""
    if not any(op.get("path") == "/spec/schedulerName" for op in operations):
        return []
    return [
        f"GPUPool: project {context.project} schedules every pod in {context.namespace}: "
        f"spec.schedulerName set to {context.scheduler_name}"
    ]
