"""The owners of pods GPUPool schedules but did not make (clusters/native.py walks a pod's
controllers up to its top owner): which kinds it reads, the gang each runs (from its spec),
where its suspend flag is; reading and suspending one.

A kind whose CRD is not installed answers 404 without details (not an object's 404, which
names it): `KindNotServed`, so that the pods are grouped by their own controller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters.backends import BackendError
from clusters.backends.kubernetes.errors import said

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend

KUBEFLOW = "kubeflow.org/v1"
RAY = "ray.io/v1"


def job_gang(job: dict) -> int:
    """A Job runs min(parallelism, completions) pods at once (parallelism 1 by default)."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    return max(1, min(parallelism, int(completions)) if completions else parallelism)


def jobset_gang(jobset: dict) -> int:
    """A JobSet runs all its Jobs at once: over its replicatedJobs, replicas (default 1)
    times the Job template's gang."""
    return sum(
        int(replicated.get("replicas", 1)) * job_gang(replicated.get("template") or {})
        for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []
    )


def replica_specs_gang(field_name: str) -> Callable[[dict], int]:
    """A Kubeflow training job (kubeflow.org/v1) runs every replica of its replica specs
    (Master, Worker, Launcher...; replicas default 1)."""

    def gang(job: dict) -> int:
        specs = (job.get("spec") or {}).get(field_name) or {}
        return sum(int((spec or {}).get("replicas", 1)) for spec in specs.values())

    return gang


def ray_gang(cluster: dict) -> int:
    """A RayCluster's head and the minimum of each worker group (the autoscaler may add
    more later: each such pod comes as a workload of its own)."""
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    return 1 + sum(int(group.get("minReplicas", 0) or 0) for group in groups)


@dataclass(frozen=True, slots=True)
class OwnerKind:
    """A kind of owner GPUPool reads: `plural` its resource; `size` the gang it runs, from
    its spec (None: not a gang of its own, as a ReplicaSet); `suspend` the path of its
    flag (spec.suspend, spec.runPolicy.suspend), () where it has none; `over` the kinds of
    the objects it controls whose pods are of its gang (empty: any)."""

    plural: str
    size: Callable[[dict], int] | None = None
    suspend: tuple[str, ...] = ()
    gang: bool = True
    over: tuple[str, ...] = ()


SUSPEND = ("spec", "suspend")
OWNER_KINDS: dict[tuple[str, str], OwnerKind] = {
    ("batch/v1", "Job"): OwnerKind("jobs", job_gang, SUSPEND),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): OwnerKind("jobsets", jobset_gang, SUSPEND),
    **{
        (KUBEFLOW, kind): OwnerKind(
            kind.lower() + "s", replica_specs_gang(field_name), ("spec", "runPolicy", "suspend")
        )
        for kind, field_name in (
            ("PyTorchJob", "pytorchReplicaSpecs"),
            ("MPIJob", "mpiReplicaSpecs"),
            ("TFJob", "tfReplicaSpecs"),
            ("XGBoostJob", "xgbReplicaSpecs"),
            ("JAXJob", "jaxReplicaSpecs"),
        )
    },
    (RAY, "RayCluster"): OwnerKind("rayclusters", ray_gang, SUSPEND),
    # Its gang is its RayCluster's (and its size); its submitter Job's pod (K8sJobMode, made
    # once the cluster is ready) asks for no GPU and is a workload of its own.
    (RAY, "RayJob"): OwnerKind("rayjobs", None, SUSPEND, over=("RayCluster",)),
    ("apps/v1", "ReplicaSet"): OwnerKind("replicasets", gang=False),  # read for its Deployment
}


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def known(self) -> OwnerKind | None:
        return OWNER_KINDS.get((self.api_version, self.kind))

    @property
    def suspendable(self) -> bool:
        """A kind whose `suspend` stops it without deleting it (its controller removes the
        pods, and makes them again when resumed)."""
        return bool(self.known and self.known.suspend)

    @property
    def as_dict(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }

    @classmethod
    def of(cls, ref: dict) -> OwnerRef:
        """From an ownerReference (or the same four fields in a workload's record)."""
        return cls(ref["apiVersion"], ref["kind"], ref["name"], ref.get("uid", ""))


def controller_of(obj: dict) -> OwnerRef | None:
    """The object's controller: its ownerReference with controller: true."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    found = next((ref for ref in refs if ref.get("controller")), None)
    return OwnerRef.of(found) if found else None


class KindNotServed(BackendError):
    """The API server does not serve the owner's kind (its CRD is not installed)."""


def _owner_api(backend: KubernetesBackend, owner: OwnerRef) -> tuple[Any, list[str]]:
    """The client call's fixed arguments for the owner: group, version, namespace, plural."""
    group, _, version = owner.api_version.rpartition("/")
    return k8s.CustomObjectsApi(backend.api.api_client), [group, version]


def read_owner(backend: KubernetesBackend, namespace: str, owner: OwnerRef) -> dict | None:
    """The owner object, for a kind GPUPool reads (OWNER_KINDS); None for other kinds, and
    for one that is gone (404). KindNotServed when the server has no such kind."""
    if owner.known is None:
        return None
    api, path = _owner_api(backend, owner)
    group, version = path
    url = "/".join(quote(piece, safe="") for piece in (namespace, owner.known.plural, owner.name))
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    try:
        return backend.get_json(
            api.get_namespaced_custom_object,
            f"{base}/namespaces/{url}",
            *path,
            namespace,
            owner.known.plural,
            owner.name,
        )
    except ApiException as exc:
        if exc.status == 404 and not object_named(exc):
            raise KindNotServed(
                f"{owner.kind} {namespace}/{owner.name}: the API server does not serve "
                f"{owner.known.plural} of {owner.api_version} (is its CRD installed?)"
            ) from exc
        if exc.status == 404:
            return None
        raise BackendError(f"{owner.kind} {namespace}/{owner.name}: {said(exc)}") from exc


def object_named(exc: ApiException) -> bool:
    """A 404 about an object (its details name it) rather than about a resource the server
    does not have ("the server could not find the requested resource", no details)."""
    try:
        return bool((json.loads(exc.body or "{}").get("details") or {}).get("name"))
    except (ValueError, AttributeError):
        return False


def suspend_owner(backend: KubernetesBackend, namespace: str, owner: OwnerRef) -> bool:
    """Suspend an owner that can be (its controller deletes its pods and keeps it); False
    for a kind that cannot be suspended, or an owner that is gone."""
    if owner.known is None or not owner.known.suspend:
        return False
    patch: dict[str, Any] = {owner.known.suspend[-1]: True}
    for key in reversed(owner.known.suspend[:-1]):
        patch = {key: patch}
    api, path = _owner_api(backend, owner)
    try:
        backend.call(
            api.patch_namespaced_custom_object,
            *path,
            namespace,
            owner.known.plural,
            owner.name,
            patch,
            _preload_content=False,
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise BackendError(f"suspend {owner.kind} {namespace}/{owner.name}: {said(exc)}") from exc
    return True
