"""Pods GPUPool schedules but did not make: made with kubectl, Helm or an operator, with
`spec.schedulerName` naming GPUPool's scheduler (the cluster's config `scheduler_name`,
default `gpupool`).

What the cluster shows of them (`NativePod`), and what a scheduler does to them:
- bind through `pods/binding`; the Binding's annotations (the API server copies them onto
  the pod) say which installation and Cluster record bound it (`gpupool.io/bound-by`) and
  which pod of which workload it is, so the next pass reads it back as GPUPool's;
- say why a pod waits: its `PodScheduled` condition (False, Unschedulable, the pending
  reason) and a `FailedScheduling` event, as kube-scheduler does; `Scheduled` on binding;
- evict through the Eviction API (a PodDisruptionBudget may refuse: 429, tried again);
- read the owners a pod's workload is made of (`OWNER_KINDS`: a Job, a JobSet, Kubeflow's
  training jobs, a RayCluster or RayJob; a ReplicaSet for its Deployment), and suspend one
  that can be suspended when the portal stops its workload, so that its controller does
  not make the pods again.

The Django side (grouping into workloads, quotas) is `clusters/native.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters import native_sharing
from clusters.backends import (
    SCHEDULER_NAME,
    BackendError,
    BackendUnreachable,
    PodSpec,
    PodSpecInvalid,
    PodStatus,
    ReconcileReport,
    as_enforced,
    mps_device,
)
from clusters.backends.kubernetes.errors import said
from clusters.backends.kubernetes.foreign import pod_requests
from clusters.backends.kubernetes.manifests import GPU_RESOURCE, pod_status
from clusters.backends.kubernetes.owners import OwnerRef, controller_of, object_named
from clusters.backends.kubernetes.ownership import BOUND_BY_ANNOTATION as BOUND_BY
from clusters.backends.kubernetes.watch import as_version

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = SCHEDULER_NAME
POD_NAME = "gpupool.io/pod"  # the pod's name in GPUPool: gp-<workload>-<index>
WORKLOAD_ID = "gpupool.io/workload-id"
POD_INDEX = "gpupool.io/pod-index"


@dataclass(slots=True)
class NativePod:
    """A pod that names GPUPool's scheduler, as the cluster shows it."""

    namespace: str
    name: str
    uid: str
    owner: OwnerRef | None  # its controller (ownerReferences with controller: true)
    labels: dict[str, str]
    annotations: dict[str, str]
    created: str
    phase: str
    node_name: str
    gated: bool  # spec.schedulingGates not empty: not to be bound yet
    deleting: bool
    priority_class: str
    gpus: float  # nvidia.com/gpu, cpu cores, memory: as the scheduler sums a pod's requests
    cpu: float
    memory_mib: int
    scheduled_message: str  # the message of its PodScheduled condition, if False
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def bound_by(self, identity: str) -> bool:
        return self.annotations.get(BOUND_BY) == identity


def identity(backend: KubernetesBackend) -> str:
    """`<installation uid>.<cluster uid>`: the value of `gpupool.io/bound-by`."""
    return backend.owner.bound_by


def scheduler_name(backend: KubernetesBackend) -> str:
    return str((backend.cluster.config or {}).get("scheduler_name") or DEFAULT_SCHEDULER)


def list_native(backend: KubernetesBackend) -> dict:
    """Every pod that names our scheduler, in every namespace (one request): the list's
    answer, which may seed the watch of them (watch.py)."""
    name = scheduler_name(backend)
    try:
        return backend._json(
            backend.api.list_pod_for_all_namespaces, field_selector=f"spec.schedulerName={name}"
        )
    except ApiException as exc:  # as for GPUPool's own pods: the pass cannot go on blind
        raise BackendUnreachable(f"cannot list pods for scheduler {name}: {said(exc)}") from exc


def native_pods(backend: KubernetesBackend, items: list[dict]) -> list[NativePod]:
    """The listed or watched pods, read. The field selector is the API server's; the same
    test is made here, so that a server that ignored it would not hand us other
    schedulers' pods."""
    name = scheduler_name(backend)
    return [
        native_pod(item) for item in items if (item.get("spec") or {}).get("schedulerName") == name
    ]


def native_pod(pod: dict) -> NativePod:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    scheduled = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
    )
    requests = _requests(meta, spec)
    return NativePod(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        owner=controller_of(pod),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        created=meta.get("creationTimestamp", ""),
        phase=status.get("phase") or "Pending",
        node_name=spec.get("nodeName") or "",
        gated=bool(spec.get("schedulingGates")),
        deleting=bool(meta.get("deletionTimestamp")),
        priority_class=spec.get("priorityClassName") or "",
        gpus=float(requests[GPU_RESOURCE]),
        cpu=float(requests["cpu"]),
        memory_mib=math.ceil(requests["memory"] / 2**20),
        scheduled_message=scheduled.get("message", "")
        if scheduled.get("status") == "False"
        else "",
        raw=pod,
    )


# A pod's requests by (uid, resourceVersion): every pass reads every native pod again, and a
# pod's spec changes only with its version (an in-place resize too). Parsing the quantities
# was most of the cost of reading a pod.
_REQUESTS: dict[tuple[str, str], dict] = {}
REQUESTS_KEPT = 100_000


def _requests(meta: dict, spec: dict) -> dict:
    key = (meta.get("uid") or "", meta.get("resourceVersion") or "")
    if not all(key):
        return pod_requests(spec, f"{meta['namespace']}/{meta['name']}")
    found = _REQUESTS.get(key)
    if found is None:
        if len(_REQUESTS) >= REQUESTS_KEPT:
            _REQUESTS.clear()
        found = _REQUESTS[key] = pod_requests(spec, f"{meta['namespace']}/{meta['name']}")
    return found


def bind(backend: KubernetesBackend, spec: PodSpec) -> PodStatus:
    """Bind the existing pod `spec.native_pod` to the node the cycle chose. A 409 is a
    pod bound already: by an earlier try of ours whose answer was lost (then it carries
    our annotation), or by someone else (then the allocation is not ours to keep)."""
    if spec.shared_gpu_index is not None:
        write_gpu_config(backend, spec)
    annotations = {
        BOUND_BY: identity(backend),
        POD_NAME: spec.name,
        WORKLOAD_ID: str(spec.workload_id),
        POD_INDEX: str(spec.pod_index),
    }
    if spec.shared_gpu_index is not None:
        # Which GPU it shares, as GPUPool's own sharers say: while the pod is there (kept
        # by a targeted pass, or shutting down) its GPU keeps its reservation pod.
        annotations["gpupool.io/node"] = spec.node_name
        annotations["gpupool.io/shared-gpu"] = f"{spec.shared_gpu_index}:{spec.gpu_share}"
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": spec.native_pod, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": spec.node_name},
    }
    taken = False
    try:
        backend.post(body, "namespaces", spec.namespace, "pods", spec.native_pod, "binding")
    except ApiException as exc:
        if exc.status == 404:
            raise BackendError(f"pod {spec.namespace}/{spec.native_pod} is gone") from exc
        if exc.status != 409:
            raise BackendError(f"bind {spec.namespace}/{spec.native_pod}: {said(exc)}") from exc
        taken = True
    listed = backend.native_listed(spec.namespace, spec.native_pod)
    if taken or listed is None:
        # Whose binding it is, read back: ours from a try whose answer was lost, or not.
        pod = backend._json(backend.api.read_namespaced_pod, spec.native_pod, spec.namespace)
        seen(backend, pod)
        found = native_pod(pod)
    else:
        # A 201 is ours: the pod is now what the server made of it (BindingREST: the node,
        # the Binding's annotations, PodScheduled True). No read-back: the pass waits for
        # its watch to show every pod it bound before it ends (`caught_up`).
        found = bound(listed, spec.node_name, annotations)
        backend.bound_native[(spec.namespace, spec.native_pod)] = (listed.uid, spec.node_name)
    if not found.bound_by(identity(backend)) or found.annotations.get(POD_NAME) != spec.name:
        raise BackendError(
            f"pod {spec.namespace}/{spec.native_pod} was bound to {found.node_name} by someone else"
        )
    record_event(
        backend,
        found,
        "Normal",
        "Scheduled",
        f"Successfully assigned {spec.namespace}/{spec.native_pod} to {spec.node_name}",
    )
    return native_status(found)


def bound(pod: NativePod, node: str, annotations: dict[str, str]) -> NativePod:
    """`native_pod(bound_copy(...))` without reading the whole pod again: what a Binding's
    201 changes of it (its node, its annotations, no pending message)."""
    raw = bound_copy(pod.raw, node, annotations)
    return replace(
        pod,
        node_name=node,
        annotations=dict(raw["metadata"]["annotations"]),
        scheduled_message="",
        raw=raw,
    )


def bound_copy(pod: dict, node: str, annotations: dict[str, str]) -> dict:
    """The pod as a Binding's 201 leaves it (the API server's BindingREST): on `node`, the
    Binding's annotations added, its PodScheduled condition True."""
    meta, status = pod["metadata"], dict(pod.get("status") or {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True"}]
    status.pop("nominatedNodeName", None)
    return {
        **pod,
        "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}},
        "spec": {**(pod.get("spec") or {}), "nodeName": node},
        "status": status,
    }


def caught_up(backend: KubernetesBackend, watch: Any) -> None:
    """The pods this pass bound, as the next pass must find them (read-your-writes): once
    this process's watch shows each on its node (or gone), everything up to the watch's
    version is ours to require; without a watch, or if it lags past its wait, each is
    read back."""
    bound, backend.bound_native = backend.bound_native, {}
    if not bound:
        return

    order = list(bound.items())
    checked = 0  # order[:checked] are shown

    def shown(items: dict) -> bool:
        """Each bound pod on its node in the cache, or gone (checked once each: a pod the
        watch showed bound stays so; each watch event wakes this, and it goes on from the
        first pod not yet shown, not over all of them again)."""
        nonlocal checked
        while checked < len(order):
            key, (uid, node) = order[checked]
            pod = items.get(key)
            if (
                pod is None
                or pod["metadata"].get("uid") != uid
                or (pod.get("spec") or {}).get("nodeName") == node
            ):
                checked += 1
            else:
                return False
        return True

    version = None if watch is None else watch.native.cache.wait_for(shown, backend.watch_wait_s)
    if version is not None:
        backend.written["native"] = max(backend.written["native"], version)
        return
    for namespace, name in bound:
        try:
            seen(backend, backend._json(backend.api.read_namespaced_pod, name, namespace))
        except ApiException as exc:
            if exc.status != 404:  # gone since: nothing of it to wait for
                raise BackendError(f"read {namespace}/{name}: {said(exc)}") from exc


def waits_for_mps(backend: KubernetesBackend, spec: PodSpec, report: ReconcileReport) -> bool:
    """A native sharer under MPS whose GPU's daemon its node's agent has not reported running
    for it is not bound yet: the kubelet would make its pipe folder and start it before the
    daemon, without its limits (clusters/mps_report.py). Its pod says why it waits, and so
    does its workload (`ReconcileReport.waiting`: the same words)."""
    if (
        not spec.native_pod
        or spec.shared_gpu_index is None
        or as_enforced(spec, backend.cluster.config).mps is None
        or mps_device(spec) in spec.mps_running
    ):
        return False
    pod = backend.native_listed(spec.namespace, spec.native_pod)
    message = report.waiting[spec.name] = mps_wait_message(spec)
    try:
        if pod is not None:
            tell_waiting(backend, pod, message)
    except BackendError as exc:
        report.errors.append(str(exc))
    return True


def mps_wait_message(spec: PodSpec) -> str:
    """Why a native sharer is not bound yet (`waits_for_mps`): its GPU's daemon not reported
    running for it, or no report ever from its node's agent (one older than the portal)."""
    waiting = f"Waiting for the MPS daemon of GPU {mps_device(spec)} on node {spec.node_name}: "
    if not spec.mps_reported:
        return waiting + (
            "the node's GPUPool agent has never reported its MPS daemons; it may be older "
            "than the portal: upgrade it. The pod is bound once the agent says the daemon "
            "runs, so that it never runs without its GPU limits."
        )
    return waiting + (
        "GPUPool's node agent starts it and says so (it asks every 30 s), and the pod is "
        "bound then, so that it never runs without its GPU limits."
    )


def write_gpu_config(backend: KubernetesBackend, spec: PodSpec) -> None:
    """A sharer's GPU environment (its GPU's UUID and pipe folder, its MPS limits:
    `native_sharing.gpu_env`) into the ConfigMap its spec names, owned by the pod, before it
    is bound: the kubelet reads it when it starts the container (and mounts that pipe). One
    in the way is taken only when it is what an earlier try of this write made; another is
    the cluster's error, and the pod waits."""
    pod = _raw_pod(backend, spec.namespace, spec.native_pod)
    mps = as_enforced(spec, backend.cluster.config).mps
    # Checked when it was queued, and a pod's spec does not change; but a pod queued before
    # GPUPool asked for its GPU's pipe alone (it mounts the whole MPS root) never runs.
    if missing := native_sharing.missing_parts(pod, mps_root=backend.mps_root, mps=mps is not None):
        raise PodSpecInvalid(
            f"Pod {spec.native_pod} needs {'; '.join(missing)} to share a GPU: make it again."
        )
    name = native_sharing.gpu_config_of(pod)
    env = native_sharing.gpu_env(mps_device(spec), mps)
    body = native_sharing.gpu_config_map(name, pod, env, backend.owner.labels)
    where = f"ConfigMap {spec.namespace}/{name}"
    try:
        backend.post(body, "namespaces", spec.namespace, "configmaps")
    except ApiException as exc:
        if exc.status != 409:
            raise BackendError(f"{where}: {said(exc)}") from exc
        try:
            found = backend._json(backend.api.read_namespaced_config_map, name, spec.namespace)
        except ApiException as again:
            raise BackendError(f"{where}: {said(again)}") from again
        if not native_sharing.written_for(found, pod, env):
            raise BackendError(
                f"{where} exists and is not the GPU environment GPUPool wrote for pod "
                f"{spec.native_pod}: delete it, and the pod is bound on the next pass"
            ) from exc


def _raw_pod(backend: KubernetesBackend, namespace: str, name: str) -> dict:
    """The pod as this pass listed it, else as the cluster has it now."""
    listed = backend.native_listed(namespace, name)
    if listed is not None:
        return listed.raw
    try:
        return backend._json(backend.api.read_namespaced_pod, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise BackendError(f"pod {namespace}/{name} is gone") from exc
        raise BackendError(f"pod {namespace}/{name}: {said(exc)}") from exc


def seen(backend: KubernetesBackend, pod: dict) -> None:
    """A native pod as it is after our write: the next pass reads the watch of them only
    once it has caught up with this (read-your-writes, as for GPUPool's own pods)."""
    version = as_version((pod.get("metadata") or {}).get("resourceVersion")) or 0
    backend.written["native"] = max(backend.written["native"], version)


def native_status(pod: NativePod) -> PodStatus:
    """A pod we bound, as GPUPool names it (`gp-<workload>-<index>`, from the Binding's
    annotations)."""
    status = pod_status(pod.raw)
    status.name = pod.annotations.get(POD_NAME, pod.name)
    status.workload_id = int(pod.annotations.get(WORKLOAD_ID, 0) or 0)
    status.pod_index = int(pod.annotations.get(POD_INDEX, 0) or 0)
    status.native = pod.name
    status.endpoint, status.ports = "", {}  # no Service of ours points at it
    return status


def evict(backend: KubernetesBackend, status: PodStatus, *, grace_period_s: int) -> bool:
    """Evict through the Eviction API (a PodDisruptionBudget is honoured: 429 leaves it
    for the next pass). True when the pod is gone now."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": status.native, "namespace": status.namespace},
        "deleteOptions": {"gracePeriodSeconds": grace_period_s},
    }
    try:
        backend.post(body, "namespaces", status.namespace, "pods", status.native, "eviction")
    except ApiException as exc:
        if exc.status == 404:
            return True
        if exc.status == 429:
            raise BackendError(
                f"evict {status.namespace}/{status.native}: refused by its disruption budget "
                "(tried again next pass)"
            ) from exc
        raise BackendError(f"evict {status.namespace}/{status.native}: {said(exc)}") from exc
    return False


def delete(backend: KubernetesBackend, namespace: str, name: str) -> None:
    """A bare pod whose workload was stopped: nothing makes it again."""
    try:
        backend.call(backend.api.delete_namespaced_pod, name, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:
            raise BackendError(f"delete {namespace}/{name}: {said(exc)}") from exc


def tell_waiting(backend: KubernetesBackend, pod: NativePod, message: str) -> bool:
    """Set the pod's PodScheduled condition to False with `message` and record a
    FailedScheduling event, when the pod does not say so already. True when written."""
    if pod.scheduled_message == message:
        return False
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": _now(),
    }
    try:
        # Read here, not by backend._json: that counts a written Pod as one of GPUPool's
        # own, whose watch never sees this one.
        response = backend.call(
            backend.api.patch_namespaced_pod_status,
            pod.name,
            pod.namespace,
            {"status": {"conditions": [condition]}},
            _preload_content=False,
        )
        answer = json.loads(response.data)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise BackendError(f"status of {pod.namespace}/{pod.name}: {said(exc)}") from exc
    seen(backend, answer)
    pod.scheduled_message = message
    record_event(backend, pod, "Warning", "FailedScheduling", message)
    return True


def record_event(
    backend: KubernetesBackend, pod: NativePod, type_: str, reason: str, message: str
) -> None:
    """An Event about the pod, as `kubectl describe pod` lists them. Named after what it
    says, so that saying it again is a 409 and no second event (best effort: an event
    that cannot be written never stops a pass)."""
    digest = hashlib.sha256(f"{pod.uid}/{reason}/{message}".encode()).hexdigest()[:12]
    now = _now()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name}.{digest}", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": scheduler_name(backend)},
        "reportingComponent": scheduler_name(backend),
        "reportingInstance": identity(backend)[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        backend.post(body, "namespaces", pod.namespace, "events")
    except ApiException as exc:
        if exc.status != 409:
            log.warning("event on %s/%s not written: %s", pod.namespace, pod.name, said(exc))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A submission's own id, on the object: a create retried after a lost answer (a timeout)
# meets its own object (409) and takes it as made.
SUBMISSION = "gpupool.io/submission"


class ManifestRefused(BackendError):
    """The API server refused a submitted object for what it is (validation, admission,
    a name taken, a kind it does not serve): asking again will not help; its message is
    for the submitter."""


def create(
    backend: KubernetesBackend, body: dict, plural: str, templates: list[tuple[str, dict]]
) -> dict:
    """Create a submitted object in its namespace, as the cluster's user; the object as
    the API server answers it (its name made from `generateName`, its uid). For any kind
    but a Pod, a pod of each of its `templates` (what its controller would make) is first
    created with `dryRun=All`: a refusal of those, or of the object (its schema, a kind
    the server does not serve), writes nothing."""
    meta = body["metadata"]
    api = _ObjectApi(backend, body["apiVersion"], plural)
    if body["kind"] != "Pod":
        for path, template in templates:
            _admit_template(backend, meta, path, template)
    try:
        response = backend.call(api.create, meta["namespace"], body, _preload_content=False)
    except ApiException as exc:
        if exc.status == 409 and meta.get("name"):
            found = _read_quietly(backend, api.read, meta)
            mine = (meta.get("annotations") or {}).get(SUBMISSION)
            if (
                mine
                and (found.get("metadata", {}).get("annotations") or {}).get(SUBMISSION) == mine
            ):
                return found  # made by an earlier try of this create, whose answer was lost
        raise _refused(exc, body, plural) from exc
    return json.loads(response.data)


class _ObjectApi:
    """Create and read one kind: a Pod through the core API, any other (built in or a
    custom resource) through its group's URL, /apis/<group>/<version>/.../<plural>."""

    def __init__(self, backend: KubernetesBackend, api_version: str, plural: str) -> None:
        group, _, version = api_version.rpartition("/")
        objects = k8s.CustomObjectsApi(backend.api.api_client)
        self.pod = not group
        self.path = [group, version]
        self.plural = plural
        self.objects = objects
        self.core = backend.api

    def create(self, namespace: str, body: dict, **kwargs: Any) -> Any:
        if self.pod:
            return self.core.create_namespaced_pod(namespace, body, **kwargs)
        return self.objects.create_namespaced_custom_object(
            *self.path, namespace, self.plural, body, **kwargs
        )

    def read(self, name: str, namespace: str, **kwargs: Any) -> Any:
        if self.pod:
            return self.core.read_namespaced_pod(name, namespace, **kwargs)
        return self.objects.get_namespaced_custom_object(
            *self.path, namespace, self.plural, name, **kwargs
        )


def _refused(exc: ApiException, body: dict, plural: str) -> BackendError:
    """What the server's answer to a submitted object means for the submitter."""
    namespace = body["metadata"]["namespace"]
    if exc.status == 404 and not object_named(exc):
        return ManifestRefused(
            f"apiVersion/kind: the cluster does not serve {plural} of {body['apiVersion']} "
            f"(is the {body['kind']} CRD installed?): {said(exc)}"
        )
    if exc.status in (400, 403, 404, 409, 422):
        return ManifestRefused(said(exc))
    return BackendError(f"create {body['kind']} in {namespace}: {said(exc)}")


def _admit_template(backend: KubernetesBackend, owner: dict, path: str, template: dict) -> None:
    """The API server admits a Job (a Deployment, a PyTorchJob...) whatever its template
    (Pod Security only warns about it), and refuses its pods later, one FailedCreate event
    at a time. A dry-run create of a pod from the template (dryRun=All: validated and
    admitted, not stored) asks its admission now."""
    meta = template.get("metadata") or {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{str(owner.get('name') or 'pod')[:50]}-",
            "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {},
        },
        "spec": template["spec"],
    }
    namespace = owner["namespace"]
    try:
        backend.call(
            backend.api.create_namespaced_pod,
            namespace,
            pod,
            dry_run="All",
            _preload_content=False,
        )
    except ApiException as exc:
        if exc.status in (400, 403, 422):
            raise ManifestRefused(f"{path}: its pods would be refused: {said(exc)}") from exc
        raise BackendError(f"check the pods of {path} in {namespace}: {said(exc)}") from exc


def _read_quietly(backend: KubernetesBackend, read: Any, meta: dict) -> dict:
    try:
        return backend._json(read, meta["name"], meta["namespace"])
    except ApiException:
        return {}


def namespace_labels(backend: KubernetesBackend, namespace: str) -> dict[str, str]:
    """The namespace's labels (its Pod Security level); none for one that is not there."""
    try:
        found = backend.call(backend.api.read_namespace, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise BackendError(f"namespace {namespace}: {said(exc)}") from exc
    return dict((json.loads(found.data).get("metadata") or {}).get("labels") or {})
