"""Submit a Kubernetes manifest (`gpupool submit -f job.yaml`, the "From YAML" form, `POST
/api/v1/manifests/`): the object is created in the project's namespace with GPUPool's
scheduler named, and the intake queues it on the next reconcile pass like any object made
with kubectl (clusters/native.py, docs/kubernetes-native.md).

`manifest_submit` checks, in order, each refusal a field error (`manifest`, `cluster`):
1. who may submit to the project may submit a manifest;
2. the text: at most MANIFEST_MAX_BYTES, one YAML document, no anchors or aliases, a
   mapping, of a kind GPUPool can create (clusters/manifest_kinds.py) that the project
   allows (`Project.manifest_kinds`, among the platform's GPUPOOL_MANIFEST_KINDS), with
   its pod templates where its kind has them (those its controller would make up, as a
   RayJob's default submitter, written out: `with_defaults`);
3. the cluster: the Kubernetes one whose pools the project has quota in (the submitter
   picks when there are several);
4. the object: its namespace is the project's (set when left out, refused when another),
   each pod template names the cluster's scheduler; a Pod asking for part of a GPU by
   annotation is given what sharing needs (clusters/native_sharing.py; the pods of any
   other kind get it from the project's admission webhook, which names each pod's
   ConfigMap, so they ask one only in a project that enforces the scheduler); none breaks
   the `baseline` Pod Security checks when the namespace enforces baseline or restricted;
   the rest is the API server's to refuse, its message the error (any kind but a Pod is
   first created with dryRun=All, and so is a pod of each of its templates: the server
   admits a Job and refuses its pods only later; a kind whose CRD is missing is a 404);
5. created by the cluster's backend, and the audit log says who made what where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import jsonpatch
import yaml
from django.core.exceptions import PermissionDenied
from django.db import transaction

from clusters import native_sharing as sharing
from clusters.backends import MANAGED_BY, MANAGED_BY_LABEL, BackendError
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes import native as kube
from clusters.backends.kubernetes.manifests import MPS_ROOT
from clusters.manifest_kinds import KINDS, kind_of, platform_kinds, pod_templates, with_defaults
from clusters.models import Backend, Cluster
from clusters.native import FRACTION, GANG, GPU_MEMORY, KIND, PREEMPTIBLE, PRIORITY
from clusters.stored import config_of
from portal.audit import audit_log
from portal.errors import ValidationFailed
from portal.models import Project
from portal.permissions import can_submit_to_project
from scheduling.bounds import MANIFEST_MAX_BYTES

ENFORCE = "pod-security.kubernetes.io/enforce"
SUBMITTED_BY = "gpupool.io/submitted-by"
MAX_DEPTH = 32  # a Pod or Job is about 10 levels deep
GPUPOOL_PREFIX = "gpupool.io/"
# The labels and annotations users set on their pods (docs/kubernetes-native.md).
USER_KEYS = {KIND, PRIORITY, PREEMPTIBLE, GANG, FRACTION, GPU_MEMORY}


@dataclass(frozen=True, slots=True)
class Submitted:
    """What was created, and where to see it."""

    api_version: str
    kind: str
    name: str
    namespace: str
    cluster: str
    uid: str


def manifest_submit(
    *, actor: Any, project: Project, text: str, cluster: Cluster | None = None
) -> Submitted:
    """Create the manifest's object in the project's namespace (see the module's steps)."""
    if not can_submit_to_project(actor, project):
        raise PermissionDenied(f"You may not submit work to project {project.name}.")
    body = manifest_parse(text, project)
    with_defaults(body)
    templates = pod_templates(body)
    _check_namespace(body, project.namespace)
    for path, template in templates:
        _check_keys(_join(path, "metadata"), template.get("metadata") or {})
    target = _cluster_for(project, cluster)
    backend = KubernetesBackend(target)
    try:
        backend.ensure_namespace(project.namespace, project.name)
        labels = kube.namespace_labels(backend, project.namespace)
        _name_scheduler(templates, kube.scheduler_name(backend))
        _give_gpu_share(body, templates, project, target)
        _check_baseline(templates, project.namespace, labels.get(ENFORCE, ""))
        annotations = body["metadata"].setdefault("annotations", {})
        annotations.update({SUBMITTED_BY: actor.get_username(), kube.SUBMISSION: uuid4().hex})
        created = backend.create_manifest(body, KINDS[_pair(body)].plural, templates)
    except kube.ManifestRefused as exc:
        raise ValidationFailed({"manifest": [f"The cluster refused it: {exc}"]}) from exc
    except BackendError as exc:
        raise ValidationFailed({"cluster": [f"Cluster {target.name}: {exc}"]}) from exc
    meta = created.get("metadata") or {}
    submitted = Submitted(
        body["apiVersion"], body["kind"], meta.get("name", ""), project.namespace,
        target.name, meta.get("uid", ""),
    )  # fmt: skip
    with transaction.atomic():
        audit_log(
            actor=actor,
            action="manifest.submit",
            obj=project,
            after={
                "kind": f"{submitted.api_version} {submitted.kind}",
                "name": submitted.name,
                "namespace": submitted.namespace,
                "cluster": submitted.cluster,
            },
            department=project.department,
        )
    return submitted


def submitted_message(made: Submitted, project: Project) -> str:
    """What was made and where to see it, for the API, the CLI and the form."""
    return (
        f"Created {made.kind} {made.namespace}/{made.name} on cluster {made.cluster}. The "
        f"next reconcile pass (a few seconds) queues it as a workload of {project.name}: "
        f"`gpupool list --project {project.name}`, or `kubectl describe` it."
    )


def allowed_kinds(project: Project) -> list[str]:
    """ "apiVersion kind" of each kind the project allows (its admins' choice, among the
    platform admin's GPUPOOL_MANIFEST_KINDS) that GPUPool can create, in the platform's order."""
    chosen = set(project.manifest_kinds or [])
    return [name for name in platform_kinds() if name in chosen]


def manifest_parse(text: str, project: Project) -> dict[str, Any]:
    """The manifest as a mapping of a kind the project allows; ValidationFailed on
    `manifest`."""
    if len(text.encode()) > MANIFEST_MAX_BYTES:
        _refuse(f"At most {MANIFEST_MAX_BYTES // 1024} KiB of YAML (one object).")
    try:
        _check_events(text)
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        _refuse(f"Not valid YAML (one document): {str(exc)[:300]}")
    if not isinstance(body, dict):
        _refuse("Give one Kubernetes object: a mapping with apiVersion, kind and metadata.")
    _check_kind(body, project)
    if not isinstance(body.get("metadata") or {}, dict) or not isinstance(body.get("spec"), dict):
        _refuse("metadata and spec must be mappings.")
    body["metadata"] = dict(body.get("metadata") or {})
    if not isinstance(body["metadata"].get("annotations") or {}, dict):
        _refuse("metadata.annotations must be a mapping.")
    return body


def _check_kind(body: dict, project: Project) -> None:
    """A kind GPUPool knows how to create (clusters/manifest_kinds.py), and one the project
    allows."""
    given = f"{str(body.get('apiVersion'))[:80]} {str(body.get('kind'))[:80]}"
    allowed = allowed_kinds(project)
    if kind_of(body) is None:
        _refuse(
            f"apiVersion/kind: GPUPool cannot create {given}; it creates "
            f"{', '.join(f'{v} {k}' for v, k in KINDS)}."
        )
    if given not in allowed:
        _refuse(
            f"kind: {given} may not be submitted to project {project.name}; allowed there: "
            f"{', '.join(allowed) or 'none'} (an admin of its department allows more on the "
            "project's edit page)."
        )


def _pair(body: dict) -> tuple[str, str]:
    return body["apiVersion"], body["kind"]


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _check_events(text: str) -> None:
    """Refuse what a small text could still blow up: aliases (a few lines can stand for a
    huge object) and deep nesting (PyYAML builds objects recursively: 20,000 brackets
    would exhaust Python's stack). One pass over the parser's events, no object built."""
    depth = documents = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                _refuse(
                    "One object per submission: this text has more than one YAML document "
                    "(---); submit each on its own."
                )
        if isinstance(event, yaml.AliasEvent):
            _refuse("YAML anchors and aliases (*name) are not accepted: write the values out.")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                _refuse(f"Nested more than {MAX_DEPTH} levels deep.")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _refuse(message: str) -> Any:
    raise ValidationFailed({"manifest": [message]})


def manifest_cluster(value: str) -> Cluster:
    """An enabled Kubernetes cluster by name (or id); ValidationFailed on `cluster`."""
    clusters = Cluster.objects.filter(backend=Backend.KUBERNETES, enabled=True)
    found = clusters.filter(name=value).first()
    if found is None and value.isdigit() and len(value) < 19:
        found = clusters.filter(pk=int(value)).first()
    if found is None:
        raise ValidationFailed({"cluster": [f"No enabled Kubernetes cluster {value[:63]}."]})
    return found


def _cluster_for(project: Project, chosen: Cluster | None) -> Cluster:
    """The Kubernetes cluster whose pools the project has quota in; the chosen one must
    be one of them, and one must be chosen when there are several."""
    candidates = list(
        Cluster.objects.filter(
            backend=Backend.KUBERNETES,
            enabled=True,
            node_pools__in=project.quotas.values("node_pool"),
        )
        .distinct()
        .order_by("name")
    )
    names = ", ".join(c.name for c in candidates)
    if chosen is not None and chosen not in candidates:
        where = f"one of {names}" if candidates else "none: ask an admin for quota"
        raise ValidationFailed(
            {"cluster": [f"Project {project.name} has no quota on {chosen.name}; {where}."]}
        )
    if chosen is not None:
        return chosen
    if not candidates:
        raise ValidationFailed(
            {"cluster": [f"Project {project.name} has no quota on a Kubernetes cluster."]}
        )
    if len(candidates) > 1:
        raise ValidationFailed({"cluster": [f"Choose the cluster: {names}."]})
    return candidates[0]


def _check_namespace(body: dict, namespace: str) -> None:
    """The object goes to the project's namespace: set when left out, another refused."""
    meta = body["metadata"]
    given = meta.get("namespace")
    if given not in (None, "", namespace):
        _refuse(
            f"metadata.namespace: this project's namespace is {namespace}; leave it out or "
            f"give that one (not {given!r})."
        )
    meta["namespace"] = namespace
    _check_keys("metadata", meta)


def _name_scheduler(templates: list[tuple[str, dict]], scheduler: str) -> None:
    """Every pod the object makes names the cluster's scheduler; another is refused."""
    for path, template in templates:
        spec = template["spec"]
        if spec.get("schedulerName") not in (None, "", scheduler):
            _refuse(
                f"{_join(path, 'spec')}.schedulerName: pods submitted here are scheduled by "
                f"{scheduler} (not {spec['schedulerName']!r}); leave it out."
            )
        spec["schedulerName"] = scheduler


def _check_baseline(templates: list[tuple[str, dict]], namespace: str, level: str) -> None:
    """Where the namespace enforces baseline or restricted, what the baseline level forbids
    (in what was submitted, and what sharing a GPU added)."""
    if level not in ("baseline", "restricted"):
        return
    for path, template in templates:
        if broken := baseline_violations(template["spec"]):
            _refuse(
                f"{_join(path, 'spec')}: namespace {namespace} enforces the {level} Pod "
                f"Security level, which forbids {'; '.join(broken)}."
            )


def _give_gpu_share(
    body: dict, templates: list[tuple[str, dict]], project: Project, cluster: Cluster
) -> None:
    """A Pod asking for part of a GPU gets what sharing needs (hostIPC, its GPU's MPS pipe
    mounted from the MPS root, its GPU environment from a ConfigMap named after it), as the
    webhook gives kubectl's pods.
    The pods of other kinds are named only when their controller makes them: the project's
    webhook names each one's ConfigMap, so they ask for a share only where the project
    enforces GPUPool's scheduler. Pod Security then checks the result (`baseline` forbids
    hostIPC)."""
    for path, template in templates:
        if not sharing.asks_share((template.get("metadata") or {}).get("annotations") or {}):
            continue
        if path and not project.enforce_scheduler:
            _refuse(
                f"{path}.metadata.annotations: the pods of a {body['kind']} share GPUs "
                f"({FRACTION}, {GPU_MEMORY}) only in a project that enforces GPUPool's "
                "scheduler, whose webhook names each pod's GPU ConfigMap; submit Pods, or "
                "ask an admin to enforce the scheduler in this project."
            )
        if path:
            continue
        config_map = sharing.config_map_of_new_pod(body, salt=uuid4().hex[:8])
        root = str(config_of(cluster).get("mps_root") or MPS_ROOT)
        operations = sharing.sharing_patch(body, config_map=config_map, mps_root=root)
        jsonpatch.apply_patch(body, operations, in_place=True)


def _check_keys(where: str, meta: dict) -> None:
    """GPUPool's own labels and annotations (its identity, `bound-by`, a slot's workload)
    make an object look like one GPUPool made or bound: only those a user may set pass."""
    for field in ("labels", "annotations"):
        for key, value in (meta.get(field) or {}).items():
            ours = str(key).startswith(GPUPOOL_PREFIX) and key not in USER_KEYS
            if ours or (key == MANAGED_BY_LABEL and value == MANAGED_BY):
                _refuse(
                    f"{where}.{field}[{key}]: GPUPool's own; of its keys only "
                    f"{', '.join(sorted(USER_KEYS))} may be set."
                )


def baseline_violations(spec: dict) -> list[str]:
    """What the `baseline` Pod Security level refuses that is cheap to see: host
    namespaces, hostPath volumes, privileged containers, host ports."""
    found = [f"{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    found += [
        f"hostPath volume {v.get('name')!r}"
        for v in _items(spec.get("volumes"))
        if isinstance(v, dict) and v.get("hostPath") is not None
    ]
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in _items(spec.get(key)):
            if not isinstance(container, dict):
                continue
            name = container.get("name")
            if (container.get("securityContext") or {}).get("privileged") is True:
                found.append(f"privileged container {name!r}")
            if any(
                isinstance(p, dict) and p.get("hostPort") for p in _items(container.get("ports"))
            ):
                found.append(f"hostPort in container {name!r}")
    return found


def _items(value: Any) -> list:
    """A list field as given; anything else (the API server refuses it) as empty."""
    return value if isinstance(value, list) else []
