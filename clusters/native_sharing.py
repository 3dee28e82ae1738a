"""GPU fractions for pods made outside GPUPool (kubectl, Helm, an operator: issue 26).

A native pod asks for part of a GPU with an annotation: `gpupool.io/gpu-fraction: "0.5"`
(a portion) or `gpupool.io/gpu-memory: "10Gi"` (an amount of GPU memory). It then shares a
GPU as portal work does (a reservation pod holds the device; docs/gpu-sharing.md), and runs
under the same MPS limits, written by the same function (`clusters.sharing.mps_env`).

Which GPU, and so the pod's environment, is known only when GPUPool binds it, and a pod's
spec cannot change once it is made. So the pod's GPU container takes its GPU environment
from a ConfigMap (`envFrom: [{configMapRef: {name: <pod>-gpupool-gpu}}]`, not optional),
which the kubelet reads only when it starts the container, after binding. GPUPool writes that
ConfigMap (owned by the pod: the garbage collector deletes it with the pod) before it posts
the Binding. What the spec needs from its creation, for MPS: `hostIPC: true` and the node's
MPS root (the agent's --mps-root) mounted from the host (type Directory) at MPS_MOUNT, where
CUDA_MPS_PIPE_DIRECTORY points into it. `missing_parts` says what a pod lacks (a pod that
lacks any is refused, naming it); `sharing_patch` is the JSON patch that adds them (for the
admission webhook, or to see what to write by hand).

Pure functions of dicts: no Django, no client.
"""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from clusters.backends.kubernetes.manifests import GPU_RESOURCE, mps_pipe_host_path
from clusters.sharing import MpsLimits, mps_env
from scheduling import bounds

FRACTION = "gpupool.io/gpu-fraction"
GPU_MEMORY = "gpupool.io/gpu-memory"
CONFIG_SUFFIX = "-gpupool-gpu"
MPS_VOLUME = "gpupool-mps"
# Where the node's MPS root is mounted in the pod: the pipe of GPU <device> is
# <MPS_MOUNT>/<device>/pipe, as the agent names it on the host.
MPS_MOUNT = "/run/gpupool/mps"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# What the ConfigMap sets. A container's own `env` wins over its `envFrom`: one that sets
# any of these would escape its GPU or its limits.
GPU_ENV = (
    VISIBLE_DEVICES,
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
MEMORY = re.compile(r"([0-9]{1,9})(Mi|Gi)")
NAME_MAX = 253  # a ConfigMap's name is a DNS subdomain


def asks_share(annotations: dict[str, str]) -> bool:
    return FRACTION in annotations or GPU_MEMORY in annotations


def share_request(annotations: dict[str, str]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The submit fields a pod's annotations ask (`gpu_request`, `gpus`, `gpu_memory_mib`,
    as the portal's form sends a fraction), and the problems, keyed by the annotation."""
    if FRACTION in annotations and GPU_MEMORY in annotations:
        message = f"Give {FRACTION} or {GPU_MEMORY}, not both."
        return {}, {f"the annotation {FRACTION}": [message]}
    if FRACTION in annotations:
        return _fraction(annotations[FRACTION])
    if GPU_MEMORY in annotations:
        return _memory(annotations[GPU_MEMORY])
    return {}, {}


def _fraction(value: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    try:
        share = Decimal(value.strip()) if len(value) <= 40 else Decimal("NaN")
    except InvalidOperation:
        share = Decimal("NaN")
    places = bounds.GPUS.places or 0
    if not share.is_finite() or not 0 < share < 1 or share != round(share, places):
        message = (
            f"Give a part of one GPU between 0 and 1, at most {places} decimals, "
            f'e.g. "0.5" (not {value[:40]!r}).'
        )
        return {}, {f"the annotation {FRACTION}": [message]}
    return {"gpu_request": "fraction", "gpus": str(share)}, {}


def _memory(value: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    match = MEMORY.fullmatch(value.strip())
    mib = int(match.group(1)) * (1024 if match.group(2) == "Gi" else 1) if match else 0
    if not 0 < mib <= bounds.GPU_MEMORY_MIB.high:
        message = (
            f'Give GPU memory in Mi or Gi, e.g. "10Gi" or "10240Mi", at most '
            f"{bounds.GPU_MEMORY_MIB.high // 1024}Gi (not {value[:40]!r})."
        )
        return {}, {f"the annotation {GPU_MEMORY}": [message]}
    return {"gpu_request": "memory", "gpus": "0", "gpu_memory_mib": mib}, {}


def config_map_name(pod_name: str, salt: str = "") -> str:
    """The ConfigMap of a pod's GPU environment: `<pod>-gpupool-gpu`. A pod made from
    `generateName` has no name yet when admission sees it: the webhook passes the pod's
    generateName and something unique to its request (`salt`). A name too long for a DNS
    subdomain is cut, with a digest of the whole."""
    base = f"{pod_name}{salt}"
    name = f"{base}{CONFIG_SUFFIX}"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: NAME_MAX - len(CONFIG_SUFFIX) - 11].rstrip('-.')}-{digest}{CONFIG_SUFFIX}"


def config_map_of_new_pod(pod: dict, salt: str) -> str:
    """The ConfigMap a pod being made will name: after its name, or, made from
    `generateName` (a Job's), after that and `salt` (something unique to this creation)."""
    meta = pod.get("metadata") or {}
    if name := meta.get("name") or "":
        return config_map_name(name)
    return config_map_name(meta.get("generateName") or "pod-", salt=salt)


def _gpu_container(pod: dict) -> tuple[int, dict]:
    """The container that uses the GPU: the one `kubectl.kubernetes.io/default-container`
    names, else the first."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER)
    for index, container in enumerate(containers):
        if wanted and container.get("name") == wanted:
            return index, container
    return 0, containers[0]


def gpu_config_of(pod: dict) -> str:
    """The name of the ConfigMap the GPU container takes its GPU environment from (an
    envFrom configMapRef, not optional, named `...-gpupool-gpu`); "" when none."""
    _, container = _gpu_container(pod)
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef") or {}
        name = str(ref.get("name") or "")
        if name.endswith(CONFIG_SUFFIX) and not ref.get("optional") and not source.get("prefix"):
            return name
    return ""


def _mps_volume(pod: dict, mps_root: str) -> str:
    """The name of the pod's volume that is the host's MPS root (type Directory); ""."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        host = volume.get("hostPath") or {}
        if _same_path(host.get("path"), mps_root) and host.get("type") == "Directory":
            return str(volume.get("name") or "")
    return ""


def _mounted(container: dict, volume: str) -> bool:
    """The container mounts the whole of `volume` at MPS_MOUNT."""
    return any(
        m.get("name") == volume
        and _same_path(m.get("mountPath"), MPS_MOUNT)
        and not m.get("subPath")
        and not m.get("subPathExpr")
        for m in container.get("volumeMounts") or []
    )


def _same_path(path: Any, root: str) -> bool:
    return str(path or "").rstrip("/") == root.rstrip("/")


def missing_parts(pod: dict, *, mps_root: str, mps: bool = True) -> list[str]:
    """What the pod's spec lacks to share a GPU, each named as a field to add; [] when it
    has all. `mps`: the cluster enforces shares through MPS (its config's `mps`)."""
    spec = pod.get("spec") or {}
    _, container = _gpu_container(pod)
    where = f"containers[{container.get('name', '')}]"
    missing = []
    if mps and spec.get("hostIPC") is not True:
        missing.append("spec.hostIPC: true")
    volume = _mps_volume(pod, mps_root)
    if mps and not volume:
        missing.append(f"spec.volumes hostPath {mps_root} (type Directory)")
    if mps and volume and not _mounted(container, volume):
        missing.append(f"{where}.volumeMounts {volume} at {MPS_MOUNT}")
    if not gpu_config_of(pod):
        name = config_map_name(str((pod.get("metadata") or {}).get("name") or "<pod>"))
        missing.append(f"{where}.envFrom configMapRef {name} (not optional, no prefix)")
    missing += [
        f"no {where}.env {env['name']} (GPUPool sets it)"
        for env in container.get("env") or []
        if env.get("name") in GPU_ENV
    ]
    return missing


def sharing_patch(pod: dict, *, config_map: str, mps_root: str) -> list[dict]:
    """RFC 6902 operations that give a pod asking for a GPU share what `missing_parts`
    wants (hostIPC, the MPS root's volume and mount, the envFrom of `config_map`; GPU
    variables of its own env removed). [] for a pod that asks none, or has them all: so
    applying its result and asking again gives []."""
    if not asks_share((pod.get("metadata") or {}).get("annotations") or {}):
        return []
    spec = pod.get("spec") or {}
    index, container = _gpu_container(pod)
    at = f"/spec/containers/{index}"
    ops: list[dict] = []
    if spec.get("hostIPC") is not True:
        ops.append({"op": "add", "path": "/spec/hostIPC", "value": True})
    volume = _mps_volume(pod, mps_root)
    if not volume:
        volume = MPS_VOLUME
        body = {"name": volume, "hostPath": {"path": mps_root, "type": "Directory"}}
        ops += _append(spec, "volumes", "/spec", body, replace_name=volume)
    if not _mounted(container, volume):
        ops += _append(container, "volumeMounts", at, {"name": volume, "mountPath": MPS_MOUNT})
    if not gpu_config_of(pod):
        ops += _append(container, "envFrom", at, {"configMapRef": {"name": config_map}})
    envs = container.get("env") or []
    ops += [
        {"op": "remove", "path": f"{at}/env/{i}"}
        for i in reversed(range(len(envs)))
        if envs[i].get("name") in GPU_ENV
    ]
    return ops


def _append(
    parent: dict, field: str, path: str, value: dict, *, replace_name: str = ""
) -> list[dict]:
    """Add `value` to the list `field` of `parent` (made when missing); an item of the
    same name (`replace_name`) is replaced, since names are unique there."""
    items = parent.get(field)
    if not items:
        return [{"op": "add", "path": f"{path}/{field}", "value": [value]}]
    for i, item in enumerate(items):
        if replace_name and item.get("name") == replace_name:
            return [{"op": "replace", "path": f"{path}/{field}/{i}", "value": value}]
    return [{"op": "add", "path": f"{path}/{field}/-", "value": value}]


def gpu_env(device: str, limits: MpsLimits | None) -> dict[str, str]:
    """The environment of a sharer of GPU `device` (the UUID its reservation pod holds):
    that GPU alone, and its MPS limits (none where the cluster does not enforce them)."""
    env = {VISIBLE_DEVICES: device}
    if limits is not None:
        env.update(mps_env(limits, mps_pipe_host_path(MPS_MOUNT, device)))
    return env


def gpu_config_map(name: str, pod: dict, env: dict[str, str], labels: dict[str, str]) -> dict:
    """The ConfigMap `name`, owned by the pod (deleted with it by the garbage collector)."""
    meta = pod["metadata"]
    owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": dict(labels), "ownerReferences": [owner]},
        "data": dict(env),
    }


def written_for(config_map: dict, pod: dict, env: dict[str, str]) -> bool:
    """A ConfigMap found in the way is one GPUPool wrote for this pod with this GPU (an
    earlier try whose answer was lost)."""
    uid = pod["metadata"]["uid"]
    owners = (config_map.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == uid for o in owners) and config_map.get("data") == env


def requests_whole_gpus(pod: dict) -> bool:
    """Some container asks for `nvidia.com/gpu` (a share and whole GPUs do not mix)."""
    spec = pod.get("spec") or {}
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    return any(
        GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {})
        for c in containers
        for kind in ("limits", "requests")
    )
