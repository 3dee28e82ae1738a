"""Workloads from pods made outside GPUPool: kubectl, Helm, an operator (issue 26).

A pod in a project's namespace whose `spec.schedulerName` is GPUPool's (the cluster's
config `scheduler_name`, default `gpupool`) is queued like portal work, under the
project's quota, priority and policy. Pods are grouped into one workload per top owner,
found by walking their controllers (ownerReferences, controller: true) up
(docs/kubernetes-native.md has the table):
- a Job's pods are one gang of min(parallelism, completions); a CronJob's Jobs are each a
  run of their own (the CronJob is shown as the owner);
- a JobSet's Jobs are one gang (over its replicatedJobs, replicas x the Job's gang);
- a Kubeflow training job's (PyTorchJob, MPIJob, TFJob, XGBoostJob, JAXJob) replicas are
  one gang; a RayCluster's head and minimum workers are one, owned by its RayJob if any;
- a LeaderWorkerSet's group (a leader and its workers) is one gang of its size;
- any other pod (bare, a Deployment's, a StatefulSet's) is a workload of its own;
- the annotation `gpupool.io/min-available: N` sets the gang's size (any owner's pods).
Labels may set `gpupool.io/kind` (training, inference, workspace...), `gpupool.io/priority-
class` (build, train, inference; also taken from the pod's priorityClassName when it is one
of those) and `gpupool.io/preemptible` ("true"/"false"). Annotations may ask for part of a
GPU (`gpupool.io/gpu-fraction`, `gpupool.io/gpu-memory`: clusters/native_sharing.py).

Each pass of the cluster's reconcile (`native_sync`, before the pods are compared):
1. new pods get a workload, checked as any submit is (bounds, policy, fit); a pod that
   cannot be queued says why in its PodScheduled condition and an event, naming the field;
2. a workload's pods fill its slots (`Workload.spec["native"]["pods"]`: pod i's name and
   uid), so that the cycle's allocation of pod i binds that pod (clusters/podspecs.py);
3. a pending workload's pods carry its pending reason, as kube-scheduler's would;
4. a workload stopped in the portal suspends its owner where it can be suspended (a Job,
   a JobSet, a Kubeflow job, a RayJob or RayCluster), else deletes its pods; a pending
   workload whose pods are gone (deleted, or its owner is) stops.
Binding, eviction and the phases read back are the reconcile's, as for GPUPool's own pods.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.utils.dateparse import parse_datetime

from clusters import native_sharing as sharing
from clusters.backends import BackendError
from clusters.backends.kubernetes import native as kube
from clusters.backends.kubernetes import owners
from clusters.backends.kubernetes.manifests import GPU_RESOURCE, MPS_ROOT
from clusters.backends.kubernetes.owners import KindNotServed, OwnerRef
from clusters.models import Cluster, Node
from clusters.native_owners import (
    LWS,
    LWS_GROUP,
    LWS_INDEX,
    LWS_NAME,
    LWS_SIZE,
    Origin,
    origins,
    to_walk,
)
from clusters.sharing import mps_enabled
from clusters.stored import config_of
from portal.errors import ValidationFailed
from portal.models import Project
from scheduling.intake import (
    Checked,
    intake_pass,
    workload_check_native,
    workloads_submit_native,
)
from scheduling.lifecycle import workload_transition
from scheduling.models import FINISHED_STATES, PriorityClass, Workload, WorkloadKind
from scheduling.models import WorkloadState as S

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend
    from clusters.backends.kubernetes.native import NativePod

log = logging.getLogger(__name__)

GANG = "gpupool.io/min-available"
KIND = "gpupool.io/kind"
PRIORITY = "gpupool.io/priority-class"
PREEMPTIBLE = "gpupool.io/preemptible"
FRACTION, GPU_MEMORY = sharing.FRACTION, sharing.GPU_MEMORY
NAMESPACE_RECHECK_S = 300.0
SUBMITTER = "gpupool-kubernetes"
# What a pod that requests no CPU or memory is counted as (kube-scheduler's non-zero
# defaults for such pods: 100m and 200 MB).
NONZERO_CPU, NONZERO_MEMORY_MIB = 0.1, 200
# Where a submit field comes from on a pod, for the message that says what to change.
FIELD_SOURCE = {
    "gpus": f"resources.limits[{GPU_RESOURCE}]",
    "cpu": "resources.requests.cpu",
    "memory_mib": "resources.requests.memory",
    "workers": f"the annotation {GANG}",
    "replicas": f"the annotation {GANG}",
    "kind": f"the label {KIND}",
    "priority_class": f"the label {PRIORITY}",
    "preemptible": f"the label {PREEMPTIBLE}",
    "node_pools": "the cluster's node pools",
    "name": "the owner's name",
}


@dataclass(slots=True)
class Group:
    """The pods of one workload-to-be: one owner's gang, or a pod alone."""

    key: str
    namespace: str
    owner: OwnerRef | None  # the top owner, as pages show it
    size: int | None  # from the annotation or the owner; None: one pod
    pods: list[NativePod] = field(default_factory=list)
    target: OwnerRef | None = None  # the gang's owner: suspended on stop, read when gone
    links: set[str] = field(default_factory=set)  # the pods' own controllers (uids)
    note: str = ""
    error: BackendError | None = None

    @property
    def waiting(self) -> list[NativePod]:
        """Pods to be bound: unbound, not gated, not going."""
        return [
            p
            for p in self.pods
            if not p.node_name and not p.gated and not p.deleting and not p.terminal
        ]

    @property
    def live(self) -> list[NativePod]:
        return [p for p in self.pods if not p.terminal and not p.deleting]

    @property
    def alone(self) -> bool:
        """A pod that is a workload of its own (bare, a Deployment's, a StatefulSet's)."""
        return bool(self.pods) and self.key == self.pods[0].uid


@dataclass(slots=True)
class Intake:
    """What the groups queued in one pass need, read once for all of them (a pass may
    queue a thousand): the cluster's pools, the submitter, the names taken in their
    projects."""

    pools: list[str]
    submitter: Any
    taken: set[tuple[int, str]]  # (project pk, workload name)
    checked: list[tuple[Group, Checked]] = field(default_factory=list)  # queued together


def native_sync(cluster: Cluster, backend: KubernetesBackend) -> list[str]:
    """One intake pass over the pods that name our scheduler; the errors to show on the
    cluster (one bad pod never stops the others)."""
    errors: list[str] = []
    pods = backend.native_pods()
    projects = _projects(backend, {p.namespace for p in pods}, errors)
    pods = [p for p in pods if p.namespace in projects]
    native = Workload.objects.filter(cluster=cluster, spec__has_key="native")
    active = {
        w.spec["native"]["key"]: w
        for w in native.exclude(state__in=FINISHED_STATES).select_related("project")
    }
    links = {link: key for key, w in active.items() for link in w.spec["native"].get("links") or []}
    groups = _groups(pods, active, links, origins(backend, to_walk(pods, active, links)))
    fresh = [key for key in groups if key not in active]
    last: dict[str, Workload] = {}
    for workload in native.filter(spec__native__key__in=fresh).order_by("pk"):
        last[workload.spec["native"]["key"]] = workload
    stopped = {key for key in fresh if _stopped_before(last.get(key), groups[key])}
    new = {key for key in fresh if groups[key].waiting and key not in stopped}
    intake = _intake(cluster, projects, [groups[key] for key in new]) if new else None
    with intake_pass():  # what the submits share (nodes, pools, policies), read once
        for key, group in groups.items():
            try:
                if key in active:
                    _fill_slots(active[key], group)
                    _tell_pending(backend, active[key], group)
                elif key in new and intake is not None:
                    _queue(backend, cluster, projects[group.namespace], group, intake)
                elif key in stopped:
                    _enforce_stop(backend, group)
            except BackendError as exc:
                errors.append(str(exc))
        if intake is not None:
            errors += _queue_checked(backend, cluster, intake)
    for key, workload in active.items():
        if key not in groups:  # every pod gone: no slot holds one
            _fill_slots(workload, Group(key, "", None, None))
        if key not in groups or not groups[key].live:
            try:
                _gone(backend, workload, groups.get(key))
            except BackendError as exc:
                errors.append(str(exc))
    return errors


def _intake(cluster: Cluster, projects: dict[str, Project], new: list[Group]) -> Intake:
    """What the new groups of this pass need, in a few statements."""
    names = {_owner_name(g) for g in new}
    project_ids = {projects[g.namespace].pk for g in new}
    taken = set(
        Workload.objects.filter(project_id__in=project_ids, name__in=names).values_list(
            "project_id", "name"
        )
    )
    return Intake(_cluster_pools(cluster), _submitter(), taken)


# Namespaces checked as ours (made or adopted) by this process: (API server, identity,
# namespace) -> when. Checked again after a few minutes (someone may have taken its labels
# off), and at once after an error; like the watch, state kept per process.
_NAMESPACES_CHECKED: dict[tuple[str, str, str], float] = {}


def _projects(
    backend: KubernetesBackend, namespaces: set[str], errors: list[str]
) -> dict[str, Project]:
    """The projects whose namespaces hold such pods, where the namespace is ours (made or
    adopted by this installation: another GPUPool's is refused, and its pods left alone)."""
    found = {}
    now, server = time.monotonic(), backend.api.api_client.configuration.host
    for project in Project.objects.filter(namespace__in=namespaces).select_related("department"):
        checked = (server, kube.identity(backend), project.namespace)
        if now - _NAMESPACES_CHECKED.get(checked, -NAMESPACE_RECHECK_S) >= NAMESPACE_RECHECK_S:
            try:
                backend.ensure_namespace(project.namespace, project.name)
            except BackendError as exc:
                _NAMESPACES_CHECKED.pop(checked, None)
                errors.append(str(exc))
                continue
            _NAMESPACES_CHECKED[checked] = now
        found[project.namespace] = project
    return found


def _groups(
    pods: list[NativePod],
    active: dict[str, Workload],
    links: dict[str, str],
    origins: dict[str, Origin],
) -> dict[str, Group]:
    """The pods by workload-to-be: a gang's by its owner, any other pod alone. A pod of a
    queued group goes to it by its record (its key, or a link to its own controller);
    others by their owner's origin, read this pass (clusters/native_owners.py)."""
    groups: dict[str, Group] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.name)):
        group = _place(pod, active, links, origins)
        found = groups.setdefault(group.key, group)
        found.links |= group.links
        found.pods.append(pod)
    return groups


def _place(
    pod: NativePod, active: dict[str, Workload], links: dict[str, str], origins: dict[str, Origin]
) -> Group:
    """The (empty) group the pod belongs to."""
    annotated = _gang_size(pod.annotations[GANG]) if GANG in pod.annotations else None
    owner, ns = pod.owner, pod.namespace
    if LWS_GROUP in pod.labels:
        shown = OwnerRef(LWS, "LeaderWorkerSet", pod.labels.get(LWS_NAME, ""), "")
        size = (
            annotated if annotated is not None else _gang_size(pod.annotations.get(LWS_SIZE, "1"))
        )
        return Group(f"lws-{pod.labels[LWS_GROUP][:40]}", ns, shown, size)
    if owner is None or pod.uid in active:
        return Group(pod.uid, ns, owner, annotated)
    if owner.uid in links or owner.uid in active:
        return Group(links.get(owner.uid, owner.uid), ns, owner, annotated, links={owner.uid})
    origin = origins.get(owner.uid) or Origin(owner)  # not read: a pod that is done
    gang = origin.gang or (owner if annotated is not None else None)
    if gang is None:
        return Group(pod.uid, ns, origin.shown, None)
    size = annotated if annotated is not None else origin.size
    group = Group(gang.uid, ns, origin.shown, size, target=gang, links={owner.uid})
    # With the annotation, grouping by the pod's controller is what was asked: no note.
    group.note, group.error = origin.note if annotated is None else "", origin.error
    return group


def _gang_size(value: str) -> int:
    """The annotation's value; 0 when it is not a whole number (refused with a message)."""
    try:
        return int(value)
    except ValueError:
        return 0


def _queue(
    backend: KubernetesBackend, cluster: Cluster, project: Project, group: Group, intake: Intake
) -> None:
    """A new group checked as a workload (into `intake.checked`: queued with the pass's
    others), or the reason it cannot be one on each of its pods."""
    first = group.waiting[0]
    if group.error is not None:
        raise group.error
    if group.size is None and group.target is not None:  # its owner's size is not known
        group.size = len(group.waiting)
    if group.size is not None and 0 < len(group.waiting) < group.size:
        # Queued once the whole gang exists: GPUs held for pods not made yet help nobody.
        have, want = len(group.waiting), group.size
        for pod in group.waiting:
            kube.tell_waiting(
                backend, pod, f"Waiting for the rest of its gang: {have} of {want} pods exist."
            )
        return
    try:
        kind, spec = _submit_spec(cluster, group, first, intake.pools)
        name = _free_name(project, group, intake.taken)
        checked = workload_check_native(
            actor=intake.submitter,
            project=project,
            kind=kind,
            name=name,
            spec=spec,
            extra={
                "cluster": cluster,
                "spec": {"native": _native_record(group, first, slots=True)},
            },
            origin=f"From Kubernetes: {_described(group, first)}.",
        )
    except ValidationFailed as exc:
        _refused(backend, group, exc)
        return
    intake.taken.add((project.pk, name))
    intake.checked.append((group, checked))


def _queue_checked(backend: KubernetesBackend, cluster: Cluster, intake: Intake) -> list[str]:
    """The pass's checked groups queued together; each pod told what became of it."""
    errors = []
    answers = workloads_submit_native(
        actor=intake.submitter, checked=[checked for _, checked in intake.checked]
    )
    for (group, _), answer in zip(intake.checked, answers, strict=True):
        try:
            if isinstance(answer, ValidationFailed):
                _refused(backend, group, answer)
            else:
                _queued(backend, cluster, answer, group)
        except BackendError as exc:
            errors.append(str(exc))
    return errors


def _refused(backend: KubernetesBackend, group: Group, exc: ValidationFailed) -> None:
    """Each waiting pod says why GPUPool cannot queue it, naming what to change."""
    first = group.waiting[0]
    message = "GPUPool cannot queue this pod: " + "; ".join(
        f"{_field_source(name, first)}: {' '.join(texts)}"
        for name, texts in sorted(exc.errors.items())
    )
    for pod in group.waiting:
        kube.tell_waiting(backend, pod, message)


def _queued(backend: KubernetesBackend, cluster: Cluster, workload: Workload, group: Group) -> None:
    _fill_slots(workload, group)
    described = _described(group, group.waiting[0])
    log.info("%s: queued %s as workload %s", cluster.name, described, workload.pk)
    if group.note:  # grouped by the pod's own controller: say so where its owner looks
        log.warning("%s: grouped by the pods' controller: %s", cluster.name, group.note)
        for pod in group.waiting:
            kube.record_event(
                backend, pod, "Warning", "OwnerNotRead", f"Grouped by its controller: {group.note}"
            )


def _field_source(name: str, pod: NativePod) -> str:
    """Where a submit field comes from on the pod: a share's GPU fields from its annotation."""
    if name in ("gpus", "gpu_memory_mib", "gpu_request") and sharing.asks_share(pod.annotations):
        return f"the annotation {FRACTION if FRACTION in pod.annotations else GPU_MEMORY}"
    return FIELD_SOURCE.get(name, name)


def _submit_spec(
    cluster: Cluster, group: Group, pod: NativePod, pools: list[str]
) -> tuple[str, dict[str, Any]]:
    """The submit fields the pod's shape says; raises ValidationFailed for what no submit
    field can carry."""
    errors: dict[str, list[str]] = {}
    labels = pod.labels
    kind = labels.get(KIND, WorkloadKind.TRAINING)
    size = group.size if group.size is not None else 1
    if size < 1:
        errors["workers"] = [
            f"Give a whole number of pods, at least 1 (not {pod.annotations[GANG]!r})."
        ]
    spec: dict[str, Any] = {
        "image": _image(pod),
        "gpus": pod.gpus,
        # A pod that asks for none (BestEffort) is counted as kube-scheduler scores it.
        "cpu": round(pod.cpu, 2) or NONZERO_CPU,
        "memory_mib": pod.memory_mib or NONZERO_MEMORY_MIB,
        "node_pools": pools,
    }
    if sharing.asks_share(pod.annotations):
        spec.update(_share_fields(cluster, group, pod, errors))
    if not spec["node_pools"]:
        errors["node_pools"] = [f"Cluster {cluster.name} has no node pool of its own."]
    if size > 1 and kind == WorkloadKind.INFERENCE:
        spec["replicas"] = size
    elif size > 1:
        kind = WorkloadKind.DISTRIBUTED
        spec["workers"] = size
    priority = labels.get(PRIORITY) or (
        pod.priority_class if pod.priority_class in PriorityClass.values else ""
    )
    if priority:
        spec["priority_class"] = priority
    if PREEMPTIBLE in labels:
        spec["preemptible"] = labels[PREEMPTIBLE]
    if errors:
        raise ValidationFailed(errors)
    return kind, spec


def _share_fields(
    cluster: Cluster, group: Group, pod: NativePod, errors: dict[str, list[str]]
) -> dict[str, Any]:
    """The submit fields of a GPU share (as the portal's form sends one); what is wrong
    with it goes into `errors`, keyed by the annotation or field to change. Every pod of a
    gang must be able to take its GPU environment (docs/kubernetes-native.md)."""
    fields, problems = sharing.share_request(pod.annotations)
    errors.update(problems)
    key = _field_source("gpus", pod)
    if any(sharing.requests_whole_gpus(p.raw) for p in group.waiting):
        errors.setdefault(key, []).append(
            f"A pod asking for part of a GPU asks for no {GPU_RESOURCE}: "
            f"remove resources.limits[{GPU_RESOURCE}]."
        )
    root, mps = str(config_of(cluster).get("mps_root") or MPS_ROOT), mps_enabled(cluster.config)
    for member in group.waiting:
        if missing := sharing.missing_parts(member.raw, mps_root=root, mps=mps):
            errors.setdefault(key, []).append(
                f"Pod {member.name} needs {'; '.join(missing)} to share a GPU."
            )
            break
    names = [n for p in group.waiting if (n := sharing.gpu_config_of(p.raw))]
    if len(set(names)) < len(names):
        errors.setdefault(key, []).append(
            "Each pod needs a ConfigMap of its own in envFrom (pods of one template share "
            "one name: let GPUPool's admission webhook name them)."
        )
    return fields


def _image(pod: NativePod) -> str:
    containers = (pod.raw.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("image") or "")[:300]


def _cluster_pools(cluster: Cluster) -> list[str]:
    """The pools whose nodes are all on this cluster: where its pods can be bound."""
    here = set(
        Node.objects.filter(cluster=cluster, pool__isnull=False).values_list(
            "pool__name", flat=True
        )
    )
    elsewhere = set(
        Node.objects.exclude(cluster=cluster)
        .filter(pool__name__in=here)
        .values_list("pool__name", flat=True)
    )
    return sorted(here - elsewhere)


def _owner_name(group: Group) -> str:
    """A gang's owner's name (a CronJob's run: its Job's; a LeaderWorkerSet's group: the
    set's and the group's index), a pod's own when alone."""
    if group.target is not None:
        name = group.target.name
    elif LWS_GROUP in group.waiting[0].labels and group.owner is not None:  # <lws>-<group>
        name = f"{group.owner.name[:50]}-{group.waiting[0].labels.get(LWS_INDEX, '')[:6]}"
    elif group.alone or group.owner is None:
        name = group.waiting[0].name
    else:
        name = group.owner.name
    return name[:57].rstrip("-")


def _free_name(project: Project, group: Group, taken: set[tuple[int, str]]) -> str:
    """The owner's (or the pod's) name, with a piece of its uid when the project has a
    workload of that name already (`taken`: read for the pass, and grown as it queues)."""
    name = _owner_name(group)
    if (project.pk, name) in taken:
        name = f"{name[:50].rstrip('-')}-{group.key.replace('-', '')[:6]}"
    return name


def _native_record(group: Group, pod: NativePod, *, slots: bool = False) -> dict[str, Any]:
    """`slots`: pod i of a new workload is its i-th waiting pod, written with the row (what
    `_fill_slots` would write at once after it)."""
    owner = group.owner
    return {
        "key": group.key,
        "namespace": group.namespace,
        "owner": owner.as_dict
        if owner
        else {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
        "target": group.target.as_dict if group.target else None,
        "links": sorted(group.links),
        "manager": _manager(pod),
        "pods": [[p.name, p.uid] for p in group.waiting[: group.size or 1]] if slots else [],
    }


def _described(group: Group, pod: NativePod) -> str:
    """`CronJob ns/nightly`, `Job ns/nightly-123 of CronJob ns/nightly`, `Pod ns/web-1 of
    Deployment ns/web`, with who made the pod."""
    owner, ns = group.owner, group.namespace
    what = f"{owner.kind} {ns}/{owner.name}" if owner else f"Pod {ns}/{pod.name}"
    run = group.target if group.target != owner else None
    if group.alone and owner is not None:
        what = f"Pod {ns}/{pod.name} of {what}"
    elif run is not None:
        what = f"{run.kind} {ns}/{run.name} of {what}"
    manager = _manager(pod)
    return what + (f" (made by {manager})" if manager else "")


def _manager(pod: NativePod) -> str:
    """Who made the pod, as its first field manager says (kubectl-create, a controller)."""
    managers = (m.get("manager", "") for m in pod.raw["metadata"].get("managedFields") or [])
    return next((m for m in managers if m), "")[:100]


def _submitter() -> Any:
    """The user native workloads are submitted as: no password, cannot sign in."""
    user, made = get_user_model().objects.get_or_create(
        username=SUBMITTER, defaults={"is_active": False, "first_name": "Kubernetes"}
    )
    if made:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def _fill_slots(workload: Workload, group: Group) -> None:
    """Pod i of the workload is the pod in slot i: a pod we bound keeps the slot its
    Binding named; a slot whose pod is gone is free; pods waiting fill free slots, oldest
    first."""
    record = workload.spec["native"]
    slots: list = list(record.get("pods") or [])
    slots += [None] * (workload.pods - len(slots))
    listed = {p.uid: p for p in group.pods}
    slots = [s if s and s[1] in listed else None for s in slots[: workload.pods]]
    placed = {s[1] for s in slots if s}
    for pod in group.pods:
        index = pod.annotations.get(kube.POD_INDEX)
        if (
            pod.uid not in placed
            and pod.annotations.get(kube.WORKLOAD_ID) == str(workload.pk)
            and index is not None
            and index.isdigit()
            and int(index) < len(slots)
            and slots[int(index)] is None
        ):
            slots[int(index)] = [pod.name, pod.uid]
            placed.add(pod.uid)
    for pod in group.waiting:
        if pod.uid in placed or None not in slots:
            continue
        slots[slots.index(None)] = [pod.name, pod.uid]
        placed.add(pod.uid)
    # A new controller of its pods (a JobSet's Job made again) is linked to it once.
    links = sorted(set(record.get("links") or []) | group.links)
    if slots != record.get("pods") or links != sorted(record.get("links") or []):
        workload.spec = {**workload.spec, "native": {**record, "pods": slots, "links": links}}
        workload.save(update_fields=["spec"])


def _tell_pending(backend: KubernetesBackend, workload: Workload, group: Group) -> None:
    """A pending workload's pods say why they wait (PodScheduled False, an event)."""
    if workload.state != S.PENDING or not workload.pending_reason:
        return
    for pod in group.waiting:
        kube.tell_waiting(backend, pod, workload.pending_reason[:1024])


def _stopped_before(last: Workload | None, group: Group) -> bool:
    """The group's pods are those of a run the portal stopped (made before it stopped)."""
    if last is None or last.state != S.STOPPED or last.finished_at is None:
        return False
    return all(
        (made := parse_datetime(p.created)) is None or made <= last.finished_at for p in group.live
    )


def _enforce_stop(backend: KubernetesBackend, group: Group) -> None:
    """Stopped in the portal: its owner is suspended where it can be (its controller
    removes the pods and keeps it); a bare pod is deleted; pods of other owners are
    deleted (their controller may make new ones: a new run, queued again)."""
    if not group.live:
        return
    if group.target is not None and owners.suspend_owner(backend, group.namespace, group.target):
        return
    for pod in group.live:
        if not pod.node_name:  # a bound one is evicted by the reconcile, with its grace
            kube.delete(backend, pod.namespace, pod.name)


def _gone(backend: KubernetesBackend, workload: Workload, group: Group | None) -> None:
    """A workload with no live pod. Admitted or running: the reconcile finds its pods
    gone (requeued as lost, or finished by their phases). Pending: stopped, unless its
    gang's owner is still there to make its pods again. Stopped in the portal meanwhile:
    nothing."""
    if workload.state != S.PENDING:
        return
    record = workload.spec["native"]
    owner = record["owner"]
    # Records made before owners were walked name a Job as their owner, and no target.
    target = record.get("target", owner if owner["kind"] == "Job" else None)
    if target is not None:
        ref = OwnerRef.of(target)
        try:
            found = owners.read_owner(backend, record["namespace"], ref)
        except KindNotServed:
            found = None
        if found is not None and found["metadata"].get("uid") == ref.uid:
            if finished := _finished(found):
                _stop(workload, "OwnerFinished", f"{ref.kind} {ref.name} {finished}.")
            return  # its controller makes the pods again (after an eviction, say)
    _stop(
        workload,
        "PodsDeleted",
        f"Its pods were deleted outside GPUPool ({owner['kind']} {owner['name']}).",
    )


FINISHED = {"Complete": "completed", "Completed": "completed", "Succeeded": "succeeded"}


def _finished(owner: dict) -> str:
    """ "completed" or "failed" when the owner says it is done (a Job's, a JobSet's or a
    Kubeflow job's conditions; a RayJob's deployment status); "" while it runs."""
    status = owner.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in FINISHED:
            return FINISHED[condition["type"]]
        if condition.get("status") == "True" and condition.get("type") == "Failed":
            return "failed"
    return {"Complete": "completed", "Failed": "failed"}.get(
        str(status.get("jobDeploymentStatus")), ""
    )


def _stop(workload: Workload, reason: str, message: str) -> None:
    """Stopped from the cluster's side, with the reason every page shows (its message)."""
    workload_transition(workload, S.STOPPED, reason=reason, message=message)
    workload.message = message
    workload.save(update_fields=["message"])
