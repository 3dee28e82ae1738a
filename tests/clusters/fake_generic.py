"""More kinds for the fake API server: what GPUPool's own manifests (deploy/) create.

ConfigMaps, Secrets, ServiceAccounts; Deployments, DaemonSets, StatefulSets, ReplicaSets
(apps/v1); Jobs, CronJobs (batch/v1); Roles, RoleBindings, ClusterRoles, ClusterRoleBindings
(rbac/v1); PriorityClasses (scheduling/v1); NetworkPolicies and Ingresses (networking/v1);
PodDisruptionBudgets (policy/v1): create (also `dryRun=All`: checked, not stored), get, list
(label selectors), delete, over the real REST paths. Like the real API server it refuses a
kind or namespace that does not match the URL, a missing or badly formed name or label, an
unknown namespace, a duplicate, a workload whose selector does not match its pod template, a
pod template the server would refuse, a restart policy its controller cannot run, an invalid
ConfigMap or Secret key, a ServiceAccount subject without a namespace; and it adds what the
real one adds: uid, creationTimestamp, resourceVersion, the generation and initial status of
workloads and budgets, a Secret's stringData folded into base64 data, a Job's defaults, pod
labels and selector on its uid. PATCH (merge or strategic merge) keeps a Job's selector and
template immutable.

Controllers: the Job controller (`sync_jobs`, when the server's `job_controller` is on) makes
a Job's pods from its template, replaces those deleted or failed, suspends and resumes,
and keeps status and conditions (Complete, Failed with BackoffLimitExceeded, Suspended) as
the real one; the disruption arithmetic of PodDisruptionBudgets (`budget_status`,
`take_disruption`) answers the Eviction API. No other controller runs: a Deployment makes
no pods.

Custom resources (`CUSTOM_KINDS`: JobSets, Kubeflow's training jobs, RayClusters, RayJobs,
LeaderWorkerSets) are served once a test installs their CRDs (`api.install_crds`), as the
apiextensions server does: 404 without details before; the kind named in the body (400),
the schema's required fields and types (422, on create and patch), a generation, no status
from a create, merge patches only (a strategic merge is 415). No operator runs: tests make
the objects their controllers would.
"""

from __future__ import annotations

import base64
import copy
import json
import marshal
import re
import uuid
from collections import Counter
from typing import Any, NoReturn

RBAC = "rbac.authorization.k8s.io/v1"
# (apiVersion, plural) -> (kind, namespaced)
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "configmaps"): ("ConfigMap", True),
    ("v1", "secrets"): ("Secret", True),
    ("v1", "serviceaccounts"): ("ServiceAccount", True),
    ("apps/v1", "deployments"): ("Deployment", True),
    ("apps/v1", "daemonsets"): ("DaemonSet", True),
    ("apps/v1", "statefulsets"): ("StatefulSet", True),
    ("apps/v1", "replicasets"): ("ReplicaSet", True),
    ("batch/v1", "jobs"): ("Job", True),
    ("batch/v1", "cronjobs"): ("CronJob", True),
    (RBAC, "roles"): ("Role", True),
    (RBAC, "rolebindings"): ("RoleBinding", True),
    (RBAC, "clusterroles"): ("ClusterRole", False),
    (RBAC, "clusterrolebindings"): ("ClusterRoleBinding", False),
    ("scheduling.k8s.io/v1", "priorityclasses"): ("PriorityClass", False),
    ("networking.k8s.io/v1", "networkpolicies"): ("NetworkPolicy", True),
    ("networking.k8s.io/v1", "ingresses"): ("Ingress", True),
    ("policy/v1", "poddisruptionbudgets"): ("PodDisruptionBudget", True),
    # Called on pod creates by the server (fake_admission.py).
    ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"): (
        "MutatingWebhookConfiguration",
        False,
    ),
}
# The status a new object gets before its controller acts (the required fields at zero).
INITIAL_STATUS = {
    "Deployment": {},
    "DaemonSet": {
        "currentNumberScheduled": 0,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 0,
        "numberReady": 0,
    },
    "StatefulSet": {"replicas": 0, "availableReplicas": 0},
    "ReplicaSet": {"replicas": 0},
    "Job": {},
    "CronJob": {},
    "PodDisruptionBudget": {
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "disruptionsAllowed": 0,
        "expectedPods": 0,
    },
}
PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$"
)
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DATA_KEY = re.compile(r"[-._a-zA-Z0-9]+")
USER_PRIORITY_MAX = 1_000_000_000


def clone(document: Any) -> Any:
    """A deep copy of a JSON document (what the fake server stores, keeps for watches and
    answers): marshal's round trip, about four times cheaper than copy.deepcopy for a pod
    and the same result for dicts, lists, strings, numbers, booleans and None (shared
    parts stay shared, as with deepcopy); anything else falls back to deepcopy."""
    try:
        return marshal.loads(marshal.dumps(document))
    except ValueError:  # a type marshal does not write (a dict subclass, an object)
        return copy.deepcopy(document)


def generic_route(
    api: Any, method: str, path: str, query: dict, body: Any, content_type: str | None = None
):
    """(code, payload) for a path of a kind above, or None to let the caller answer 404."""
    match = PATH.match(path)
    parts = match.groupdict() if match else {}
    api_version = "v1" if parts.get("core") else f"{parts.get('group')}/{parts.get('version')}"
    resource = (api_version, parts.get("resource", ""))
    kind, namespaced = KINDS.get(resource, ("", False))
    if resource in api.crds:  # a custom resource of a CRD the cluster has installed
        kind, namespaced = CUSTOM_KINDS[resource][0], True
    ns, name = parts.get("ns") or "", parts.get("name")
    if not kind or (ns and not namespaced):  # unknown, or a cluster-scoped kind in a namespace
        return None
    store = f"{api_version}/{parts['resource']}"
    with api.lock:
        api.objects.setdefault(store, {})
        if (method, name is None) == ("POST", True):
            dry_run = _dry_run(query)
            _check_custom(resource, body or {}, api_version, kind, creating=True)
            return _create(api, store, api_version, kind, namespaced, ns, body or {}, dry_run)
        if (method, name is None) == ("GET", True):
            return _list(api, store, api_version, kind, ns, query)
        obj = _get(api, store, ns, name or "", parts["resource"])
        item_methods = {
            "GET": lambda: (200, clone(obj)),
            "DELETE": lambda: (200, clone(api._delete(store, ns, obj["metadata"]["name"]))),
            "PATCH": lambda: _patch(api, store, obj, body, content_type, resource),
        }
        if method in item_methods:
            return item_methods[method]()
    return _error(405, "MethodNotAllowed", f"{method} is not supported on {path}")


UNKNOWN_PATCH = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
)
IMMUTABLE = {"Job": ("selector", "template", "completions", "completionMode")}


def _patch(api: Any, store: str, obj: dict, body: Any, content_type: str | None, resource: tuple):
    """A merge or strategic-merge patch of labels, annotations and spec (a Job's suspend,
    parallelism); status is the status subresource's. A kind's immutable fields stay, or
    422; a changed spec is a new generation. A custom resource takes no strategic merge
    (415, as the real server: it has no patch strategy for unknown types) and is checked
    against its schema again."""
    from tests.clusters.fake_apiserver import patched

    if resource in CUSTOM_KINDS and "strategic-merge-patch" in (content_type or ""):
        _error(415, "UnsupportedMediaType", UNKNOWN_PATCH)
    new = patched(obj, body, content_type)
    if resource in CUSTOM_KINDS:
        _check_custom(resource, new, obj["apiVersion"], obj["kind"], creating=False)
    meta = new.get("metadata") or {}
    _check_labels(meta.get("labels") or {})
    kind = obj["kind"]
    for field in IMMUTABLE.get(kind, ()):
        if (new.get("spec") or {}).get(field) != obj["spec"].get(field):
            _error(422, "Invalid", f"spec.{field}: Invalid value: field is immutable")
    keep = ("name", "namespace", "uid", "creationTimestamp", "generation")
    new["metadata"] = {**meta, **{k: obj["metadata"][k] for k in keep if k in obj["metadata"]}}
    new.pop("status", None)
    if "status" in obj:
        new["status"] = obj["status"]
    if new.get("spec") != obj.get("spec") and "generation" in obj["metadata"]:
        new["metadata"]["generation"] = obj["metadata"]["generation"] + 1
    ns = obj["metadata"].get("namespace", "")
    return 200, clone(api._store(store, ns, new, "MODIFIED"))


def _error(code: int, reason: str, message: str) -> NoReturn:
    from tests.clusters.fake_apiserver import ApiError  # they import us

    raise ApiError(code, reason, message)


def _get(api: Any, store: str, ns: str, name: str, resource: str) -> dict:
    """The object; else 404 whose details name it, its group and resource, as the real
    server's (a resource the server does not have is a 404 without details)."""
    from tests.clusters.fake_apiserver import ApiError

    obj = api.objects[store].get((ns, name))
    if obj is None:
        group = store.rpartition("/")[0].rpartition("/")[0] if store.count("/") > 1 else ""
        err = ApiError(404, "NotFound", f'{resource} "{name}" not found')
        err.body["details"] = {"name": name, "group": group, "kind": resource}
        raise err
    return obj


def _list(api: Any, store: str, api_version: str, kind: str, ns: str, query: dict):
    from tests.clusters.fake_apiserver import _matches

    items = [
        clone(obj)
        for (obj_ns, _), obj in sorted(api.objects[store].items())
        if (not ns or obj_ns == ns)
        and _matches(query.get("labelSelector"), obj["metadata"].get("labels") or {})
    ]
    meta = {"resourceVersion": str(api.last_rv)}
    return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}


def _dry_run(query: dict) -> bool:
    """dryRun=All: checked as a create (a name taken is 409 too), not stored; any other
    value is 422, as the real server's (apiserver handlers/create.go: ValidateCreateOptions,
    an Invalid CreateOptions)."""
    value = query.get("dryRun")
    if value not in (None, "All"):
        message = f'dryRun: Unsupported value: []string{{"{value}"}}: supported values: "All"'
        _error(422, "Invalid", f'CreateOptions.meta.k8s.io "" is invalid: {message}')
    return value == "All"


def _create(
    api: Any,
    store: str,
    api_version: str,
    kind: str,
    namespaced: bool,
    ns: str,
    body: dict,
    dry_run: bool = False,
):
    """1. the object matches its URL; 2. its name and labels are valid; 3. its namespace
    exists and the name is free; 4. the kind's own checks; 5. stored with what the server
    adds (a dry run: answered as it would be stored, and not stored)."""
    # Left out, they are the URL's (the official client sends none); given, they must match.
    if (body.get("apiVersion") or api_version) != api_version or (body.get("kind") or kind) != kind:
        _error(400, "BadRequest", f"the object is not a {api_version} {kind}")
    meta = body.get("metadata") or {}
    if namespaced and not ns:
        _error(404, "NotFound", f"{kind} is namespaced: POST it to /namespaces/NAME/...")
    if meta.get("namespace") not in (None, ns):
        _error(400, "BadRequest", "the namespace of the object does not match the request's")
    name = meta.get("name") or ""
    _check_name(kind, name)
    _check_labels(meta.get("labels") or {})
    if ns and ("", ns) not in api.objects["namespaces"]:
        _error(404, "NotFound", f'namespaces "{ns}" not found')
    store_objects = api.objects[store]
    if (ns, name) in store_objects:
        _error(409, "AlreadyExists", f'{kind} "{name}" already exists')
    obj = {"apiVersion": api_version, "kind": kind, **clone(body)}
    CHECKS.get(kind, lambda _obj: None)(obj)
    meta = obj.setdefault("metadata", {})
    meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
    if ns:
        meta["namespace"] = ns
    if kind in INITIAL_STATUS:
        meta["generation"] = 1
        obj["status"] = dict(INITIAL_STATUS[kind])
    if (api_version, store.rpartition("/")[2]) in CUSTOM_KINDS:
        meta["generation"] = 1
        obj.pop("status", None)  # the status subresource's, not the create's
    if kind == "Job":
        _job_defaults(obj)
    if kind == "CronJob":
        for field, value in CRONJOB_DEFAULTS.items():
            obj["spec"].setdefault(field, value)
    if dry_run:
        return 201, obj
    return 201, clone(api._store(store, ns, obj, "ADDED"))


def _now() -> str:
    from tests.clusters.fake_apiserver import _now as now

    return now()


def _check_name(kind: str, name: str) -> None:
    if not name:
        _error(422, "Invalid", "metadata.name: Required value: name or generateName is required")
    if kind.startswith(("Cluster", "Role")) or kind == "RoleBinding":
        valid = name not in (".", "..") and "/" not in name and "%" not in name  # a path segment
    else:
        valid = len(name) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(name))
    if not valid:
        _error(422, "Invalid", f'metadata.name: Invalid value: "{name}"')


def _check_labels(labels: dict) -> None:
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        ok_key = (
            len(label) <= 63
            and LABEL_NAME.fullmatch(label)
            and (not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN.fullmatch(prefix)))
        )
        ok_value = isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value)
        if not (ok_key and ok_value):
            _error(422, "Invalid", f'metadata.labels: Invalid value: "{key}": "{value}"')


def _check_data_keys(obj: dict) -> None:
    for field in ("data", "stringData", "binaryData"):
        for key in obj.get(field) or {}:
            if len(key) > 253 or not DATA_KEY.fullmatch(key):
                _error(422, "Invalid", f'{field}[{key}]: Invalid value: "{key}"')


def _secret(obj: dict) -> None:
    """stringData is write-only: the server folds it into data, base64-encoded."""
    _check_data_keys(obj)
    data = obj.setdefault("data", {})
    for key, value in (obj.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    obj.setdefault("type", "Opaque")


def _workload(obj: dict) -> None:
    """The pod template must be a pod the server would take, with a restart policy the
    controller can run, and the selector must select it."""
    from tests.clusters.fake_apiserver import ApiError, _validate_pod

    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    policy = (template.get("spec") or {}).get("restartPolicy", "Always")
    allowed = ("OnFailure", "Never") if obj["kind"] == "Job" else ("Always",)
    if policy not in allowed:
        _error(422, "Invalid", f'spec.template.spec.restartPolicy: Unsupported value: "{policy}"')
    pod_spec = clone(template.get("spec") or {})
    for claim in spec.get("volumeClaimTemplates") or []:  # a StatefulSet's pods mount these
        name = (claim.get("metadata") or {}).get("name", "")
        pod_spec.setdefault("volumes", []).append(
            {"name": name, "persistentVolumeClaim": {"claimName": name}}
        )
    try:
        _validate_pod({"spec": pod_spec})
    except ApiError as err:
        _error(422, "Invalid", f"spec.template.{err.body['message']}")
    if obj["kind"] == "Job" and "selector" not in spec:  # the server picks one: _job_defaults
        return
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    if not selector:
        _error(422, "Invalid", "spec.selector: Required value")
    if any(labels.get(k) != v for k, v in selector.items()):
        _error(422, "Invalid", "spec.template.metadata.labels: `selector` does not match")
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate" and "rollingUpdate" in strategy:
        _error(422, "Forbidden", "spec.strategy.rollingUpdate: may not be specified for Recreate")


JOB_NAME, CONTROLLER_UID = "batch.kubernetes.io/job-name", "batch.kubernetes.io/controller-uid"


def _job_defaults(job: dict) -> None:
    """What the real server adds to a Job: its defaults, and (unless the selector is manual)
    the labels its pods get, old and new names, with a selector on its uid."""
    spec, meta = job["spec"], job["metadata"]
    spec.setdefault("parallelism", 1)
    if "completions" not in spec and spec["parallelism"] == 1:
        spec["completions"] = 1
    for field, value in JOB_DEFAULTS.items():
        spec.setdefault(field, value)
    if "selector" in spec:
        return
    labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
    for key, value in ((JOB_NAME, meta["name"]), (CONTROLLER_UID, meta["uid"])):
        labels.setdefault(key, value)
        labels.setdefault(key.removeprefix("batch.kubernetes.io/"), value)
    spec["selector"] = {"matchLabels": {CONTROLLER_UID: meta["uid"]}}


JOB_DEFAULTS = {
    "backoffLimit": 6,
    "completionMode": "NonIndexed",
    "suspend": False,
    "podReplacementPolicy": "TerminatingOrFailed",
}


def _rules(obj: dict) -> None:
    for index, rule in enumerate(obj.get("rules") or []):
        if not rule.get("verbs"):
            _error(422, "Invalid", f"rules[{index}].verbs: Required value")


def _binding(obj: dict) -> None:
    if not (obj.get("roleRef") or {}).get("name"):
        _error(422, "Invalid", "roleRef.name: Required value")
    for index, subject in enumerate(obj.get("subjects") or []):
        cluster_wide = obj["kind"] == "ClusterRoleBinding"
        if (
            cluster_wide
            and subject.get("kind") == "ServiceAccount"
            and not subject.get("namespace")
        ):
            _error(422, "Invalid", f"subjects[{index}].namespace: Required value")


def _webhooks(obj: dict) -> None:
    from tests.clusters.fake_admission import check_configuration

    check_configuration(obj)


def _priority_class(obj: dict) -> None:
    value = obj.get("value")
    if not isinstance(value, int) or value > USER_PRIORITY_MAX:
        _error(422, "Forbidden", f"value: must be no greater than {USER_PRIORITY_MAX}")
    if obj["metadata"]["name"].startswith("system-"):
        _error(422, "Forbidden", 'metadata.name: the prefix "system-" is reserved')


PATH_TYPES = ("Exact", "Prefix", "ImplementationSpecific")


def _ingress(obj: dict) -> None:
    """networking.k8s.io/v1 Ingress: hosts are DNS names (one leading wildcard label at
    most), every path has a pathType and starts with '/', and every backend names a
    Service and either a port number or a port name, never both."""
    spec = obj.get("spec") or {}
    klass = spec.get("ingressClassName")
    if klass is not None and not DNS_SUBDOMAIN.fullmatch(klass):
        _error(422, "Invalid", f'spec.ingressClassName: Invalid value: "{klass}"')
    rules = spec.get("rules") or []
    if not rules and not spec.get("defaultBackend"):
        _error(
            422,
            "Invalid",
            "spec: Invalid value: either `defaultBackend` or `rules` must be specified",
        )
    for index, rule in enumerate(rules):
        host = rule.get("host", "")
        if host and not (DNS_SUBDOMAIN.fullmatch(host.removeprefix("*.")) and len(host) <= 253):
            _error(422, "Invalid", f'spec.rules[{index}].host: Invalid value: "{host}"')
        paths = (rule.get("http") or {}).get("paths")
        if not paths:
            _error(422, "Invalid", f"spec.rules[{index}].http.paths: Required value")
        for number, item in enumerate(paths):
            where = f"spec.rules[{index}].http.paths[{number}]"
            if item.get("pathType") not in PATH_TYPES:
                _error(422, "Invalid", f"{where}.pathType: Unsupported value")
            if not str(item.get("path", "")).startswith("/"):
                _error(422, "Invalid", f"{where}.path: must be an absolute path")
            service = (item.get("backend") or {}).get("service") or {}
            port = service.get("port") or {}
            if not service.get("name"):
                _error(422, "Invalid", f"{where}.backend.service.name: Required value")
            if ("number" in port) == ("name" in port):
                _error(
                    422, "Invalid", f"{where}.backend.service.port: exactly one of name or number"
                )


CRONJOB_DEFAULTS = {
    "concurrencyPolicy": "Allow",
    "suspend": False,
    "successfulJobsHistoryLimit": 3,
    "failedJobsHistoryLimit": 1,
}


def _cron_job(obj: dict) -> None:
    """batch/v1 CronJob: a schedule, and a job template whose pods the server would take."""
    spec = obj.get("spec") or {}
    if not spec.get("schedule"):
        _error(422, "Invalid", "spec.schedule: Required value")
    job = {"kind": "Job", "spec": (spec.get("jobTemplate") or {}).get("spec") or {}}
    try:
        _workload(job)
    except Exception as err:  # the Job's message, under the CronJob's path
        body = getattr(err, "body", None)
        if body is None:
            raise
        _error(422, "Invalid", f"spec.jobTemplate.{body['message']}")


CHECKS = {
    "ConfigMap": _check_data_keys,
    "Secret": _secret,
    "Deployment": _workload,
    "DaemonSet": _workload,
    "StatefulSet": _workload,
    "ReplicaSet": _workload,
    "Job": _workload,
    "CronJob": _cron_job,
    "Role": _rules,
    "ClusterRole": _rules,
    "RoleBinding": _binding,
    "ClusterRoleBinding": _binding,
    "PriorityClass": _priority_class,
    "Ingress": _ingress,
    "MutatingWebhookConfiguration": lambda obj: _webhooks(obj),
}


# --- controllers: the Job controller and the disruption arithmetic of the Eviction API ------
JOBS, BUDGETS = "batch/v1/jobs", "policy/v1/poddisruptionbudgets"


def sync_jobs(api: Any, client: Any, uids: set[str] | None = None) -> bool:
    """One pass of the Job controller over every Job (or those with these uids); True
    when it wrote anything."""
    changed = False
    stored = api.objects.get(JOBS, {})
    jobs = stored.items()
    if uids is not None:  # only those (a write touches one Job: not every Job sorted, nor
        # scanned: a pod's write names its controller, most often no Job at all)
        keys = {api.job_keys[uid] for uid in uids if uid in api.job_keys}
        jobs = [(key, stored[key]) for key in keys if key in stored]
    for _, job in sorted(jobs):
        changed = _sync_job(api, client, job) or changed
    return changed


def _sync_job(api: Any, client: Any, job: dict) -> bool:
    """1. each of its pods is active until it succeeds or fails; one deleted (or being
       deleted) before it succeeded counts as failed (the real isPodFailed), unless the
       controller deleted it to suspend or stop the Job;
    2. a finished Job (Complete or Failed) is left alone; more failures than backoffLimit:
       Failed; enough successes: Complete;
    3. suspended: its active pods are deleted (Suspended=True); else pods are made up to
       min(parallelism, completions left), replacing terminating ones at once;
    4. status (active, ready, terminating, succeeded, failed, conditions) written if changed."""
    from tests.clusters.fake_apiserver import _now as now

    spec, status = job["spec"], clone(job.get("status") or {})
    if _condition_true(status, "Complete") or _condition_true(status, "Failed"):
        return False
    uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
    outcome, pods = _count_pods(api, uid, ns)
    active = [p for p in pods if outcome[p["metadata"]["uid"]] == "active"]
    tally = Counter(outcome.values())
    wrote = False
    if tally["Failed"] > spec["backoffLimit"]:
        wrote = _stop_pods(client, active, outcome, "stopped")
        _finish(
            status,
            ("FailureTarget", "Failed"),
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        )
    elif _succeeded(spec, tally["Succeeded"], active):
        _finish(
            status,
            ("SuccessCriteriaMet", "Complete"),
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        )
        status["completionTime"] = now()
    elif spec.get("suspend"):
        wrote = _stop_pods(client, active, outcome, "suspended")
        _job_condition(status, "Suspended", "True", "JobSuspended", "Job suspended")
    else:
        if _condition_true(status, "Suspended"):
            _job_condition(status, "Suspended", "False", "JobResumed", "Job resumed")
            status["startTime"] = now()
        status.setdefault("startTime", now())
        wrote = _make_pods(client, job, _wanted(spec, tally["Succeeded"]) - len(active))
    outcome, pods = _count_pods(api, uid, ns)
    status.update(_tallies(outcome, pods))
    if status != job.get("status"):
        job["status"] = status
        api._store(JOBS, ns, job, "MODIFIED")
        wrote = True
    return wrote


def _count_pods(api: Any, uid: str, ns: str) -> tuple[dict[str, str], list[dict]]:
    mine = sorted(key for key in api.controlled.get(uid, ()) if key[0] == ns)
    pods = [api.objects["pods"][key] for key in mine]
    outcome = api.job_pods.setdefault(uid, {})
    present = {p["metadata"]["uid"]: p for p in pods}
    for pod_uid in present:
        outcome.setdefault(pod_uid, "active")
    for pod_uid, seen in outcome.items():
        pod = present.get(pod_uid)
        phase = ((pod or {}).get("status") or {}).get("phase")
        if seen != "active":
            continue
        if phase in ("Succeeded", "Failed"):
            outcome[pod_uid] = phase
        elif pod is None or pod["metadata"].get("deletionTimestamp"):
            outcome[pod_uid] = "Failed"
    return outcome, pods


def _tallies(outcome: dict[str, str], pods: list[dict]) -> dict:
    active = [p for p in pods if outcome[p["metadata"]["uid"]] == "active"]
    tally = Counter(outcome.values())
    terminating = [
        p
        for p in pods
        if p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    return {
        "active": len(active),
        "ready": sum(1 for p in active if pod_ready(p)),
        "terminating": len(terminating),
        "succeeded": tally["Succeeded"],
        "failed": tally["Failed"],
    }


def controller_uid(pod: dict) -> str | None:
    owners = pod["metadata"].get("ownerReferences") or []
    return next((o.get("uid") for o in owners if o.get("controller")), None)


def _succeeded(spec: dict, succeeded: int, active: list[dict]) -> bool:
    if spec.get("completions") is None:  # a work queue: done when one succeeded and none runs
        return succeeded > 0 and not active
    return succeeded >= spec["completions"]


def _wanted(spec: dict, succeeded: int) -> int:
    if spec.get("completions") is None:
        return spec["parallelism"] if not succeeded else 0
    return min(spec["parallelism"], spec["completions"] - succeeded)


def _stop_pods(client: Any, pods: list[dict], outcome: dict[str, str], why: str) -> bool:
    for pod in pods:
        outcome[pod["metadata"]["uid"]] = why  # not a failure of the Job's
        client._delete_item("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], {}, {})
    return bool(pods)


def _make_pods(client: Any, job: dict, count: int) -> bool:
    """Pods from the template, named <job>-<5 characters>, controlled by the Job; a refusal
    (admission, quota) is a FailedCreate event on the Job, as the real controller's."""
    from tests.clusters.fake_apiserver import ApiError

    meta, template = job["metadata"], job["spec"]["template"]
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    for _ in range(max(0, count)):
        pod_meta = clone(template.get("metadata") or {})
        pod_meta.update(generateName=f"{meta['name']}-", ownerReferences=[owner])
        body = {"metadata": pod_meta, "spec": clone(template.get("spec") or {})}
        try:
            client._create("pods", meta["namespace"], body)
        except ApiError as err:
            _job_event(client, job, "FailedCreate", f"Error creating: {err.body['message']}")
            return False
    return count > 0


def _job_event(client: Any, job: dict, reason: str, message: str) -> None:
    from tests.clusters.fake_apiserver import _now as now

    meta = job["metadata"]
    involved = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
    }
    event = {
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": 1,
        "firstTimestamp": now(),
        "lastTimestamp": now(),
        "source": {"component": "job-controller"},
    }
    client._create("events", meta["namespace"], event)


def _condition_true(status: dict, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in status.get("conditions") or [])


def _job_condition(status: dict, kind: str, value: str, reason: str, message: str) -> None:
    from tests.clusters.fake_apiserver import set_condition

    set_condition(status, kind, value, reason=reason, message=message)


def _finish(status: dict, kinds: tuple[str, str], reason: str, message: str) -> None:
    """Kubernetes 1.31+: the interim condition (SuccessCriteriaMet, FailureTarget), then the
    final one, both with the same reason."""
    for kind in kinds:
        _job_condition(status, kind, "True", reason, message)


def pod_ready(pod: dict) -> bool:
    """Ready: its Ready condition, else (the fake's kubelet sets none) every container."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    containers = status.get("containerStatuses") or []
    return (
        status.get("phase") == "Running"
        and bool(containers)
        and all(c.get("ready") for c in containers)
    )


def selects(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists,
    DoesNotExist); an absent selector selects nothing, {} everything (policy/v1)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for term in selector.get("matchExpressions") or []:
        key, op, values = term.get("key"), term.get("operator"), term.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(op, False)
        if not ok:
            return False
    return True


def budget_status(api: Any, budget: dict) -> dict:
    """The disruption controller's arithmetic, now: expected pods are those selected;
    healthy ones run ready and are not being deleted or just evicted; minAvailable (or
    expected less maxUnavailable) is the desired, a percentage rounded up."""
    ns, spec = budget["metadata"]["namespace"], budget["spec"]
    status = budget.get("status") or {}
    pods = [
        p
        for (pod_ns, _), p in api.objects["pods"].items()
        if pod_ns == ns and selects(spec.get("selector"), p["metadata"].get("labels") or {})
    ]
    names = {p["metadata"]["name"] for p in pods}
    disrupted = {k: v for k, v in (status.get("disruptedPods") or {}).items() if k in names}
    healthy = sum(
        1
        for p in pods
        if pod_ready(p)
        and not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["name"] not in disrupted
    )
    expected = len(pods)
    if "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected)
    return {
        **status,
        "observedGeneration": budget["metadata"].get("generation", 1),
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": max(0, healthy - desired),
        "disruptedPods": disrupted,
    }


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * total // 100)  # rounded up, as GetScaledValueFromIntOrPercent
    return int(value)


def take_disruption(api: Any, pod: dict) -> tuple[int, dict] | None:
    """The Eviction API's budget check for a running pod: None when it may go (the budget,
    if any, records it among disruptedPods), else the answer: 500 for two budgets, 429
    when none is left."""
    from tests.clusters.fake_apiserver import _now as now
    from tests.clusters.fake_apiserver import status_body

    meta = pod["metadata"]
    budgets = [
        b
        for (ns, _), b in sorted(api.objects.get(BUDGETS, {}).items())
        if ns == meta["namespace"] and selects(b["spec"].get("selector"), meta.get("labels") or {})
    ]
    if len(budgets) > 1:
        message = (
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support."
        )
        return 500, status_body(500, "InternalError", message)
    if not budgets:
        return None
    budget = budgets[0]
    status = budget_status(api, budget)
    if not pod_ready(pod) and status["currentHealthy"] >= status["desiredHealthy"] > 0:
        return None  # an unready pod whose budget is met anyway: no disruption to count
    if status["disruptionsAllowed"] == 0:
        body = status_body(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
        cause = (
            f"The disruption budget {budget['metadata']['name']} needs "
            f"{status['desiredHealthy']} healthy pods and has {status['currentHealthy']} currently"
        )
        body["details"] = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
        return 429, body
    status["disruptionsAllowed"] -= 1
    status["disruptedPods"] = {**status["disruptedPods"], meta["name"]: now()}
    budget["status"] = status
    api._store(BUDGETS, meta["namespace"], budget, "MODIFIED")
    return None


# --- custom resources: the kinds of the operators whose pods GPUPool schedules ------------
# Served only once a test installs their CRDs (`FakeApiServer.install_crds`): a cluster
# without one answers 404 without details, as a real one does. Each kind's check is what
# its CRD's structural schema refuses that GPUPool's code or tests could send: required
# fields and the types of the fields GPUPool reads or writes.
KUBEFLOW = "kubeflow.org/v1"
TYPE_NAMES = {bool: "boolean", int: "integer", str: "string", dict: "object", list: "array"}


def _schema_error(path: str, value: Any, wanted: type) -> NoReturn:
    got = TYPE_NAMES.get(type(value), "null")
    message = f'{path}: Invalid value: "{got}": {path} in body must be of type '
    _error(422, "Invalid", message + f'{TYPE_NAMES[wanted]}: "{got}"')


def _typed(obj: dict, field: str, wanted: type, path: str, *, required: bool = False) -> Any:
    """obj[field], which the schema types (bool is not an integer in JSON)."""
    if field not in obj:
        if required:
            _error(422, "Invalid", f"{path}: Required value")
        return None
    value = obj[field]
    if type(value) is not wanted:
        _schema_error(path, value, wanted)
    return value


def _replica_specs(field: str):
    """kubeflow.org/v1 training jobs: a map of replica type to spec; runPolicy.suspend."""

    def check(spec: dict) -> None:
        specs = _typed(spec, field, dict, f"spec.{field}", required=True)
        for role, replica in specs.items():
            _typed(replica or {}, "replicas", int, f"spec.{field}.{role}.replicas")
        run_policy = _typed(spec, "runPolicy", dict, "spec.runPolicy") or {}
        _typed(run_policy, "suspend", bool, "spec.runPolicy.suspend")

    return check


def _jobset(spec: dict) -> None:
    """jobset.x-k8s.io/v1alpha2: each replicated Job has a name and a Job template."""
    _typed(spec, "suspend", bool, "spec.suspend")
    jobs = _typed(spec, "replicatedJobs", list, "spec.replicatedJobs") or []
    for index, replicated in enumerate(jobs):
        path = f"spec.replicatedJobs[{index}]"
        _typed(replicated, "name", str, f"{path}.name", required=True)
        _typed(replicated, "template", dict, f"{path}.template", required=True)
        _typed(replicated, "replicas", int, f"{path}.replicas")


def _ray_cluster(spec: dict, path: str = "spec") -> None:
    """ray.io/v1 RayCluster: a head group; worker groups named, with whole replicas."""
    _typed(spec, "suspend", bool, f"{path}.suspend")
    _typed(spec, "headGroupSpec", dict, f"{path}.headGroupSpec", required=True)
    groups = _typed(spec, "workerGroupSpecs", list, f"{path}.workerGroupSpecs") or []
    for index, group in enumerate(groups):
        where = f"{path}.workerGroupSpecs[{index}]"
        _typed(group, "groupName", str, f"{where}.groupName", required=True)
        for field in ("replicas", "minReplicas", "maxReplicas"):
            _typed(group, field, int, f"{where}.{field}")


def _ray_job(spec: dict) -> None:
    """ray.io/v1 RayJob: the RayCluster it makes, if it makes one, is checked as one."""
    _typed(spec, "suspend", bool, "spec.suspend")
    if _typed(spec, "rayClusterSpec", dict, "spec.rayClusterSpec") is not None:
        _ray_cluster(spec["rayClusterSpec"], "spec.rayClusterSpec")


def _leader_worker_set(spec: dict) -> None:
    """leaderworkerset.x-k8s.io/v1: a template of a group's size (default 1)."""
    template = _typed(
        spec, "leaderWorkerTemplate", dict, "spec.leaderWorkerTemplate", required=True
    )
    _typed(template, "size", int, "spec.leaderWorkerTemplate.size")
    _typed(
        template, "workerTemplate", dict, "spec.leaderWorkerTemplate.workerTemplate", required=True
    )


CUSTOM_KINDS: dict[tuple[str, str], tuple[str, Any]] = {
    ("jobset.x-k8s.io/v1alpha2", "jobsets"): ("JobSet", _jobset),
    (KUBEFLOW, "pytorchjobs"): ("PyTorchJob", _replica_specs("pytorchReplicaSpecs")),
    (KUBEFLOW, "mpijobs"): ("MPIJob", _replica_specs("mpiReplicaSpecs")),
    (KUBEFLOW, "tfjobs"): ("TFJob", _replica_specs("tfReplicaSpecs")),
    (KUBEFLOW, "xgboostjobs"): ("XGBoostJob", _replica_specs("xgbReplicaSpecs")),
    (KUBEFLOW, "jaxjobs"): ("JAXJob", _replica_specs("jaxReplicaSpecs")),
    ("ray.io/v1", "rayclusters"): ("RayCluster", _ray_cluster),
    ("ray.io/v1", "rayjobs"): ("RayJob", _ray_job),
    ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"): ("LeaderWorkerSet", _leader_worker_set),
}


def _check_custom(resource: tuple, body: dict, api_version: str, kind: str, *, creating: bool):
    """A custom resource names its apiVersion and kind (the server decodes it unstructured:
    400 without them) and passes its schema (422)."""
    if resource not in CUSTOM_KINDS:
        return
    if creating and not (body.get("apiVersion") and body.get("kind")):
        missing = "Kind" if body.get("apiVersion") else "apiVersion"
        _error(400, "BadRequest", f"Object '{missing}' is missing in '{_short(body)}'")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        _schema_error("spec", spec, dict)
    CUSTOM_KINDS[resource][1](spec)


def _short(body: dict) -> str:
    return json.dumps(body, separators=(",", ":"))[:200]
