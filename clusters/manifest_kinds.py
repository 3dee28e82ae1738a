"""The kinds a manifest may be (`gpupool submit -f`, clusters/manifest_submit.py): for each,
its resource (the URL's plural) and where its pod templates are, so that every pod its
controller makes names GPUPool's scheduler, and is checked (GPU shares, Pod Security,
GPUPool's own keys) before anything is written.

A template path is dotted; `[]` walks a list's items, `{}` a mapping's values (by key), a
trailing `?` marks a template that may be left out. The paths follow each kind's own API
(Kubernetes 1.36, JobSet v1alpha2, Kubeflow training-operator v1, KubeRay v1, LWS v1).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from portal.errors import ValidationFailed

KUBEFLOW = "kubeflow.org/v1"
RAY = "ray.io/v1"
RAY_CLUSTER = ("headGroupSpec.template", "workerGroupSpecs[].template")  # in its spec


@dataclass(frozen=True, slots=True)
class ManifestKind:
    plural: str
    templates: tuple[str, ...]  # "" for a Pod: the object is its own template

    @property
    def pod(self) -> bool:
        return self.templates == ("",)


KINDS: dict[tuple[str, str], ManifestKind] = {
    ("v1", "Pod"): ManifestKind("pods", ("",)),
    ("batch/v1", "Job"): ManifestKind("jobs", ("spec.template",)),
    ("batch/v1", "CronJob"): ManifestKind("cronjobs", ("spec.jobTemplate.spec.template",)),
    ("apps/v1", "Deployment"): ManifestKind("deployments", ("spec.template",)),
    ("apps/v1", "StatefulSet"): ManifestKind("statefulsets", ("spec.template",)),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): ManifestKind(
        "jobsets", ("spec.replicatedJobs[].template.spec.template",)
    ),
    **{
        (KUBEFLOW, kind): ManifestKind(kind.lower() + "s", (f"spec.{field}{{}}.template",))
        for kind, field in (
            ("PyTorchJob", "pytorchReplicaSpecs"),
            ("MPIJob", "mpiReplicaSpecs"),
            ("TFJob", "tfReplicaSpecs"),
            ("XGBoostJob", "xgbReplicaSpecs"),
            ("JAXJob", "jaxReplicaSpecs"),
        )
    },
    (RAY, "RayCluster"): ManifestKind("rayclusters", tuple(f"spec.{p}" for p in RAY_CLUSTER)),
    # The RayCluster a RayJob makes is the gang; its submitter pod (K8sJobMode: a Job that
    # KubeRay makes once the cluster is ready) names GPUPool's scheduler too, as a workload
    # of its own (`with_defaults` writes KubeRay's default template out when none is given).
    (RAY, "RayJob"): ManifestKind(
        "rayjobs",
        (*(f"spec.rayClusterSpec.{path}" for path in RAY_CLUSTER), "spec.submitterPodTemplate?"),
    ),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ManifestKind(
        "leaderworkersets",
        ("spec.leaderWorkerTemplate.leaderTemplate?", "spec.leaderWorkerTemplate.workerTemplate"),
    ),
}
NAMES = [f"{api_version} {kind}" for api_version, kind in KINDS]
SUBMITTER = "submitterPodTemplate"  # a RayJob's
MAX_TEMPLATES = 16  # a PyTorchJob has 2, a RayCluster 1 + its worker groups


def platform_kinds() -> list[str]:
    """The kinds the platform admin offers projects (GPUPOOL_MANIFEST_KINDS, in its order),
    those GPUPool can create: a name it does not know is never offered nor taken."""
    return [name for name in settings.GPUPOOL_MANIFEST_KINDS if name in NAMES]


def kind_of(body: dict) -> ManifestKind | None:
    return KINDS.get((body.get("apiVersion"), body.get("kind")))  # type: ignore[arg-type]


def with_defaults(body: dict) -> None:
    """Write out the pod templates the kind's controller would make up itself, so that
    their pods name GPUPool's scheduler too: a RayJob in K8sJobMode (the default) without
    `submitterPodTemplate` gets KubeRay's own default (ray-operator's
    GetDefaultSubmitterTemplate, v1.1 to v1.4: the head's image, 500m/200Mi requested, 1/1Gi
    at most, restartPolicy Never). HTTPMode and InteractiveMode make no submitter pod;
    SidecarMode's submitter is a container of the head pod."""
    spec = body.get("spec")
    if (body.get("apiVersion"), body.get("kind")) != (RAY, "RayJob") or not isinstance(spec, dict):
        return
    if spec.get("submissionMode", "K8sJobMode") != "K8sJobMode" or spec.get(SUBMITTER):
        return
    image = _head_image(spec.get("rayClusterSpec"))
    if image is None:
        return  # no head to take it from: pod_templates refuses the RayJob
    spec[SUBMITTER] = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "resources": {
                        "limits": {"cpu": "1", "memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "200Mi"},
                    },
                }
            ],
        }
    }


def _head_image(cluster: Any) -> str | None:
    """The image of the head's Ray container (its first), as KubeRay takes it."""
    try:
        image = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    except (KeyError, IndexError, TypeError):
        return None
    return image if isinstance(image, str) else None


def pod_templates(body: dict) -> list[tuple[str, dict]]:
    """(path, template) of each pod template of the object (for a Pod: ("", the Pod)), each
    a mapping with a `spec` mapping; a missing or malformed one is refused on `manifest`."""
    kind = kind_of(body)
    assert kind is not None  # manifest_parse checked it
    found: list[tuple[str, dict]] = []
    for pattern in kind.templates:
        optional = pattern.endswith("?")
        found += _walk(body, "", re.findall(r"[^.\[{?]+|\[\]|\{\}", pattern), optional=optional)
    if not found:
        _refuse(f"{kind.templates[0].split('[')[0]}: {body['kind']} has no pod template.")
    if len(found) > MAX_TEMPLATES:
        _refuse(f"spec: at most {MAX_TEMPLATES} pod templates in one object.")
    for path, template in found:
        meta = template.get("metadata") or {}
        if not isinstance(template.get("spec"), dict):
            _refuse(f"{_join(path, 'spec')}: a pod template needs a spec (a mapping).")
        if not isinstance(meta, dict) or not isinstance(meta.get("annotations") or {}, dict):
            _refuse(f"{_join(path, 'metadata')}: must be a mapping, its annotations too.")
    return found


def _walk(value: Any, path: str, steps: list[str], *, optional: bool) -> list[tuple[str, dict]]:
    """The values at the steps' path, with their concrete paths (`spec.workerGroupSpecs[1]`)."""
    if not steps:
        if not isinstance(value, dict):
            _refuse(f"{path}: a pod template (a mapping).")
        return [(path, value)]
    step, rest = steps[0], steps[1:]
    if step in ("[]", "{}"):
        items = list(_items(value, path, step))
        return [hit for sub, item in items for hit in _walk(item, sub, rest, optional=False)]
    if not isinstance(value, dict):
        _refuse(f"{path}: a mapping.")
    if value.get(step) is None:
        if optional:
            return []
        _refuse(f"{_join(path, step)}: required (it holds a pod template).")
    return _walk(value[step], _join(path, step), rest, optional=optional)


def _items(value: Any, path: str, step: str) -> Iterator[tuple[str, Any]]:
    if step == "[]":
        if not isinstance(value, list):
            _refuse(f"{path}: a list.")
        yield from ((f"{path}[{index}]", item) for index, item in enumerate(value))
        return
    if not isinstance(value, dict):
        _refuse(f"{path}: a mapping.")
    yield from ((f"{path}.{key}", value[key]) for key in sorted(value, key=str))


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _refuse(message: str) -> Any:
    raise ValidationFailed({"manifest": [message]})
