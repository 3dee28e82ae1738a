"""Workloads from pods made outside GPUPool: kubectl, Helm, an operator (issue 26).

A pod in a project's namespace whose `spec.schedulerName` is GPUPool's (the cluster's
config `scheduler_name`, default `gpupool`) is queued like portal work, under the
project's quota, priority and policy. Pods are grouped into one workload per owner:
- a pod with the annotation `gpupool.io/min-available: N` is one of a gang of N pods of
  its controller (a JobSet's, a PyTorchJob's, any operator's);
- a Job's pods are one gang of min(parallelism, completions) pods;
- any other pod (bare, or a ReplicaSet's) is a workload of its own.
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
4. a workload stopped in the portal suspends its Job (or deletes its bare pod), so that
   nothing makes the pods again; a pending workload whose pods are gone (deleted, or its
   owner is) stops.
Binding, eviction and the phases read back are the reconcile's, as for GPUPool's own pods.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.utils.dateparse import parse_datetime

from clusters import native_sharing as sharing
from clusters.backends import BackendError
from clusters.backends.kubernetes import native as kube
from clusters.backends.kubernetes.manifests import GPU_RESOURCE, MPS_ROOT
from clusters.models import Cluster, Node
from clusters.sharing import mps_enabled
from portal.errors import ValidationFailed
from portal.models import Project
from scheduling.intake import intake_pass, workload_submit_native
from scheduling.lifecycle import workload_transition
from scheduling.models import FINISHED_STATES, PriorityClass, Workload, WorkloadKind
from scheduling.models import WorkloadState as S

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend
    from clusters.backends.kubernetes.native import NativePod, OwnerRef

log = logging.getLogger(__name__)

GANG = "gpupool.io/min-available"
KIND = "gpupool.io/kind"
PRIORITY = "gpupool.io/priority-class"
PREEMPTIBLE = "gpupool.io/preemptible"
FRACTION, GPU_MEMORY = sharing.FRACTION, sharing.GPU_MEMORY
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
    owner: OwnerRef | None
    size: int | None  # from the annotation or the owner; None: one pod
    pods: list[NativePod] = field(default_factory=list)

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
    def reads_job(self) -> bool:
        """Its size is its owner's (a Job's), read when it is queued."""
        return self.size is None and self.owner is not None and self.owner.suspendable


@dataclass(slots=True)
class Intake:
    """What the groups queued in one pass need, read once for all of them (a pass may
    queue a thousand): the cluster's pools, the submitter, the names taken in their
    projects, their Jobs (read on the backend's thread pool)."""

    pools: list[str]
    submitter: Any
    taken: set[tuple[int, str]]  # (project pk, workload name)
    jobs: dict[str, dict | BackendError | None]  # owner uid -> the Job, or why it is not read


def native_sync(cluster: Cluster, backend: KubernetesBackend) -> list[str]:
    """One intake pass over the pods that name our scheduler; the errors to show on the
    cluster (one bad pod never stops the others)."""
    errors: list[str] = []
    pods = backend.native_pods()
    projects = _projects(backend, {p.namespace for p in pods}, errors)
    groups = _groups([p for p in pods if p.namespace in projects])
    native = Workload.objects.filter(cluster=cluster, spec__has_key="native")
    active = {
        w.spec["native"]["key"]: w
        for w in native.exclude(state__in=FINISHED_STATES).select_related("project")
    }
    fresh = [key for key in groups if key not in active]
    last: dict[str, Workload] = {}
    for workload in native.filter(spec__native__key__in=fresh).order_by("pk"):
        last[workload.spec["native"]["key"]] = workload
    stopped = {key for key in fresh if _stopped_before(last.get(key), groups[key])}
    new = {key for key in fresh if groups[key].waiting and key not in stopped}
    intake = _intake(backend, cluster, projects, [groups[key] for key in new]) if new else None
    with intake_pass():  # the nodes' sizes, read once for every submit of the pass
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
    for key, workload in active.items():
        if key not in groups:  # every pod gone: no slot holds one
            _fill_slots(workload, Group(key, "", None, None))
        if key not in groups or not groups[key].live:
            try:
                _gone(backend, workload, groups.get(key))
            except BackendError as exc:
                errors.append(str(exc))
    return errors


def _intake(
    backend: KubernetesBackend, cluster: Cluster, projects: dict[str, Project], new: list[Group]
) -> Intake:
    """What the new groups of this pass need, in a few statements and parallel reads."""
    names = {_owner_name(g) for g in new}
    project_ids = {projects[g.namespace].pk for g in new}
    taken = set(
        Workload.objects.filter(project_id__in=project_ids, name__in=names).values_list(
            "project_id", "name"
        )
    )
    owners = {g.owner.uid: (g.namespace, g.owner) for g in new if g.reads_job and g.owner}

    def read(item: tuple[str, OwnerRef]) -> dict | BackendError | None:
        try:
            return kube.read_owner(backend, *item)
        except BackendError as exc:  # that group's error, in its turn
            return exc

    with ThreadPoolExecutor(max_workers=backend.workers) as pool:
        jobs = dict(zip(owners, pool.map(read, owners.values()), strict=True))
    return Intake(_cluster_pools(cluster), _submitter(), taken, jobs)


def _projects(
    backend: KubernetesBackend, namespaces: set[str], errors: list[str]
) -> dict[str, Project]:
    """The projects whose namespaces hold such pods, where the namespace is ours (made or
    adopted by this installation: another GPUPool's is refused, and its pods left alone)."""
    found = {}
    for project in Project.objects.filter(namespace__in=namespaces).select_related("department"):
        try:
            backend.ensure_namespace(project.namespace, project.name)
        except BackendError as exc:
            errors.append(str(exc))
            continue
        found[project.namespace] = project
    return found


def _groups(pods: list[NativePod]) -> dict[str, Group]:
    """The pods by workload-to-be: a gang's by its controller, any other pod alone. A
    Job's gang size is read when it is queued (`_queue`), not on every pass."""
    groups: dict[str, Group] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.name)):
        size: int | None = None
        key = pod.uid
        owner = pod.owner
        if owner is not None and GANG in pod.annotations:
            key, size = owner.uid, _gang_size(pod.annotations[GANG])
        elif owner is not None and owner.suspendable:
            key = owner.uid
        group = groups.setdefault(key, Group(key, pod.namespace, owner, size))
        group.pods.append(pod)
    return groups


def _gang_size(value: str) -> int:
    """The annotation's value; 0 when it is not a whole number (refused with a message)."""
    try:
        return int(value)
    except ValueError:
        return 0


def _job_gang(job: dict | None) -> int:
    """A Job runs min(parallelism, completions) pods at once (parallelism 1 by default)."""
    spec = (job or {}).get("spec") or {}
    parallelism = spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    return max(1, min(parallelism, int(completions)) if completions else parallelism)


def _queue(
    backend: KubernetesBackend, cluster: Cluster, project: Project, group: Group, intake: Intake
) -> None:
    """A workload for a new group, or the reason it cannot be one on each of its pods."""
    first = group.waiting[0]
    if group.reads_job and group.owner is not None:
        job = intake.jobs.get(group.owner.uid)
        if isinstance(job, BackendError):
            raise job
        group.size = _job_gang(job)
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
        workload = workload_submit_native(
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
        message = "GPUPool cannot queue this pod: " + "; ".join(
            f"{_field_source(name, first)}: {' '.join(texts)}"
            for name, texts in sorted(exc.errors.items())
        )
        for pod in group.waiting:
            kube.tell_waiting(backend, pod, message)
        return
    intake.taken.add((project.pk, name))
    _fill_slots(workload, group)
    log.info("%s: queued %s as workload %s", cluster.name, _described(group, first), workload.pk)


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
    root, mps = str((cluster.config or {}).get("mps_root") or MPS_ROOT), mps_enabled(cluster.config)
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
    return (group.owner.name if group.owner else group.waiting[0].name)[:57].rstrip("-")


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
        "owner": (
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
            }
            if owner
            else {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
        ),
        "manager": _manager(pod),
        "pods": [[p.name, p.uid] for p in group.waiting[: group.size or 1]] if slots else [],
    }


def _described(group: Group, pod: NativePod) -> str:
    owner = group.owner
    what = (
        f"{owner.kind} {group.namespace}/{owner.name}"
        if owner
        else f"Pod {group.namespace}/{pod.name}"
    )
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
    if slots != record.get("pods"):
        workload.spec = {**workload.spec, "native": {**record, "pods": slots}}
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
    """Stopped in the portal: its Job is suspended (its controller removes the pods and
    keeps the Job); a bare pod is deleted; pods of other owners are deleted (their
    controller may make new ones: a new run, queued again)."""
    if not group.live:
        return
    if group.owner is not None and kube.suspend_owner(backend, group.namespace, group.owner):
        return
    for pod in group.live:
        if not pod.node_name:  # a bound one is evicted by the reconcile, with its grace
            kube.delete(backend, pod.namespace, pod.name)


def _gone(backend: KubernetesBackend, workload: Workload, group: Group | None) -> None:
    """A workload with no live pod. Admitted or running: the reconcile finds its pods
    gone (requeued as lost, or finished by their phases). Pending: stopped, unless its
    Job is still there to make its pods again. Stopped in the portal meanwhile: nothing."""
    if workload.state != S.PENDING:
        return
    owner = workload.spec["native"]["owner"]
    ref = kube.OwnerRef(owner["apiVersion"], owner["kind"], owner["name"], owner["uid"])
    if ref.suspendable:
        job = kube.read_owner(backend, workload.spec["native"]["namespace"], ref)
        conditions = {
            c.get("type"): c.get("status")
            for c in ((job or {}).get("status") or {}).get("conditions") or []
        }
        if job is not None and job["metadata"].get("uid") == owner["uid"]:
            for condition, said in (("Complete", "completed"), ("Failed", "failed")):
                if conditions.get(condition) == "True":
                    _stop(workload, "OwnerFinished", f"Job {owner['name']} {said}.")
                    break
            return  # its controller makes the pods again (after an eviction, say)
    _stop(
        workload,
        "PodsDeleted",
        f"Its pods were deleted outside GPUPool ({owner['kind']} {owner['name']}).",
    )


def _stop(workload: Workload, reason: str, message: str) -> None:
    """Stopped from the cluster's side, with the reason every page shows (its message)."""
    workload_transition(workload, S.STOPPED, reason=reason, message=message)
    workload.message = message
    workload.save(update_fields=["message"])
