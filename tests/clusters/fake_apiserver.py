"""An in-process Kubernetes API server speaking the real REST protocol, for the official client.

It implements what GPUPool's kubernetes backend and native scheduling use: /version; nodes;
namespaces; pods (create, get, list across namespaces with label and field selectors, delete
with a grace period, binding, status, eviction, log); services; core/v1 events;
priorityclasses (scheduling.k8s.io/v1); list + watch with resourceVersions. Errors are real
`Status` objects: 404 NotFound, 409 AlreadyExists/Conflict, 410 Gone for a watch from a
compacted resourceVersion (more kinds, and the custom resources of the CRDs a test installs
with `install_crds`: fake_generic.py). Faults can be injected: 500s, slow answers (client timeouts),
409s, and a server that drops every connection ("down").

It refuses what a real one refuses and adds what it adds (tests/clusters/
test_fake_apiserver_strict.py, test_fake_apiserver_native.py, test_fake_apiserver_http.py):
a request head Go's net/http would refuse is 400 (fake_http.py); a log asked of a container the
pod lacks is 400; namespaces get `kubernetes.io/metadata.name`, and the cluster has default,
kube-system, kube-public and kube-node-lease; a new node is tainted
`node.kubernetes.io/not-ready` until it is Ready; the Pod Security level a namespace enforces
(`pod-security.kubernetes.io/enforce`, else `pod_security_default`) is admitted as the real
plugin does, with its message; a pod's priorityClassName must exist; pods get their QoS class
and the real spec defaults (default-scheduler, restartPolicy Always, dnsPolicy, priority 0);
with `rbac_rules` set (a ClusterRole's rules), any request that neither they nor the
RoleBindings of its namespace (to the user, of a Role or ClusterRole stored here) allow is 403
Forbidden, and a RoleBinding's create must pass RBAC's escalation check (`bind` on its role,
or all the role grants held); a SelfSubjectReview names the user (`rbac_user`) to anyone;
env names are checked as Kubernetes 1.30+ does (printable ASCII but '=', not empty); a volume
mount's subPath and subPathExpr are relative paths without '..', not both; a name
or generateName is required (generated: 5 more characters); ownerReferences name apiVersion,
kind, name and uid, and at most one is the controller.
Native scheduling: a Binding refuses a pod bound already, gated (schedulingGates) or being
deleted (409), takes a node that does not exist, copies its annotations onto the pod and sets
PodScheduled=True; a pod's PATCH (JSON, merge or strategic-merge patch) changes labels,
annotations and owners, but its spec only where the real server lets it (scheduling gates
removed, never added; while gated, nodeSelector terms added; images, tolerations added):
422 else; pods/status takes PUT and patches, conditions merged by type and their types
checked, spec and metadata kept; core/v1 Events are checked
as the real legacy validation does (`api.events()` reads them); an Eviction deletes its pod
with its deleteOptions unless the pod's PodDisruptionBudget has no disruption left (429) or
two budgets select it (500); pod and event lists and watches take the real field
selectors (`spec.nodeName=` for unbound pods, `involvedObject.name=` for a pod's events),
other kinds metadata.name and metadata.namespace; any other field is 400.

A tiny kubelet: pods bound to a node start Running at once (auto_run), once their envFrom
ConfigMaps exist and each subPathExpr's variables have values (`sub_paths` keeps what each
expanded to), with the kubelet's conditions (PodScheduled, Initialized, ContainersReady,
Ready...), `finish()` ends them with an exit code (no longer ready); deletions wait for
`complete_deletions()` when `deferred_delete`. With `job_controller=True`, the Job
controller (fake_generic.sync_jobs) runs after every write and kubelet change, and on
`run_controllers()`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.clusters.admission import (
    EVERYONE_MAY,
    RBAC_GROUP,
    bound_rules,
    escalation_refusal,
    pod_security_violation,
    rbac_allows,
    rbac_forbidden,
    role_plural,
    user_groups,
)
from tests.clusters.fake_admission import mutate_pod
from tests.clusters.fake_generic import (
    CUSTOM_KINDS,
    JOBS,
    clone,
    controller_uid,
    generic_route,
    sync_jobs,
    take_disruption,
)
from tests.clusters.fake_http import BadRequest, read_headers, refusal, request_line

CORE = "/api/v1"
SCHEDULING = "/apis/scheduling.k8s.io/v1"
NETWORKING = "/apis/networking.k8s.io/v1"  # Ingresses (and NetworkPolicies): fake_generic.py
NAME_LABEL = "kubernetes.io/metadata.name"
NOT_READY = "node.kubernetes.io/not-ready"
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
GPU = "nvidia.com/gpu"
NAME_CHARACTERS = "bcdfghjklmnpqrstvwxz2456789"  # generated names' suffix, as the real one's
EVENT_WINDOW = 1000  # events kept for watches; older resourceVersions get 410 Gone


def _delete_grace(pod: dict, asked) -> int:
    """The pod registry's CheckGracefulDelete: the grace asked for, else the pod's
    terminationGracePeriodSeconds (defaulted to 30); 0 for a pod never bound to a node or
    already finished."""
    finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    if not pod["spec"].get("nodeName") or finished:
        return 0
    if asked is None:
        return int(pod["spec"].get("terminationGracePeriodSeconds", 30))
    return int(asked)


def _now(later_s: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=later_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# What a create of a subresource that makes no object (a Binding, an Eviction) answers.
CREATED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def kubeconfig_for(url: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.body = code, status_body(code, reason, message)


@dataclass
class Fault:
    kind: str  # "500" | "timeout" | "409" | "429" | "404"
    remaining: int
    method: str | None = None
    path_contains: str | None = None


def _matches(selector: str | None, labels: dict) -> bool:
    for raw in (selector or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif labels.get(term) is None:
            return False
    return True


# What the real server sets in a pod's spec left out (SetDefaults_PodSpec, and the Priority
# admission's 0 without a class). Not terminationGracePeriodSeconds (30 on a real server):
# test_kubernetes_backend reads the stored pod to see that GPUPool sent none.
POD_DEFAULTS = {
    "schedulerName": "default-scheduler",
    "restartPolicy": "Always",
    "dnsPolicy": "ClusterFirst",
    "priority": 0,
}
# The fields a list or watch may select on (the real ToSelectableFields of each kind), with
# the value the real server defaults each to; any other label is 400.
METADATA_FIELDS = {"metadata.name": "", "metadata.namespace": ""}
SELECTABLE = {
    "pods": {
        **METADATA_FIELDS,
        "spec.nodeName": "",
        "spec.restartPolicy": "Always",
        "spec.schedulerName": "default-scheduler",
        "spec.serviceAccountName": "default",
        "spec.hostNetwork": "false",
        "status.phase": "",
        "status.podIP": "",
        "status.nominatedNodeName": "",
    },
    "events": {
        **METADATA_FIELDS,
        **{
            f"involvedObject.{key}": ""
            for key in (
                "kind",
                "namespace",
                "name",
                "uid",
                "apiVersion",
                "resourceVersion",
                "fieldPath",
            )
        },
        "reason": "",
        "reportingComponent": "",
        "source": "",
        "type": "",
    },
}
FIELD_PATHS = {"source": ("source", "component")}  # a label that is not its own path


def _field_path(label: str) -> tuple[str, ...]:
    return FIELD_PATHS.get(label, tuple(label.split(".")))


def _field_terms(resource: str, selector: str | None) -> list[tuple[str, bool, str, str]]:
    """(label, equal, value, default) per term of a fieldSelector ("a=b,c!=d", "==" too), as
    the real fields.ParseSelector reads it; a label the kind cannot select on is 400."""
    known = SELECTABLE.get(resource, METADATA_FIELDS)
    terms = []
    for raw in (selector or "").split(","):
        term = raw.strip()
        if not term:
            continue
        match = re.fullmatch(r"([^=!]+)(!=|==|=)(.*)", term)
        if not match:
            message = f"invalid selector: '{selector}'; can't understand '{term}'"
            raise ApiError(400, "BadRequest", message)
        label, op, value = match.groups()
        if label not in known:
            raise ApiError(400, "BadRequest", f"field label not supported: {label}")
        terms.append((label, op != "!=", value, known[label]))
    return terms


def _field_value(obj: dict, label: str, default: str) -> str:
    value: Any = obj
    for key in _field_path(label):
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value if value is not None else default)


def _fields_match(terms: list[tuple[str, bool, str, str]], obj: dict) -> bool:
    return all(
        (_field_value(obj, label, default) == value) == equal
        for label, equal, value, default in terms
    )


def _selectable(resource: str, obj: dict) -> dict:
    """What a watch's selectors read of an object (its labels and selectable fields): kept
    per MODIFIED event, so that a change moving the object into or out of a selection is
    seen as ADDED or DELETED."""
    meta = obj["metadata"]
    labels = dict(meta.get("labels") or {})
    snapshot: dict = {"metadata": {"labels": labels}}
    for label in SELECTABLE.get(resource, METADATA_FIELDS):
        *parents, key = _field_path(label)
        source, target = obj, snapshot
        for parent in parents:
            source = source.get(parent) if isinstance(source, dict) else None
            target = target.setdefault(parent, {})
        if isinstance(source, dict) and key in source:
            target[key] = source[key]
    return snapshot


def _version(value: Any) -> int | None:
    """A resourceVersion parameter: absent, or a number; anything else is 400."""
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, "BadRequest", f'invalid resource version "{value}"') from None


def _bounded_int(query: dict, name: str, default: int) -> int:
    raw = query.get(name)
    if raw in (None, ""):
        return default
    try:
        number = int(raw)
    except ValueError:
        raise ApiError(400, "BadRequest", f'invalid {name} "{raw}"') from None
    if number < 0:
        raise ApiError(400, "BadRequest", f"{name}: must be >= 0")
    return number


# Kubernetes 1.30+ (RelaxedEnvironmentVariableValidation): printable ASCII but '='.
ENV_NAME = re.compile(r"[\x20-\x3c\x3e-\x7e]+")
ENV_NAME_MESSAGE = (
    "a valid environment variable name must consist only of printable ASCII characters "
    "other than '='"
)


PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")  # an IANA service name
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _validate_pod(pod: dict) -> None:
    """The checks of the real API server that a manifest can fail: 422 Invalid."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise ApiError(422, "Invalid", "spec.containers: Required value")
    if (spec.get("terminationGracePeriodSeconds") or 0) < 0:
        raise ApiError(422, "Invalid", "spec.terminationGracePeriodSeconds: must be >= 0")
    volumes = _validate_volumes(spec.get("volumes") or [])
    for field in ("hostname", "subdomain"):  # DNS labels, as the pod's DNS name needs
        if field in spec and not DNS_LABEL.fullmatch(str(spec[field])):
            raise ApiError(422, "Invalid", f'spec.{field}: Invalid value: "{spec[field]}"')
    for container in containers:
        for port in container.get("ports") or []:
            name = port.get("name", "")
            if name and not (
                PORT_NAME.fullmatch(name) and "--" not in name and re.search("[a-z]", name)
            ):
                message = f'spec.containers[0].ports.name: Invalid value: "{name}"'
                raise ApiError(422, "Invalid", message)
        _validate_env(container)
        _validate_env_from(container)
        _validate_resources(container)
    for container in containers + (spec.get("initContainers") or []):
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") not in volumes:
                message = f'spec.containers[0].volumeMounts.name: Not found: "{mount.get("name")}"'
                raise ApiError(422, "Invalid", message)
            if not str(mount.get("mountPath", "")).startswith("/"):
                raise ApiError(422, "Invalid", "spec.containers[0].volumeMounts.mountPath")
            _validate_sub_path(mount)


def _validate_sub_path(mount: dict) -> None:
    """As ValidateVolumeMounts: subPath and subPathExpr (before expansion) each a relative
    path with no '..' part, and not both (the field paths are the real server's: the
    index on the exclusion alone)."""
    sub_path, expr = str(mount.get("subPath") or ""), str(mount.get("subPathExpr") or "")
    if expr and sub_path:
        raise ApiError(
            422,
            "Invalid",
            f'spec.containers[0].volumeMounts[0].subPathExpr: Invalid value: "{expr}": '
            "subPathExpr and subPath are mutually exclusive",
        )
    for field, value in (("subPath", sub_path), ("subPathExpr", expr)):
        where = f'spec.containers[0].volumeMounts.{field}: Invalid value: "{value}"'
        if value.startswith("/"):
            raise ApiError(422, "Invalid", f"{where}: must be a relative path")
        if ".." in value.split("/"):
            raise ApiError(422, "Invalid", f"{where}: must not contain '..'")


def _validate_env(container: dict) -> None:
    for index, env in enumerate(container.get("env") or []):
        name = env.get("name", "")
        field = f"spec.containers[0].env[{index}].name"
        if not name:
            raise ApiError(422, "Invalid", f"{field}: Required value")
        if not ENV_NAME.fullmatch(name):
            message = f'{field}: Invalid value: "{name}": {ENV_NAME_MESSAGE}'
            raise ApiError(422, "Invalid", message)


def _validate_env_from(container: dict) -> None:
    """As ValidateEnvFrom: one source per item (a ConfigMap or a Secret) with a name, a
    prefix that is an env name. The ConfigMap need not exist: only the kubelet looks."""
    for index, source in enumerate(container.get("envFrom") or []):
        field = f"spec.containers[0].envFrom[{index}]"
        prefix = source.get("prefix") or ""
        if prefix and not ENV_NAME.fullmatch(prefix):
            raise ApiError(422, "Invalid", f'{field}.prefix: Invalid value: "{prefix}"')
        refs = [k for k in ("configMapRef", "secretRef") if source.get(k) is not None]
        if len(refs) != 1:
            message = (
                "must specify one of: `configMapRef` or `secretRef`"
                if not refs
                else "may not have more than one field specified at a time"
            )
            raise ApiError(
                422, "Invalid", f'spec.containers[0].envFrom: Invalid value: "": {message}'
            )
        name = str(source[refs[0]].get("name") or "")
        if not name:
            raise ApiError(422, "Invalid", f"{field}.{refs[0]}.name: Required value")
        if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
            raise ApiError(422, "Invalid", f'{field}.{refs[0]}.name: Invalid value: "{name}"')


def _validate_resources(container: dict) -> None:
    """Requests at most the limits; an extended resource (a GPU) requested as much as its
    limit, since it cannot be overcommitted."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for name, request in requests.items():
        if name in limits and _quantity(request) > _quantity(limits[name]):
            raise ApiError(
                422,
                "Invalid",
                f'spec.containers[0].resources.requests: Invalid value: "{request}": '
                f"must be less than or equal to {name} limit of {limits[name]}",
            )
        if "/" in name and name in limits and _quantity(request) != _quantity(limits[name]):
            raise ApiError(
                422,
                "Invalid",
                f'spec.containers[0].resources.requests[{name}]: Invalid value: "{request}": '
                f"must be equal to {name} limit of {limits[name]}",
            )


def _quantity(value: object) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(value))
    if not match:
        raise ApiError(422, "Invalid", f'quantities must match the regular expression: "{value}"')
    return float(match.group(1)) * units.get(match.group(2), 1)


def qos_class(spec: dict) -> str:
    """Guaranteed when every container has cpu and memory limits equal to its requests
    (requests default to limits), BestEffort when none asks for either, else Burstable."""
    containers = spec.get("containers") or []
    asked, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        for name in ("cpu", "memory"):
            asked = asked or name in requests or name in limits
            if name not in limits or _quantity(requests[name]) != _quantity(limits[name]):
                guaranteed = False
    if guaranteed and containers:
        return "Guaranteed"
    return "Burstable" if asked else "BestEffort"


def _validate_volumes(volumes: list[dict]) -> set[str]:
    names = set()
    for volume in volumes:
        name = volume.get("name", "")
        if not DNS_LABEL.fullmatch(name) or name in names:
            raise ApiError(422, "Invalid", f'spec.volumes.name: Invalid value: "{name}"')
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if "persistentVolumeClaim" in volume and not claim:
            raise ApiError(422, "Invalid", "spec.volumes.persistentVolumeClaim.claimName")
        if "configMap" in volume and not (volume["configMap"] or {}).get("name"):
            raise ApiError(422, "Invalid", "spec.volumes.configMap.name: Required value")
        sources = [k for k in volume if k != "name"]
        if len(sources) != 1:
            message = "must specify a volume type" if not sources else "may not specify more "
            message += "" if not sources else "than 1 volume type"
            raise ApiError(422, "Invalid", f"spec.volumes[{name}]: {message}")
        if "hostPath" in volume:
            _validate_host_path(volume["hostPath"] or {})
        names.add(name)
    return names


HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                   "CharDevice", "BlockDevice"}  # fmt: skip


def _validate_host_path(host_path: dict) -> None:
    """As the real server checks a hostPath: a path, no '..' in it, a known type."""
    path = str(host_path.get("path") or "")
    if not path:
        raise ApiError(422, "Invalid", "spec.volumes.hostPath.path: Required value")
    if ".." in path.split("/"):
        raise ApiError(422, "Invalid", "spec.volumes.hostPath.path: must not contain '..'")
    kind = host_path.get("type", "")
    if kind not in HOST_PATH_TYPES:
        raise ApiError(422, "Invalid", f'spec.volumes.hostPath.type: Unsupported value: "{kind}"')


ANNOTATIONS_MAX_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _check_string_map(patch: dict, field: str) -> None:
    """A label or annotation value is a string (null deletes, in a merge patch): anything
    else fails to decode, 400 as the real server answers."""
    for value in (patch or {}).values():
        if value is not None and not isinstance(value, str):
            kind = "number" if isinstance(value, int | float) else type(value).__name__
            message = (
                f"json: cannot unmarshal {kind} into Go struct field "
                f"ObjectMeta.metadata.{field} of type string"
            )
            raise ApiError(400, "BadRequest", message)


def _validate_annotations(annotations: dict) -> None:
    """As apimachinery's ValidateAnnotations: qualified-name keys (an optional DNS subdomain
    prefix of at most 253 and '/', a name of at most 63), at most 256 KiB in all: 422."""
    for key in annotations:
        prefix, _, name = key.rpartition("/")
        if (
            not QUALIFIED_NAME.fullmatch(name)
            or len(name) > 63
            or ("/" in key and not (DNS_SUBDOMAIN.fullmatch(prefix) and len(prefix) <= 253))
        ):
            message = (
                f'metadata.annotations: Invalid value: "{key}": name part must consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character"
            )
            raise ApiError(422, "Invalid", message)
    total = sum(len(k) + len(v) for k, v in annotations.items())
    if total > ANNOTATIONS_MAX_BYTES:
        message = f"metadata.annotations: Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"
        raise ApiError(422, "Invalid", message)


# Strategic merge: the lists these fields name merge item by item on the key (their
# patchMergeKey in k8s.io/api); every other list is replaced whole.
MERGE_KEYS = {"conditions": "type", "containerStatuses": "name", "initContainerStatuses": "name"}


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """RFC 7386 (application/merge-patch+json): maps merge, null deletes, the rest replaces;
    strategic (application/strategic-merge-patch+json) also merges the lists of MERGE_KEYS."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in MERGE_KEYS and isinstance(value, list):
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


def _merge_list(current: list, patch: list, key: str) -> list:
    merged = clone(current)
    for item in patch:
        index = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if index is None:
            merged.append(clone(item))
        else:
            merged[index] = merge_patch(merged[index], item, strategic=True)
    return merged


def patched(obj: dict, body: Any, content_type: str | None) -> dict:
    """The object after a PATCH of this content type (the official client sends strategic
    merge for a dict, JSON patch for a list, merge patch when asked)."""
    kind = (content_type or "").split(";")[0].strip()
    if kind == "application/strategic-merge-patch+json":
        return merge_patch(obj, body or {}, strategic=True)
    if kind == "application/merge-patch+json":
        return merge_patch(obj, body or {})
    if kind == "application/json-patch+json" and isinstance(body, list):
        return json_patch(obj, body)
    message = (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, "
        "application/strategic-merge-patch+json"
    )
    raise ApiError(415, "UnsupportedMediaType", message)


def json_patch(obj: dict, operations: list[dict]) -> dict:
    """RFC 6902 (add, remove, replace, test); an operation that cannot apply is 422, as the
    real server answers it."""
    document = clone(obj)
    for operation in operations:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in operation["path"].split("/")[1:]]
        try:
            parent = document
            for key in keys[:-1]:
                parent = parent[int(key)] if isinstance(parent, list) else parent[key]
            _apply(operation, parent, keys[-1])
        except (KeyError, IndexError, ValueError, TypeError):
            message = "the server rejected our request due to an error in our request"
            raise ApiError(422, "Invalid", message) from None
    return document


def _apply(operation: dict, parent: Any, key: str) -> None:
    """One operation on the container its path ends in; a failure raises."""
    kind, value = operation.get("op"), clone(operation.get("value"))
    at: Any = key
    if isinstance(parent, list):
        at = len(parent) if key == "-" else int(key)
    if kind == "test":
        if parent[at] != value:
            raise ValueError(key)
    elif kind == "remove":
        del parent[at]
    elif kind == "replace":
        if isinstance(parent, dict) and at not in parent:
            raise KeyError(key)
        parent[at] = value  # past a list's end: IndexError
    elif kind == "add" and isinstance(parent, list):
        parent.insert(at, value)
    elif kind == "add":
        parent[at] = value
    else:
        raise ValueError(kind)


SYSTEM_CONDITIONS = ("PodScheduled", "Ready", "Initialized")


def _validate_pod_conditions(conditions: list[dict]) -> None:
    """validatePodConditions: a condition type of the pod's own is a qualified name (so not
    empty); the real server checks no status value (True/False/Unknown by convention)."""
    for index, condition in enumerate(conditions):
        kind = str(condition.get("type") or "")
        if kind in SYSTEM_CONDITIONS:
            continue
        prefix, _, name = kind.rpartition("/")
        where = f"status.conditions[{index}].Type"
        if not name:
            raise ApiError(
                422, "Invalid", f'{where}: Invalid value: "{kind}": name part must be non-empty'
            )
        if (
            not QUALIFIED_NAME.fullmatch(name)
            or len(name) > 63
            or ("/" in kind and not DNS_SUBDOMAIN.fullmatch(prefix))
        ):
            raise ApiError(
                422, "Invalid", f'{where}: Invalid value: "{kind}": must be a qualified name'
            )


def set_condition(status: dict, kind: str, value: str, **fields: str) -> None:
    """As podutil.UpdatePodCondition: lastTransitionTime moves only when the status does."""
    conditions = status.setdefault("conditions", [])
    old = next((c for c in conditions if c.get("type") == kind), None)
    condition = {"type": kind, "status": value, "lastProbeTime": None, **fields}
    changed = old is None or old.get("status") != value
    condition["lastTransitionTime"] = _now() if changed else old.get("lastTransitionTime")
    if old is None:
        conditions.append(condition)
    else:
        conditions[conditions.index(old)] = condition


def kubelet_conditions(status: dict, *, running: bool) -> None:
    """The conditions the kubelet keeps (generateAPIPodStatus): PodScheduled, and for a pod
    it started Initialized, PodReadyToStartContainers, ContainersReady and Ready; once its
    containers ended the last three are False (reason PodCompleted for the ready ones)."""
    set_condition(status, "PodScheduled", "True")
    set_condition(status, "PodReadyToStartContainers", "True" if running else "False")
    set_condition(status, "Initialized", "True")
    ready = {} if running else {"reason": "PodCompleted"}
    for kind in ("ContainersReady", "Ready"):
        set_condition(status, kind, "True" if running else "False", **ready)


EVENT_LIMITS = {"reportingInstance": 128, "action": 128, "reason": 128, "message": 1024}


def _validate_event(event: dict, ns: str) -> None:
    """core/v1 Events get legacyValidateEvent and nothing more (the strict checks are
    events.k8s.io/v1's): without eventTime only that involvedObject.namespace is the
    event's (or empty, in "default"); reason, message and type are free. With eventTime
    (a "new" event): reportingComponent, reportingInstance, action, reason required, each
    at most 128 characters, the message at most 1024."""
    theirs = (event.get("involvedObject") or {}).get("namespace") or ""
    new = bool(event.get("eventTime"))
    allowed = (
        (theirs == ns) if theirs else ns in (("default", "kube-system") if new else ("", "default"))
    )
    if not allowed:
        message = (
            f'involvedObject.namespace: Invalid value: "{theirs}": does not match event.namespace'
        )
        raise ApiError(422, "Invalid", message)
    if not new:
        return
    if not event.get("reportingComponent"):
        raise ApiError(422, "Invalid", "reportingController: Required value")
    for field, limit in EVENT_LIMITS.items():
        value = str(event.get(field) or "")
        if not value and field != "message":
            raise ApiError(422, "Invalid", f"{field}: Required value")
        if len(value) > limit:
            raise ApiError(
                422, "Invalid", f'{field}: Invalid value: "": can have at most {limit} characters'
            )


MUTABLE_POD_FIELDS = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
    "set to 1 if it was previously negative)"
)


def _check_pod_update(name: str, old: dict, new: dict) -> None:
    """ValidatePodUpdate: a scheduling gate may only be removed; while the pod is gated its
    nodeSelector may gain terms and its affinity change (PodSchedulingReadiness); else only
    images, activeDeadlineSeconds and added tolerations: 422 for anything more."""
    before = [g.get("name") for g in old.get("schedulingGates") or []]
    added = [g.get("name") for g in new.get("schedulingGates") or [] if g.get("name") not in before]
    if added:
        message = (
            "spec.schedulingGates: Forbidden: only deletion is allowed, but found new "
            f"scheduling gate '{added[0]}'"
        )
        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: {message}')
    tolerations = old.get("tolerations") or []
    selector = old.get("nodeSelector") or {}
    gated = bool(before)
    if (
        (new.get("tolerations") or [])[: len(tolerations)] != tolerations
        or (gated and any((new.get("nodeSelector") or {}).get(k) != v for k, v in selector.items()))
        or _frozen(old, gated) != _frozen(new, gated)
    ):
        raise ApiError(
            422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: {MUTABLE_POD_FIELDS}'
        )


def _frozen(spec: dict, gated: bool) -> dict:
    """The part of a pod's spec no update may change."""
    frozen = clone(spec)
    mutable = ["activeDeadlineSeconds", "schedulingGates", "tolerations"]
    for field in mutable + (["nodeSelector", "affinity"] if gated else []):
        frozen.pop(field, None)
    for container in frozen.get("containers", []) + frozen.get("initContainers", []):
        container.pop("image", None)
    return frozen


def _namespace(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": _now(),
            "labels": {NAME_LABEL: name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def _node_ready(node: dict, ready: bool) -> None:
    """The kubelet's Ready condition, and the node lifecycle controller's taint with it."""
    node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != NOT_READY]
    if not ready:
        taints.append({"key": NOT_READY, "effect": "NoSchedule", "timeAdded": _now()})
    node["spec"]["taints"] = taints


def _validate_priority_class(obj: dict) -> None:
    name = obj["metadata"].get("name", "")
    if name.startswith("system-"):
        message = (
            f'metadata.name: Invalid value: "{name}": '
            "priority class names with 'system-' prefix are reserved"
        )
        raise ApiError(422, "Invalid", message)
    if not isinstance(obj.get("value"), int):
        raise ApiError(422, "Invalid", "value: Required value")
    if obj["value"] > MAX_USER_PRIORITY:
        message = (
            f'PriorityClass.scheduling.k8s.io "{name}" is invalid: value: Forbidden: '
            f"maximum allowed value of a user defined priority is {MAX_USER_PRIORITY}"
        )
        raise ApiError(422, "Invalid", message)


CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _validate_config_map(config_map: dict) -> None:
    name = config_map["metadata"]["name"]
    if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        raise ApiError(422, "Invalid", f'metadata.name: Invalid value: "{name}"')
    data = config_map.get("data") or {}
    for key in data:
        if not CONFIG_KEY.fullmatch(key):
            raise ApiError(422, "Invalid", f'data[{key}]: Invalid value: "{key}"')
    if sum(len(k) + len(str(v)) for k, v in data.items()) > 1024 * 1024:
        raise ApiError(422, "Invalid", "data: Too long: must have at most 1048576 bytes")


def _missing_env_from(pod: dict, config_maps: dict) -> list[str]:
    """The ConfigMaps a container takes its environment from (envFrom, not optional) that
    do not exist: the kubelet cannot make the container (CreateContainerConfigError) and
    tries again later."""
    namespace = pod["metadata"]["namespace"]
    return [
        ref["name"]
        for container in pod["spec"]["containers"]
        for source in container.get("envFrom") or []
        if (ref := source.get("configMapRef"))
        and not ref.get("optional")
        and (namespace, ref["name"]) not in config_maps
    ]


EXPANSION = re.compile(r"\$\(([^)]*)\)")


def _sub_paths(pod: dict, config_maps: dict) -> tuple[dict[tuple[str, str], str], list[str]]:
    """What the kubelet mounts for each subPathExpr, by (container, mountPath): its $(VAR)
    expanded from the container's environment (its envFrom ConfigMaps in order, a prefix
    before their keys, then its env values, a later one winning: makeEnvironmentVariables),
    and the variables unset or empty, for which it makes no container ("missing value for
    VAR": ExpandContainerVolumeMounts)."""
    namespace = pod["metadata"]["namespace"]
    paths: dict[tuple[str, str], str] = {}
    unset: list[str] = []
    for container in pod["spec"]["containers"]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or {}
            data = (config_maps.get((namespace, ref.get("name"))) or {}).get("data") or {}
            env.update({f"{source.get('prefix') or ''}{k}": str(v) for k, v in data.items()})
        env.update({e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e})
        for mount in container.get("volumeMounts") or []:
            expr = mount.get("subPathExpr") or ""
            lacking = [name for name in EXPANSION.findall(expr) if not env.get(name)]
            unset += lacking
            if expr and not lacking:
                path = EXPANSION.sub(lambda m, env=env: env[m.group(1)], expr)
                paths[(container["name"], mount["mountPath"])] = path
    return paths, unset


SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
NODE_PORTS = range(30000, 32768)  # the API server's default --service-node-port-range


def _validate_service(service: dict, taken: set[int]) -> None:
    """What the real API server checks of a Service's ports and type, and what it adds: a
    node port for each port of a NodePort Service, from the range, never one in use."""
    spec = service.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    if kind not in SERVICE_TYPES:
        raise ApiError(422, "Invalid", f'spec.type: Unsupported value: "{kind}"')
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None":
        raise ApiError(422, "Invalid", "spec.ports: Required value")
    names = [p.get("name") or "" for p in ports]
    if len(ports) > 1 and (not all(names) or len(set(names)) != len(names)):
        raise ApiError(422, "Invalid", "spec.ports: names are required and unique when several")
    for index, port in enumerate(ports):
        where = f"spec.ports[{index}]"
        if not isinstance(port.get("port"), int) or not 1 <= port["port"] <= 65535:
            raise ApiError(422, "Invalid", f"{where}.port: Invalid value: {port.get('port')}")
        if names[index] and not PORT_NAME.fullmatch(names[index]):
            raise ApiError(422, "Invalid", f'{where}.name: Invalid value: "{names[index]}"')
        if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
            raise ApiError(422, "Invalid", f"{where}.protocol: Unsupported value")
        node_port = port.get("nodePort")
        if node_port and kind not in ("NodePort", "LoadBalancer"):
            raise ApiError(422, "Forbidden", f"{where}.nodePort: may not be used when `type` "
                                             f"is '{kind}'")  # fmt: skip
        if node_port and (node_port not in NODE_PORTS or node_port in taken):
            raise ApiError(422, "Invalid", f"{where}.nodePort: Invalid value: {node_port}")
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port["port"])
        if kind in ("NodePort", "LoadBalancer") and not node_port:
            port["nodePort"] = next(p for p in NODE_PORTS if p not in taken)
        if port.get("nodePort"):
            taken.add(port["nodePort"])
    spec["type"] = kind


OWNER_FIELDS = {
    "apiVersion": "version must not be empty",
    "kind": "must not be empty",
    "name": "must not be empty",
    "uid": "must not be empty",
}


def _validate_owners(meta: dict) -> None:
    """As apimachinery's ValidateOwnerReferences: each names an apiVersion, kind, name and
    uid, and at most one is the controller (422, the real messages)."""
    owners = meta.get("ownerReferences") or []
    for owner in owners:
        for field, why in OWNER_FIELDS.items():
            if not owner.get(field):
                message = f'metadata.ownerReferences.{field}: Invalid value: "": {why}'
                raise ApiError(422, "Invalid", message)
    controllers = [f"{o['kind']}/{o['name']}" for o in owners if o.get("controller")]
    if len(controllers) > 1:
        message = (
            "metadata.ownerReferences: Invalid value: Only one reference can have Controller "
            f'set to true. Found "true" in references for {controllers[0]} and {controllers[1]}'
        )
        raise ApiError(422, "Invalid", message)


def _seen_as(kind: str, obj: dict, before: dict | None, visible: Any) -> str | None:
    """The event a watch with these selectors sees, if any. A change of labels or selected
    fields moves an object into or out of the selection: ADDED or DELETED, as the real
    server sends."""
    now_in = visible(obj)
    if kind == "MODIFIED" and before is not None:
        was_in = visible(before)
        if was_in != now_in:
            return "ADDED" if now_in else "DELETED"
    return kind if now_in else None


class _Server(ThreadingHTTPServer):
    # The listen backlog the real server's (Go's net.Listen) gets: the system's somaxconn,
    # not socketserver's 5, which resets connections a client's pool opens at once.
    request_queue_size = socket.SOMAXCONN

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a timed-out request, a "down" server) are expected."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeApiServer:
    """`with FakeApiServer() as api:` serves on a free loopback port; `api.kubeconfig()`."""

    def __init__(
        self, *, auto_run: bool = True, deferred_delete: bool = False, job_controller: bool = False
    ):
        self.auto_run = auto_run
        self.deferred_delete = deferred_delete
        # The Job controller (fake_generic.sync_jobs): after every write, and on run_controllers().
        self.job_controller = job_controller
        self.job_pods: dict[str, dict[str, str]] = {}  # Job uid -> its pods' uids -> outcome
        self.touched_jobs: set[str] = set()  # uids of Jobs (or pods' controllers) written since
        self.job_keys: dict[str, tuple[str, str]] = {}  # a Job's uid -> its (namespace, name)
        self.controlled: dict[str, set[tuple[str, str]]] = {}  # controller uid -> its pods
        self._controller_of: dict[tuple[str, str], str] = {}
        self.random = random.Random(0)  # generated names: the same in every run
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = itertools.count(1)
        self.last_rv = 0
        self.objects: dict[str, dict[tuple[str, str], dict]] = {
            "nodes": {},
            "namespaces": {},
            "pods": {},
            "services": {},
            "priorityclasses": {},
            "configmaps": {},
            "events": {},
        }
        self.history: list[tuple[int, str, str, dict]] = []  # watch events: rv, resource, type, obj
        self.faults: list[Fault] = []
        # Namespaces the cluster forbids creating (RBAC, an admission webhook): 403.
        self.forbidden_namespaces: set[str] = set()
        # The level of namespaces without a pod-security.kubernetes.io/enforce label
        # (the AdmissionConfiguration's default; "privileged" unless a cluster sets one).
        self.pod_security_default = "privileged"
        # A ClusterRole's rules the kubeconfig's user is bound to; None: allowed anything.
        self.rbac_rules: list[dict] | None = None
        self.rbac_user = "system:serviceaccount:gpupool:gpupool"
        # Validating admission webhooks on pod create: name -> why it denies (or None).
        self.webhooks: dict[str, Callable[[dict], str | None]] = {}
        # Custom resources served, (apiVersion, plural): their CRDs are installed
        # (`install_crds`; the kinds are fake_generic.CUSTOM_KINDS).
        self.crds: set[tuple[str, str]] = set()
        # Mutating webhooks are those of the MutatingWebhookConfigurations created in the
        # server (fake_admission.py); a Service's (namespace, name) -> where its pods listen
        # (the fake has no pod network); each failure to call one: (webhook, why).
        self.webhook_backends: dict[tuple[str, str], str] = {}
        self.webhook_failures: list[tuple[str, str]] = []
        self.denied: list[tuple[str, str, str]] = []  # (verb, resource, namespace)
        self.allowed: set[tuple[str, str, str]] = set()  # (verb, group, resource) used
        self.down = False
        self.timeout_s = 2.0
        self.requests: list[tuple[str, str]] = []
        # What the kubelet mounted for each subPathExpr of a pod it started, by (namespace,
        # name): {(container, mountPath): the expanded path within its volume}.
        self.sub_paths: dict[tuple[str, str], dict[tuple[str, str], str]] = {}
        self.queries: list[tuple[str, str, dict]] = []  # method, path, query parameters
        # Watches: the server's timeoutSeconds when a client sets none (the real one picks
        # 30 to 60 minutes), how often BOOKMARKs go out (about a minute on the real one,
        # and one shortly before a watch times out), how long a watch from a version the
        # server has not reached yet waits before 504 (3 s on the real one).
        self.default_watch_timeout_s = 5
        self.bookmark_interval_s = 60.0
        self.bookmark_lead_s = 2.0
        self.too_large_wait_s = 0.5
        self.event_window = EVENT_WINDOW
        self.list_calls: Counter[str] = Counter()  # full lists (not watches) per resource
        self._selected: dict[tuple[str, str, str], dict] = {}  # what selectors read, as stored
        self.before: dict[int, dict] = {}  # MODIFIED event's version -> what selectors read before
        self.logs: dict[tuple[str, str], str] = {}
        self.devices: dict[tuple[str, str], tuple[str, list[int]]] = {}  # pod -> node, GPUs
        self.gpus_held: dict[str, set[int]] = {}  # node -> its GPUs in `devices` (an index)
        self.handler = _handler_for(self)
        self.server = _Server(("127.0.0.1", 0), self.handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        with self.lock:
            for name in SYSTEM_NAMESPACES:
                self._store("namespaces", "", _namespace(name), "ADDED")

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def kubeconfig(self) -> dict:
        return kubeconfig_for(self.url)

    # --- test helpers ----------------------------------------------------------------------------
    def inject(
        self, kind: str, count: int = 1, *, method: str | None = None, path: str | None = None
    ):
        with self.lock:
            self.faults.append(Fault(kind, count, method, path))

    def add_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        labels: dict | None = None,
        model: str = "NVIDIA-A100-SXM4-80GB",
        memory_mib: int = 81920,
        ready: bool = True,
        unschedulable: bool = False,
        taints: list[dict] | None = None,
    ) -> dict:
        all_labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": model,
            "nvidia.com/gpu.memory": str(memory_mib),
            **(labels or {}),
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels, "uid": str(uuid.uuid4())},
            "spec": {"unschedulable": unschedulable, "taints": list(taints or [])},
            "status": {
                "allocatable": {"cpu": "96", "memory": "1056Gi", "nvidia.com/gpu": str(gpus)},
                "capacity": {"cpu": "96", "memory": "1056Gi", "nvidia.com/gpu": str(gpus)},
            },
        }
        # A node registers NotReady and tainted; its kubelet then reports it Ready.
        _node_ready(node, False)
        with self.lock:
            self._store("nodes", "", node, "ADDED")
            if ready:
                self.set_ready(name, True)
        return clone(self.objects["nodes"][("", name)])

    def install_crds(self, *resources: tuple[str, str]) -> None:
        """Serve these custom resources ((apiVersion, plural), of fake_generic.CUSTOM_KINDS;
        none: every one), as a cluster where their operators' CRDs are installed."""
        with self.lock:
            self.crds |= set(resources or CUSTOM_KINDS)

    def set_ready(self, name: str, ready: bool) -> None:
        with self.lock:
            node = self.objects["nodes"][("", name)]
            _node_ready(node, ready)
            self._store("nodes", "", node, "MODIFIED")

    def allow(self, rules: list[dict] | None) -> None:
        """Answer as if the kubeconfig's user were bound to a ClusterRole with `rules`."""
        with self.lock:
            self.rbac_rules = rules
            self.denied.clear()
            self.allowed.clear()

    def remove_node(self, name: str) -> None:
        """The node is gone, and the node controller deletes its pods."""
        with self.lock:
            self._delete("nodes", "", name)
            for (ns, pod_name), pod in list(self.objects["pods"].items()):
                if pod["spec"].get("nodeName") == name:
                    self._delete("pods", ns, pod_name)
            self.after_change()

    def pods(self) -> list[dict]:
        with self.lock:
            return [clone(p) for p in self.objects["pods"].values()]

    def pod(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            return clone(self.objects["pods"].get((namespace, name)))

    def services(self) -> list[dict]:
        with self.lock:
            return [clone(s) for s in self.objects["services"].values()]

    def namespaces(self) -> dict[str, dict]:
        with self.lock:
            return {k[1]: clone(v) for k, v in self.objects["namespaces"].items()}

    def finish(self, namespace: str, name: str, exit_code: int = 0) -> None:
        with self.lock:
            pod = self.objects["pods"][(namespace, name)]
            container = pod["spec"]["containers"][0]["name"]
            phase = "Succeeded" if exit_code == 0 else "Failed"
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if not exit_code else "Error",
            }
            pod["status"] = {
                **pod["status"],
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": container,
                        "ready": False,
                        "restartCount": 0,
                        "image": "x",
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            }
            kubelet_conditions(pod["status"], running=False)
            self._store("pods", namespace, pod, "MODIFIED")
            self.after_change()

    def complete_deletions(self) -> int:
        """The kubelet confirms every terminating pod has stopped."""
        with self.lock:
            doomed = [
                k for k, p in self.objects["pods"].items() if p["metadata"].get("deletionTimestamp")
            ]
            for ns, name in doomed:
                self._delete("pods", ns, name)
            self.after_change()
            return len(doomed)

    def events(self, namespace: str | None = None) -> list[dict]:
        """The core/v1 Events stored (of one namespace, or all), oldest first."""
        with self.lock:
            events = [
                clone(e)
                for (ns, _), e in self.objects["events"].items()
                if namespace is None or ns == namespace
            ]
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def run_controllers(self) -> None:
        """What kube-controller-manager would do now: the Job controller (when enabled)
        syncs every Job until nothing changes. Synchronous, so tests need not wait."""
        self._sync_jobs(None)

    def after_change(self) -> None:
        """The Job controller syncs the Jobs that a write touched (the Job, or one of its
        pods), as the real one is driven by its informers' events: not every Job on every
        write, which grew with Jobs x pods."""
        if self.job_controller and self.touched_jobs:
            self._sync_jobs(self.touched_jobs)

    def _sync_jobs(self, uids: set[str] | None) -> None:
        """`uids` None: every Job. Until a pass writes nothing (a pass may make work for the
        next: a pod made, then counted), the Jobs that the last pass touched."""
        with self.lock:
            for _ in range(10):
                self.touched_jobs = set()
                if not sync_jobs(self, self.client(), uids) or not self.touched_jobs:
                    return
                uids = self.touched_jobs

    def client(self) -> Any:
        """The request handler's operations without a request: how the fake's controllers
        write through the same checks (admission, validation) as a client's request."""
        return self.handler.__new__(self.handler)

    def generate_name(self, meta: dict) -> str:
        """metadata.generateName plus 5 characters, as the real server's name generator."""
        prefix = meta.get("generateName")
        if not prefix:
            message = "metadata.name: Required value: name or generateName is required"
            raise ApiError(422, "Invalid", message)
        return prefix[:58] + "".join(self.random.choice(NAME_CHARACTERS) for _ in range(5))

    # --- storage -----------------------------------------------------------------------------
    def _store(self, resource: str, ns: str, obj: dict, event: str) -> dict:
        rv = next(self.rv)
        self.last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        key = (resource, ns, obj["metadata"]["name"])
        if event == "MODIFIED":  # a watch's selector may have matched the object before only
            self.before[rv] = self._selected.get(key, {"metadata": {}})
        self._selected[key] = _selectable(resource, obj)
        self.objects[resource][(ns, obj["metadata"]["name"])] = obj
        self._event(rv, resource, event, obj)
        self._touch(resource, ns, obj, present=True)
        return obj

    def _touch(self, resource: str, ns: str, obj: dict, *, present: bool) -> None:
        """The Job this write concerns, for the Job controller (`after_change`), and the
        pods each controller has (`controlled`): its informers' index, so that a sync reads
        a Job's pods without scanning every pod."""
        if resource == JOBS:
            uid = obj["metadata"].get("uid", "")
            self.touched_jobs.add(uid)
            if present:
                self.job_keys[uid] = (ns, obj["metadata"]["name"])
            else:
                self.job_keys.pop(uid, None)
        if resource != "pods":
            return
        key = (ns, obj["metadata"]["name"])
        if was := self._controller_of.pop(key, None):
            self.controlled[was].discard(key)
            self.touched_jobs.add(was)
        if (uid := controller_uid(obj)) and present:
            self._controller_of[key] = uid
            self.controlled.setdefault(uid, set()).add(key)
            self.touched_jobs.add(uid)

    def _delete(self, resource: str, ns: str, name: str) -> dict:
        obj = self.objects[resource].pop((ns, name))
        self._release_devices((ns, name))
        self._selected.pop((resource, ns, name), None)
        rv = next(self.rv)
        self.last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        self._event(rv, resource, "DELETED", obj)
        self._touch(resource, ns, obj, present=False)
        self._collect_garbage(obj["metadata"].get("uid"))
        return obj

    def _collect_garbage(self, uid: str | None) -> None:
        """The garbage collector: objects whose owner is gone go too (background
        propagation; the real one does it a moment later)."""
        for resource, objects in self.objects.items():
            for (ns, name), obj in list(objects.items()):
                owners = obj["metadata"].get("ownerReferences") or []
                if uid and any(o.get("uid") == uid for o in owners):
                    self._delete(resource, ns, name)

    def _allocate_devices(self, pod: dict) -> bool:
        """The device plugin: the lowest free GPUs of the node, whatever GPUPool had in
        mind; like a container that runs nvidia-smi, the pod's log names their UUIDs."""
        node = pod["spec"]["nodeName"]
        wanted = sum(
            int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))
            for c in pod["spec"]["containers"]
        )
        if not wanted:
            return True
        total = int(self.objects["nodes"][("", node)]["status"]["allocatable"].get(GPU, 0))
        used = self.gpus_held.setdefault(node, set())
        free = [i for i in range(total) if i not in used]
        if len(free) < wanted:
            return False
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._release_devices(key)
        self.devices[key] = (node, free[:wanted])
        used.update(free[:wanted])
        self.logs[key] = "".join(f"GPU-{node}-{i}\n" for i in free[:wanted])
        return True

    def _release_devices(self, key: tuple[str, str]) -> None:
        if held := self.devices.pop(key, None):
            self.gpus_held[held[0]].difference_update(held[1])

    def _event(self, rv: int, resource: str, kind: str, obj: dict) -> None:
        self.history.append((rv, resource, kind, clone(obj)))
        for old, *_ in self.history[: -self.event_window]:
            self.before.pop(old, None)
        del self.history[: -self.event_window]
        self.changed.notify_all()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.remaining <= 0:
                    continue
                if fault.method and fault.method != method:
                    continue
                if fault.path_contains and fault.path_contains not in path:
                    continue
                fault.remaining -= 1
                return fault
        return None


NAMESPACED = "pods|services|configmaps|events"
POD_SUBRESOURCES = "binding|status|log|eviction"
ROUTES = [
    (re.compile(r"^/version/?$"), "version"),
    (re.compile(r"^/apis/authentication\.k8s\.io/v1/selfsubjectreviews$"), "self_review"),
    (re.compile(rf"^{CORE}/(nodes|namespaces|pods|services|events)$"), "collection"),
    (re.compile(rf"^{CORE}/(nodes|namespaces)/([^/]+)$"), "cluster_item"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/({NAMESPACED})$"), "ns_collection"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/({NAMESPACED})/([^/]+)$"), "ns_item"),
    (re.compile(rf"^{CORE}/namespaces/([^/]+)/pods/([^/]+)/({POD_SUBRESOURCES})$"), "pod_sub"),
    (re.compile(rf"^{SCHEDULING}/(priorityclasses)$"), "collection"),
    (re.compile(rf"^{SCHEDULING}/(priorityclasses)/([^/]+)$"), "cluster_item"),
]
KINDS = {
    "nodes": "Node",
    "namespaces": "Namespace",
    "pods": "Pod",
    "services": "Service",
    "priorityclasses": "PriorityClass",
    "configmaps": "ConfigMap",
    "events": "Event",
}
API_VERSIONS = {"priorityclasses": "scheduling.k8s.io/v1"}
CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses"}
MAX_USER_PRIORITY = 1_000_000_000


def request_attributes(method: str, path: str, query: dict) -> tuple[str, ...] | None:
    """(verb, API group, resource[/subresource], namespace, name) as the authorizer sees a
    request; None for a non-resource URL (/version, readable by anyone)."""
    if path.startswith(CORE + "/") or path == CORE:
        group, rest = "", path[len(CORE) :]
    elif (named := re.match(r"^/apis/([^/]+)/([^/]+)(/.*)?$", path)) is not None:
        # Every named group (batch, apps, policy, networking.k8s.io...) is a resource URL:
        # the authorizer checks it as the real one does, whichever kind the fake serves.
        group, rest = named.group(1), named.group(3) or ""
    else:
        return None
    parts = [p for p in rest.split("/") if p]
    ns = ""
    if len(parts) >= 3 and parts[0] == "namespaces":
        ns, parts = parts[1], parts[2:]
    if not parts:
        return None
    resource, name = parts[0], parts[1] if len(parts) > 1 else ""
    if len(parts) > 2:
        resource = f"{resource}/{parts[2]}"
    watching = str(query.get("watch", "")).lower() in ("true", "1")
    verb = {
        "GET": "get" if name else ("watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return verb, group, resource, ns, name


def _handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as Go's net package sets on every connection of the real server:
        # else a keep-alive client waits out its delayed ACK (40 ms) for each answer's body.
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def parse_request(self) -> bool:
            """The request line and headers as the real server reads them (fake_http.py:
            what Go's net/http refuses is refused, its answer written, the connection
            closed), instead of http.server's lenient email parser; then, as http.server
            does, the Connection and Expect headers."""
            self.command, self.close_connection = None, True
            self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
            if not self.requestline.strip():
                return False
            try:
                self.command, self.path, self.request_version = request_line(self.raw_requestline)
                self.headers = read_headers(self.rfile, self.request_version)  # type: ignore[assignment]
            except BadRequest as error:
                self.wfile.write(refusal(error))
                return False
            if self.path.startswith("//"):
                self.path = "/" + self.path.lstrip("/")
            connection = str(self.headers.get("Connection", "")).lower()
            self.close_connection = connection == "close" or (
                self.request_version == "HTTP/1.0" and connection != "keep-alive"
            )
            expect = str(self.headers.get("Expect", "")).lower()
            if expect == "100-continue" and self.request_version == "HTTP/1.1":
                return self.handle_expect_100()
            return True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if api.down:
                self.close_connection = True
                self.connection.shutdown(2)  # reset: the client sees a dropped connection
                return
            with api.lock:
                api.requests.append((method, url.path))
                api.queries.append((method, url.path, query))
            fault = api._fault_for(method, url.path)
            if fault and fault.kind == "timeout":
                time.sleep(api.timeout_s)
            elif fault and fault.kind == "500":
                return self._send(500, status_body(500, "InternalError", "injected fault"))
            elif fault and fault.kind == "409":
                return self._send(409, status_body(409, "Conflict", "injected conflict"))
            elif fault and fault.kind == "404":  # a kind or API an older server lacks
                message = f"the server could not find the requested resource {url.path}"
                return self._send(404, status_body(404, "NotFound", message))
            elif fault and fault.kind == "429":  # API priority and fairness: come back later
                body = status_body(429, "TooManyRequests", "too many requests, retry later")
                return self._send(429, body, {"Retry-After": "1"})
            try:
                body = json.loads(raw) if raw else None
                self._authorize(method, url.path, query, body)
                result = self._route(method, url.path, query, body)
                if method != "GET":
                    api.after_change()
            except ApiError as err:
                return self._send(err.code, err.body)
            if result is not None:
                code, payload = result
                self._send(code, payload)

        def _send(self, code: int, payload: Any, headers: dict | None = None) -> None:
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            ctype = "text/plain" if isinstance(payload, str) else "application/json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            # The head and the body in one write, as Go's server sends a small answer (two
            # writes are two segments with TCP_NODELAY, and two reads for the client).
            self._headers_buffer.extend((b"\r\n", data))
            self.flush_headers()

        def _route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any] | None:
            for pattern, name in ROUTES:
                match = pattern.match(path)
                if match:
                    return getattr(self, f"_{name}")(
                        method, *match.groups(), query=query, body=body
                    )
            # The kinds of GPUPool's own manifests (deploy/): tests/clusters/fake_generic.py.
            generic = generic_route(
                api, method, path, query, body, self.headers.get("Content-Type")
            )
            if generic is not None:
                return generic
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource {path}"
            )

        def _authorize(self, method: str, path: str, query: dict, body: Any) -> None:
            """RBAC: with rules set (the user's ClusterRoleBinding), a request that neither
            they nor the RoleBindings of the request's namespace allow is 403 Forbidden; a
            RoleBinding's create must not grant more than the user holds there, unless the
            user may `bind` its role."""
            attributes = request_attributes(method, path, query)
            if attributes is None or api.rbac_rules is None:
                return
            verb, group, resource, ns, name = attributes
            if (verb, group, resource) in EVERYONE_MAY:
                return
            with api.lock:
                rules = api.rbac_rules + bound_rules(api.objects, api.rbac_user, ns)
                if not rbac_allows(rules, verb, group, resource, name):
                    api.denied.append((verb, resource, ns))
                    message = rbac_forbidden(api.rbac_user, verb, group, resource, ns, name)
                    raise ApiError(403, "Forbidden", message)
                if (verb, group, resource) == ("create", RBAC_GROUP, "rolebindings"):
                    self._no_escalation(rules, ns, body if isinstance(body, dict) else {})
                api.allowed.add((verb, group, resource))

        def _no_escalation(self, rules: list[dict], ns: str, binding: dict) -> None:
            """A RoleBinding is made by a user who may `bind` its role, or who holds all
            it grants (the real RBAC storage's escalation check)."""
            ref = binding.get("roleRef") or {}
            plural = role_plural(ref)
            if rbac_allows(rules, "bind", RBAC_GROUP, plural, str(ref.get("name", ""))):
                api.allowed.add(("bind", RBAC_GROUP, plural))
                return
            refused = escalation_refusal(api.objects, rules, api.rbac_user, ns, binding)
            if refused is not None:
                api.denied.append(("bind", plural, ns))
                raise ApiError(*refused)

        def _self_review(self, method: str, *, query: dict, body: Any) -> tuple[int, Any]:
            """Who the request's credentials are (kubectl auth whoami), for any user."""
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            user = {"username": api.rbac_user, "groups": user_groups(api.rbac_user)}
            return 201, {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "SelfSubjectReview",
                "metadata": {"creationTimestamp": _now()},
                "status": {"userInfo": user},
            }

        # --- handlers ---------------------------------------------------------------------
        def _version(self, method: str, *, query: dict, body: Any) -> tuple[int, Any]:
            return 200, {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0-gpupool-fake",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2024-08-13T07:28:49Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }

        def _collection(self, method: str, resource: str, *, query: dict, body: Any):
            if method == "POST" and resource in CLUSTER_SCOPED:
                return self._create(resource, "", body)
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", method)
            return self._list(resource, None, query)

        def _cluster_item(self, method: str, resource: str, name: str, *, query: dict, body: Any):
            if method == "GET":
                return 200, self._get(resource, "", name)
            if method == "DELETE":
                with api.lock:
                    self._get(resource, "", name)
                    if resource == "namespaces":  # the namespace controller empties it
                        for kind in ("pods", "services", "configmaps", "events"):
                            for key in [k for k in api.objects[kind] if k[0] == name]:
                                api._delete(kind, *key)
                    return 200, api._delete(resource, "", name)
            if method == "PATCH":
                return self._patch_metadata(resource, "", name, body or {})
            raise ApiError(405, "MethodNotAllowed", method)

        def _ns_collection(self, method: str, ns: str, resource: str, *, query: dict, body: Any):
            if method == "POST":  # dryRun=All: checked and admitted as a create, not stored
                return self._create(resource, ns, body, dry_run=query.get("dryRun") == "All")
            return self._list(resource, ns, query)

        def _ns_item(
            self, method: str, ns: str, resource: str, name: str, *, query: dict, body: Any
        ):
            if method == "GET":
                return 200, self._get(resource, ns, name)
            if method == "DELETE":
                return self._delete_item(resource, ns, name, query, body or {})
            if resource == "events" and method in ("PATCH", "PUT"):
                return self._update_event(method, ns, name, body or {})
            if resource == "pods" and method == "PATCH":
                return self._patch_pod(ns, name, body)
            if method == "PATCH":
                return self._patch_metadata(resource, ns, name, body or {})
            raise ApiError(405, "MethodNotAllowed", method)

        def _patch_pod(self, ns: str, name: str, body: Any):
            """A pod's PATCH (any of the three content types): labels, annotations and
            ownerReferences change as asked, spec only where the real server lets it
            (_check_pod_update), status never (its subresource's)."""
            with api.lock:
                pod = self._get("pods", ns, name, copy_=False)
                if isinstance(body, dict):
                    self._check_rv(pod, body)
                new = patched(pod, body, self.headers.get("Content-Type"))
                meta = dict(new.get("metadata") or {})  # the patch may share the stored one
                for field in ("labels", "annotations"):
                    _check_string_map(meta.get(field), field)
                _validate_annotations(meta.get("annotations") or {})
                _validate_owners(meta)
                _check_pod_update(name, pod["spec"], new.get("spec") or {})
                fixed = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
                for field in fixed:
                    meta.pop(field, None)
                meta.update({k: v for k, v in pod["metadata"].items() if k in fixed})
                pod["metadata"], pod["spec"] = meta, clone(new["spec"])
                return 200, clone(api._store("pods", ns, pod, "MODIFIED"))

        def _update_event(self, method: str, ns: str, name: str, body: dict):
            """An Event's update (a recorder bumps count and lastTimestamp): checked again
            as at create; the name, namespace and uid stay."""
            with api.lock:
                event = self._get("events", ns, name, copy_=False)
                if method == "PUT":
                    self._check_rv(event, body)
                    new = clone(body)
                else:
                    new = patched(event, body, self.headers.get("Content-Type"))
                keep = {
                    k: event["metadata"][k]
                    for k in ("name", "namespace", "uid", "creationTimestamp")
                }
                new["metadata"] = {**(new.get("metadata") or {}), **keep}
                new.update(apiVersion="v1", kind="Event")
                _validate_event(new, ns)
                return 200, clone(api._store("events", ns, new, "MODIFIED"))

        def _patch_metadata(self, resource: str, ns: str, name: str, body: dict):
            """A merge patch of labels and annotations (all GPUPool patches)."""
            with api.lock:
                obj = self._get(resource, ns, name, copy_=False)
                merged = clone(obj["metadata"])
                for field in ("labels", "annotations"):
                    patch = (body.get("metadata") or {}).get(field)
                    _check_string_map(patch, field)
                    if patch:
                        current = merged.setdefault(field, {})
                        current.update({k: v for k, v in patch.items() if v is not None})
                        for k in [k for k, v in patch.items() if v is None]:
                            current.pop(k, None)
                _validate_annotations(merged.get("annotations") or {})
                obj["metadata"] = merged  # all or nothing, as the real server
                if resource == "namespaces":  # the API server keeps it, whatever a patch says
                    obj["metadata"].setdefault("labels", {})[NAME_LABEL] = name
                return 200, clone(api._store(resource, ns, obj, "MODIFIED"))

        def _pod_sub(self, method: str, ns: str, name: str, sub: str, *, query: dict, body: Any):
            with api.lock:
                pod = self._get("pods", ns, name, copy_=False)
                if sub == "log":
                    self._check_log(pod, query)
                    return 200, api.logs.get((ns, name), "")
                if sub == "binding" and method == "POST":
                    return self._bind(pod, body or {})
                if sub == "eviction" and method == "POST":
                    return self._evict(pod, body or {})
                if sub == "status" and method in ("PUT", "PATCH"):
                    return self._write_status(method, pod, body or {})
                if sub == "status" and method == "GET":
                    return 200, clone(pod)
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on pods/{sub}")

        def _bind(self, pod: dict, body: dict) -> tuple[int, dict]:
            """BindingREST: the Binding names the pod; its target is a Node (one that does
            not exist is taken: only its kubelet would refuse); a pod being deleted, bound
            already or with scheduling gates is 409; the Binding's annotations are copied
            onto the pod, nominatedNodeName cleared, PodScheduled=True set."""
            name = pod["metadata"]["name"]
            if (body.get("metadata") or {}).get("name") != name:
                raise ApiError(
                    400, "BadRequest", "name in URL does not match name in Binding object"
                )
            target = body.get("target") or {}
            if target.get("kind") not in (None, "", "Node"):
                # Validation errors here are not StatusErrors: the real server answers 500.
                message = (
                    f'target.kind: Unsupported value: "{target["kind"]}": supported values: '
                    '"Node", "<empty>"'
                )
                raise ApiError(500, "InternalError", message)
            if not target.get("name"):
                raise ApiError(500, "InternalError", "target.name: Required value")
            conflict = f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    409, "Conflict", conflict + "is being deleted, cannot be assigned to a host"
                )
            if pod["spec"].get("nodeName"):
                node = pod["spec"]["nodeName"]
                raise ApiError(409, "Conflict", conflict + f'is already assigned to node "{node}"')
            if pod["spec"].get("schedulingGates"):
                raise ApiError(409, "Conflict", conflict + "has non-empty .spec.schedulingGates")
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            _check_string_map(annotations, "annotations")
            if annotations:
                pod["metadata"]["annotations"] = {
                    **(pod["metadata"].get("annotations") or {}),
                    **annotations,
                }
            pod["spec"]["nodeName"] = target["name"]
            pod.setdefault("status", {}).pop("nominatedNodeName", None)
            set_condition(pod["status"], "PodScheduled", "True")
            self._kubelet_start(pod)
            api._store("pods", pod["metadata"]["namespace"], pod, "MODIFIED")
            return 201, CREATED

        def _write_status(self, method: str, pod: dict, body: dict) -> tuple[int, dict]:
            """pods/status: only the status changes (the real status strategy keeps the
            stored spec and metadata, whatever the body says); a PUT names the pod and may
            carry a resourceVersion precondition; conditions are validated."""
            name = pod["metadata"]["name"]
            if method == "PUT":
                given = (body.get("metadata") or {}).get("name")
                if given != name:
                    message = (
                        f"the name of the object ({given}) does not match the name on the URL "
                        f"({name})"
                    )
                    raise ApiError(400, "BadRequest", message)
                self._check_rv(pod, body)
                status = clone(body.get("status") or {})
            else:
                self._check_rv(pod, body)
                status = patched(pod, body, self.headers.get("Content-Type")).get("status") or {}
            _validate_pod_conditions(status.get("conditions") or [])
            pod["status"] = status
            return 200, clone(api._store("pods", pod["metadata"]["namespace"], pod, "MODIFIED"))

        def _evict(self, pod: dict, body: dict) -> tuple[int, dict]:
            """EvictionREST: a policy/v1 (or v1beta1) Eviction naming the pod. A pod that is
            Pending, finished or being deleted goes at once; else the one
            PodDisruptionBudget that selects it (two: 500) must allow a disruption (none
            left: 429), and the eviction takes one (status.disruptedPods). Then the delete,
            with the Eviction's deleteOptions (its grace period)."""
            name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
            if body.get("kind") != "Eviction" or body.get("apiVersion") not in (
                "policy/v1",
                "policy/v1beta1",
            ):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"not a Eviction object: {body.get('apiVersion')}, {body.get('kind')}",
                )
            if (body.get("metadata") or {}).get("name") != name:
                raise ApiError(
                    400, "BadRequest", "name in URL does not match name in Eviction object"
                )
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Running", "Unknown") and not pod["metadata"].get("deletionTimestamp"):
                refusal = take_disruption(api, pod)
                if refusal:
                    return refusal
            options = body.get("deleteOptions") or {}
            self._delete_item("pods", ns, name, {}, options)
            return 201, CREATED

        def _check_log(self, pod: dict, query: dict) -> None:
            """A log is of one container of the pod, which must have started: 400 else."""
            name = pod["metadata"]["name"]
            containers = [c["name"] for c in pod["spec"]["containers"]]
            container = query.get("container")
            if not container:
                if len(containers) != 1:
                    raise ApiError(
                        400,
                        "BadRequest",
                        f"a container name must be specified for pod {name}, "
                        f"choose one of: [{' '.join(containers)}]",
                    )
                container = containers[0]
            if container not in containers:
                raise ApiError(
                    400, "BadRequest", f"container {container} is not valid for pod {name}"
                )
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                state = status.get("state") or {}
                if status.get("name") == container and (
                    "running" in state or "terminated" in state
                ):
                    return
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )

        # --- semantics ----------------------------------------------------------------------
        def _get(self, resource: str, ns: str, name: str, *, copy_: bool = True) -> dict:
            with api.lock:
                obj = api.objects[resource].get((ns, name))
                if obj is None:
                    kind = resource.rstrip("s")
                    raise ApiError(404, "NotFound", f'{resource} "{name}" not found ({kind})')
                return clone(obj) if copy_ else obj

        def _check_rv(self, obj: dict, body: dict) -> None:
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != obj["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )

        def _create(self, resource: str, ns: str, body: dict, *, dry_run: bool = False):
            with api.lock:
                body = {**body, "metadata": dict(body.get("metadata") or {})}
                name = body["metadata"].get("name") or api.generate_name(body["metadata"])
                body["metadata"]["name"] = name
                if ns and ("", ns) not in api.objects["namespaces"]:
                    raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
                if (ns, name) in api.objects[resource]:
                    raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
                if resource == "namespaces" and name in api.forbidden_namespaces:
                    raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden')
                obj = clone(body)
                obj.setdefault("apiVersion", API_VERSIONS.get(resource, "v1"))
                obj["kind"] = KINDS[resource]
                meta = obj["metadata"]
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
                _validate_owners(meta)
                _check_string_map(meta.get("annotations"), "annotations")
                _validate_annotations(meta.get("annotations") or {})
                if ns:
                    meta["namespace"] = ns
                if resource == "configmaps":
                    _validate_config_map(obj)
                if resource == "events":
                    _validate_event(obj, ns)
                if resource == "pods":
                    self._admit_pod(obj, ns, dry_run=dry_run)
                    if obj["spec"].get("nodeName") and not dry_run:
                        self._kubelet_start(obj)
                if resource == "namespaces":
                    meta["labels"] = {**(meta.get("labels") or {}), NAME_LABEL: name}
                    obj["spec"] = {"finalizers": ["kubernetes"]}
                    obj["status"] = {"phase": "Active"}
                if resource == "priorityclasses":
                    _validate_priority_class(obj)
                if resource == "services":
                    in_use = {
                        p["nodePort"]
                        for svc in api.objects["services"].values()
                        for p in svc["spec"].get("ports") or []
                        if p.get("nodePort")
                    }
                    _validate_service(obj, in_use)
                if resource == "services" and obj["spec"].get("clusterIP") != "None":
                    count = len(api.objects["services"])
                    obj["spec"]["clusterIP"] = f"10.96.{count // 250}.{count % 250 + 1}"
                stored = obj if dry_run else self._stored(resource, ns, obj)
                return 201, clone(stored)

        def _stored(self, resource: str, ns: str, obj: dict) -> dict:
            stored = api._store(resource, ns, obj, "ADDED")
            if resource == "configmaps":
                self._kubelet_retry(ns)
            return stored

        def _kubelet_retry(self, ns: str) -> None:
            """The kubelet tries again to make the containers it could not make for want
            of a ConfigMap (its volume, or its envFrom): one made since, they start."""
            for (pod_ns, _), pod in list(api.objects["pods"].items()):
                statuses = (pod.get("status") or {}).get("containerStatuses") or []
                waits = [(c.get("state") or {}).get("waiting") or {} for c in statuses]
                for_config = any(str(w.get("message", "")).startswith("configmap ") for w in waits)
                if (
                    pod_ns != ns
                    or not pod["spec"].get("nodeName")
                    or pod["metadata"].get("deletionTimestamp")
                ):
                    continue
                if for_config:
                    self._kubelet_start(pod)
                    if pod["status"].get("phase") != "Pending":
                        api._store("pods", ns, pod, "MODIFIED")

        def _admit_pod(self, pod: dict, ns: str, *, dry_run: bool = False) -> None:
            """Priority (the class must exist), defaults, mutating webhooks, validation,
            then Pod Security and validating webhooks."""
            name = pod["metadata"].get("name", "")
            wanted = pod["spec"].get("priorityClassName")
            if wanted:
                klass = api.objects["priorityclasses"].get(("", wanted))
                if klass is None:
                    message = (
                        f'pods "{name}" is forbidden: no PriorityClass with name {wanted} was found'
                    )
                    raise ApiError(403, "Forbidden", message)
                pod["spec"]["priority"] = klass["value"]
            for field, value in POD_DEFAULTS.items():  # the real server's defaulting
                pod["spec"].setdefault(field, value)
            mutate_pod(api, pod, ns, dry_run=dry_run)
            _validate_pod(pod)
            labels = api.objects["namespaces"][("", ns)]["metadata"].get("labels") or {}
            refusal = pod_security_violation(pod, labels, api.pod_security_default)
            if refusal:
                raise ApiError(403, "Forbidden", refusal)
            for webhook, check in sorted(api.webhooks.items()):
                if (why := check(pod)) is not None:
                    message = f'admission webhook "{webhook}" denied the request: {why}'
                    raise ApiError(403, "Forbidden", message)
            pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod["spec"])}

        def _kubelet_start(self, pod: dict) -> None:
            node = pod["spec"]["nodeName"]
            if ("", node) not in api.objects["nodes"] or not api.auto_run:
                return
            missing = [
                v["configMap"]["name"]
                for v in pod["spec"].get("volumes") or []
                if "configMap" in v
                and not v["configMap"].get("optional")
                and (pod["metadata"]["namespace"], v["configMap"]["name"])
                not in api.objects["configmaps"]
            ]
            unset = _missing_env_from(pod, api.objects["configmaps"])
            sub_paths, no_value = _sub_paths(pod, api.objects["configmaps"])
            if missing or unset or no_value:  # no volume, environment or subPath: it waits
                waiting = {
                    "reason": "ContainerCreating" if missing else "CreateContainerConfigError",
                    "message": f'configmap "{(missing or unset)[0]}" not found'
                    if missing or unset
                    else f"missing value for {', '.join(sorted(set(no_value)))}",
                }
                pod["status"]["containerStatuses"] = [
                    {
                        "name": c["name"],
                        "ready": False,
                        "restartCount": 0,
                        "image": c.get("image", ""),
                        "imageID": "",
                        "state": {"waiting": waiting},
                    }
                    for c in pod["spec"]["containers"]
                ]
                return
            if not api._allocate_devices(pod):
                pod["status"] = {
                    "phase": "Failed",
                    "reason": "UnexpectedAdmissionError",
                    "message": f"Allocate failed: not enough {GPU} on {node}",
                }
                return
            api.sub_paths[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = sub_paths
            pod["status"] = {
                **pod.get("status", {}),
                "phase": "Running",
                "hostIP": "10.0.0.1",
                "podIP": f"10.244.0.{api.last_rv % 250 + 1}",
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "ready": True,
                        "restartCount": 0,
                        "image": container.get("image", ""),
                        "imageID": "",
                        "state": {"running": {"startedAt": _now()}},
                    }
                    for container in pod["spec"]["containers"]
                ],
            }
            kubelet_conditions(pod["status"], running=True)

        def _delete_item(self, resource: str, ns: str, name: str, query: dict, body: dict):
            """A pod's delete answers with the pod marked for deletion, as the real
            registry does: deletionTimestamp (now + grace) and deletionGracePeriodSeconds.
            Grace 0, a pod that never got a node, or one already finished, is removed at once
            and still answered so, with deletionGracePeriodSeconds 0; a later read is 404."""
            with api.lock:
                obj = self._get(resource, ns, name, copy_=False)
                if resource != "pods":
                    return 200, clone(api._delete(resource, ns, name))
                seconds = _delete_grace(
                    obj, query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
                )
                meta = obj["metadata"]
                if api.deferred_delete and seconds and meta.get("deletionTimestamp"):
                    return 200, clone(obj)  # pending already: kept, unless grace 0
                meta["deletionTimestamp"] = _now(seconds)
                meta["deletionGracePeriodSeconds"] = seconds
                if api.deferred_delete and seconds:
                    api._store(resource, ns, obj, "MODIFIED")
                    return 200, clone(obj)
                return 200, clone(api._delete(resource, ns, name))

        def _list(self, resource: str, ns: str | None, query: dict):
            fields = _field_terms(resource, query.get("fieldSelector"))
            if str(query.get("watch", "")).lower() in ("true", "1"):
                self._watch(resource, ns, query, fields)
                return None
            with api.lock:
                api.list_calls[resource] += 1
                items = [
                    clone(obj)
                    for (obj_ns, _), obj in sorted(api.objects[resource].items())
                    if (ns is None or obj_ns == ns)
                    and _matches(query.get("labelSelector"), obj["metadata"].get("labels") or {})
                    and _fields_match(fields, obj)
                ]
                rv = str(api.last_rv)
            kind = KINDS[resource] + "List"
            return 200, {
                "kind": kind,
                "apiVersion": API_VERSIONS.get(resource, "v1"),
                "metadata": {"resourceVersion": rv},
                "items": items,
            }

        def _watch(self, resource: str, ns: str | None, query: dict, fields: list) -> None:
            """Stream events after resourceVersion as JSON lines until timeoutSeconds, as
            the API server's watch cache does:
            - no resourceVersion, or "0": synthetic ADDED events for what exists, then
              changes; a version: changes after it (exclusive);
            - a version older than the event window: an ERROR event with 410 Expired; one
              newer than the server's: an ERROR event with 504 (too large);
            - allowWatchBookmarks: BOOKMARK events (only a resourceVersion) every
              `bookmark_interval_s` and just before the timeout ends the watch;
            - a watcher the window left behind (its events were dropped before they were
              sent), or a server that goes down, has its stream cut."""
            timeout = _bounded_int(query, "timeoutSeconds", api.default_watch_timeout_s)
            bookmarks = str(query.get("allowWatchBookmarks", "")).lower() in ("true", "1")
            since = _version(query.get("resourceVersion"))
            deadline = time.monotonic() + timeout
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def visible(obj: dict) -> bool:
                meta = obj["metadata"]
                return (
                    (ns is None or meta.get("namespace") == ns)
                    and _matches(query.get("labelSelector"), meta.get("labels") or {})
                    and _fields_match(fields, obj)
                )

            start = self._watch_start(resource, since, timeout)
            if start is None:
                return
            since, initial = start
            for obj in initial:
                if visible(obj):
                    self._chunk({"type": "ADDED", "object": obj})
            if self._watch_stream(resource, since, deadline, bookmarks, visible):
                self._chunk(None)

        def _watch_start(
            self, resource: str, since: int | None, timeout: int
        ) -> tuple[int, list[dict]] | None:
            """Where the watch starts, and the synthetic ADDED objects it begins with;
            None once an ERROR event ended it."""
            with api.lock:
                oldest = api.history[0][0] if api.history else api.last_rv + 1
                current = api.last_rv
                if since in (None, 0):
                    return current, [clone(o) for o in api.objects[resource].values()]
                if since < oldest - 1 and since < current:
                    message = f"too old resource version: {since} ({oldest - 1})"
                    return self._error(410, "Expired", message)
                if since <= current:
                    return since, []
            time.sleep(min(timeout, api.too_large_wait_s))  # the cache waits to catch up
            with api.lock:
                if since > api.last_rv:
                    message = f"Too large resource version: {since}, current: {current}"
                    return self._error(504, "Timeout", message)
            return since, []

        def _error(self, code: int, reason: str, message: str) -> None:
            self._chunk({"type": "ERROR", "object": status_body(code, reason, message)})
            self._chunk(None)

        def _watch_stream(
            self,
            resource: str,
            since: int,
            deadline: float,
            bookmarks: bool,
            visible: Any,
        ) -> bool:
            """Send events after `since` until the deadline; False when the stream was
            cut (a server going down, a watcher the window left behind)."""
            next_bookmark = time.monotonic() + api.bookmark_interval_s
            while True:
                now = time.monotonic()
                with api.lock:
                    if api.down:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return False
                    start = bisect.bisect_right(api.history, since, key=lambda e: e[0])
                    if start == 0 and api.history and api.history[0][0] > since + 1:
                        # Events this watcher had not been sent left the window: the real
                        # server closes such a watch; the client resumes and gets 410.
                        self.close_connection = True
                        self._chunk(None)
                        return False
                    fresh = api.history[start:]
                    if not fresh and now < deadline:
                        wake = min(deadline, next_bookmark) if bookmarks else deadline
                        api.changed.wait(timeout=max(0.0, min(0.2, wake - now)))
                for rv, kind_of, kind, obj in fresh:
                    since = rv
                    seen = _seen_as(kind, obj, api.before.get(rv), visible)
                    if kind_of == resource and seen:
                        self._chunk({"type": seen, "object": obj})
                last_call = now >= deadline - api.bookmark_lead_s
                if bookmarks and (now >= next_bookmark or last_call):
                    self._bookmark(resource, since)
                    # After the one shortly before the end, none until the end.
                    next_bookmark = deadline + 1 if last_call else now + api.bookmark_interval_s
                if now >= deadline:
                    return True

        def _bookmark(self, resource: str, version: int) -> None:
            obj = {"kind": KINDS[resource], "apiVersion": "v1"}
            obj["metadata"] = {"resourceVersion": str(version)}
            self._chunk({"type": "BOOKMARK", "object": obj})

        def _chunk(self, event: dict | None) -> None:
            data = b"" if event is None else (json.dumps(event) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def serve_in_process(
    stack: Any, nodes: int, gpus: int, window: int | None = None, *, job_controller: bool = False
) -> dict:
    """Start `main()` in a child process (closed when `stack`, an ExitStack, unwinds) and
    return a kubeconfig for it: what the `bench_*` commands measure against."""
    args = [sys.executable, "-m", "tests.clusters.fake_apiserver", str(nodes), str(gpus)]
    if window is not None:
        args.append(str(window))
    if job_controller:
        args.append("--job-controller")
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stack.callback(server.wait, 30)
    stack.callback(server.stdin.close)
    return kubeconfig_for(server.stdout.readline().strip())


def main() -> None:
    """`python -m tests.clusters.fake_apiserver NODES GPUS [WINDOW] [--job-controller]`: serve
    in its own process (so a benchmark's client does not share a GIL with it), print the URL,
    stop at EOF."""
    argv = [a for a in sys.argv[1:] if a != "--job-controller"]
    nodes, gpus = int(argv[0]), int(argv[1])
    with FakeApiServer(job_controller="--job-controller" in sys.argv) as api:
        if len(argv) > 2:  # events kept for watches (a real server keeps minutes' worth)
            api.event_window = int(argv[2])
        for i in range(nodes):
            api.add_node(f"bench-{i}", gpus=gpus, labels={"gpupool.io/node-pool": "bench"})
        print(api.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    # Served by the module under its package name: fake_generic raises that module's
    # ApiError (a 409, a 422), which __main__'s handler would not catch as its own.
    from tests.clusters import fake_apiserver  # noqa: PLW0406 - __main__ is another module

    fake_apiserver.main()
