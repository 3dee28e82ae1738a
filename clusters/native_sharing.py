"""GPU fractions for pods made outside GPUPool (kubectl, Helm, an operator: issue 26).

A native pod asks for part of a GPU with an annotation: `gpupool.io/gpu-fraction: "0.5"`
(a portion) or `gpupool.io/gpu-memory: "10Gi"` (an amount of GPU memory). It then shares a
GPU as portal work does (a reservation pod holds the device; docs/gpu-sharing.md), and runs
under the same MPS limits, written by the same function (`clusters.sharing.mps_env`).

Which GPU, and so the pod's environment, is known only when GPUPool binds it, and a pod's
spec cannot change once it is made. So the pod's GPU container takes its GPU environment
from a ConfigMap (`envFrom: [..., {configMapRef: {name: <pod>-gpupool-gpu}}]`, not optional,
the last source: a later one would win over it), which the kubelet reads only when it
starts the container, after binding. GPUPool writes that ConfigMap (owned by the pod: the
garbage collector deletes it with the pod) before it posts the Binding. What the spec needs
from its creation, for MPS: `hostIPC: true`, and the node's MPS root (the agent's
--mps-root, hostPath type Directory) mounted by the GPU container with `subPathExpr:
$(GPUPOOL_MPS_PIPE)` at /run/nvidia-mps. The ConfigMap sets GPUPOOL_MPS_PIPE to
`<device>/pipe`, and the kubelet expands subPathExpr from the container's environment: the
container sees its own GPU's pipe folder alone, as GPUPool's own sharers do, and a process
that changes CUDA_MPS_PIPE_DIRECTORY finds no other GPU's daemon. So no other mount of that
volume (by any container), no other hostPath volume in or above the MPS root, and no `env`
of the GPU variables (a container's `env` wins over its `envFrom`). `missing_parts` says
what a pod lacks (a pod that lacks any is refused, naming it; a pod made with the whole
root mounted, as GPUPool asked before, is refused so); `sharing_patch` is the JSON patch
that adds them (for the admission webhook, or to see what to write by hand).

The kubelet makes a missing subPath folder itself, so it does not wait for the GPU's MPS
daemon: GPUPool binds a native sharer only once the node's agent has reported that daemon
running for it (clusters/mps_report.py).

Pure functions of dicts: no Django, no client.
"""

from __future__ import annotations

import hashlib
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from clusters.backends.kubernetes.manifests import GPU_RESOURCE
from clusters.sharing import POD_PIPE_DIRECTORY, MpsLimits, mps_env
from scheduling import bounds

FRACTION = "gpupool.io/gpu-fraction"
GPU_MEMORY = "gpupool.io/gpu-memory"
CONFIG_SUFFIX = "-gpupool-gpu"
MPS_VOLUME = "gpupool-mps"
# The GPU's pipe folder under the node's MPS root (<device>/pipe, as the agent names it),
# which the ConfigMap sets and the kubelet expands into the mount's subPathExpr.
MPS_PIPE = "GPUPOOL_MPS_PIPE"
PIPE_EXPR = f"$({MPS_PIPE})"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# What the ConfigMap sets. A container's own `env` wins over its `envFrom`: one that sets
# any of these would escape its GPU or its limits.
GPU_ENV = (
    VISIBLE_DEVICES,
    MPS_PIPE,
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


def _ours(source: dict) -> bool:
    """An envFrom source that names a GPU ConfigMap (`...-gpupool-gpu`)."""
    return str((source.get("configMapRef") or {}).get("name") or "").endswith(CONFIG_SUFFIX)


def gpu_config_of(pod: dict) -> str:
    """The name of the ConfigMap the GPU container takes its GPU environment from: its last
    envFrom source (a later one would win over it), a configMapRef named `...-gpupool-gpu`,
    not optional, no prefix; "" when none."""
    _, container = _gpu_container(pod)
    sources = container.get("envFrom") or [{}]
    last = sources[-1]
    ref = last.get("configMapRef") or {}
    if _ours(last) and not ref.get("optional") and not last.get("prefix"):
        return str(ref["name"])
    return ""


def _norm(path: Any) -> str:
    """A host or container path without empty or `.` parts ("" for none)."""
    if not path:
        return ""
    return "/" + "/".join(p for p in str(path).split("/") if p not in ("", "."))


def _mps_volume(pod: dict, mps_root: str) -> str:
    """The name of the pod's volume that is the host's MPS root (type Directory); ""."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        host = volume.get("hostPath") or {}
        if _norm(host.get("path")) == _norm(mps_root) and host.get("type") == "Directory":
            return str(volume.get("name") or "")
    return ""


def _reaching(pod: dict, mps_root: str, volume: str) -> list[str]:
    """The pod's other hostPath volumes in or above the MPS root (the root itself, `/`,
    another GPU's folder): each would show other GPUs' pipes."""
    root, found = _norm(mps_root), []
    for item in (pod.get("spec") or {}).get("volumes") or []:
        path = _norm((item.get("hostPath") or {}).get("path"))
        if item.get("name") == volume or not path:
            continue
        if path == root or root.startswith(path.rstrip("/") + "/") or path.startswith(root + "/"):
            found.append(f"{item.get('name')} (hostPath {path})")
    return found


Mount = tuple[str, int, int]  # (containers, initContainers...; container index; mount index)


def _mounts_of(pod: dict, volume: str) -> dict[Mount, dict]:
    """Every mount of `volume`, by any container of the pod."""
    spec = pod.get("spec") or {}
    return {
        (field, c, m): mount
        for field in ("initContainers", "containers", "ephemeralContainers")
        for c, container in enumerate(spec.get(field) or [])
        for m, mount in enumerate(container.get("volumeMounts") or [])
        if mount.get("name") == volume
    }


def _pipe_mount(volume: str) -> dict:
    """Its GPU's pipe folder alone: <MPS root>/<device>/pipe, the ConfigMap's MPS_PIPE."""
    return {"name": volume, "mountPath": POD_PIPE_DIRECTORY, "subPathExpr": PIPE_EXPR}


def _pipe_of(mounts: dict[Mount, dict], index: int) -> Mount | None:
    """The GPU container's (at `index`) mount of its pipe, as `_pipe_mount` writes it."""
    return next(
        (
            at
            for at, mount in mounts.items()
            if at[:2] == ("containers", index)
            and _norm(mount.get("mountPath")) == POD_PIPE_DIRECTORY
            and mount.get("subPathExpr") == PIPE_EXPR
            and not mount.get("subPath")
        ),
        None,
    )


def _container_name(pod: dict, at: Mount) -> str:
    container = ((pod.get("spec") or {}).get(at[0]) or [])[at[1]]
    return f"{at[0]}[{container.get('name', '')}]"


def missing_parts(pod: dict, *, mps_root: str, mps: bool = True) -> list[str]:
    """What the pod's spec lacks to share a GPU, or has that it must not, each named as a
    field to change; [] when it has all. `mps`: the cluster enforces shares through MPS
    (its config's `mps`)."""
    spec = pod.get("spec") or {}
    index, container = _gpu_container(pod)
    where = f"containers[{container.get('name', '')}]"
    missing = []
    if mps and spec.get("hostIPC") is not True:
        missing.append("spec.hostIPC: true")
    volume = _mps_volume(pod, mps_root) if mps else ""
    if mps and not volume:
        missing.append(f"spec.volumes hostPath {mps_root} (type Directory)")
    mounts = _mounts_of(pod, volume) if volume else {}
    pipe = _pipe_of(mounts, index)
    if volume and pipe is None:
        missing.append(
            f"{where}.volumeMounts {volume} at {POD_PIPE_DIRECTORY} with subPathExpr "
            f"{PIPE_EXPR} (its GPU's pipe alone)"
        )
    missing += [
        f"no other mount of {volume}: {_container_name(pod, at)} at {mount.get('mountPath')}"
        for at, mount in mounts.items()
        if at != pipe
    ]
    if mps:
        reaching = _reaching(pod, mps_root, volume)
        missing += [f"no spec.volumes {v}: in or above the MPS root" for v in reaching]
    if not gpu_config_of(pod):
        name = config_map_name(str((pod.get("metadata") or {}).get("name") or "<pod>"))
        missing.append(
            f"{where}.envFrom configMapRef {name} (not optional, no prefix, the last source)"
        )
    missing += [
        f"no {where}.env {env['name']} (GPUPool sets it)"
        for env in container.get("env") or []
        if env.get("name") in GPU_ENV
    ]
    return missing


def sharing_patch(pod: dict, *, config_map: str, mps_root: str) -> list[dict]:
    """RFC 6902 operations that give a pod asking for a GPU share what `missing_parts`
    wants (hostIPC, the MPS root's volume and its pipe mount, the envFrom of `config_map`
    last), and take away what it must not have (other mounts of that volume, an envFrom of
    another GPU ConfigMap, GPU variables of its own env). A hostPath volume of its own in
    or above the MPS root is the pod's to change: left, and refused. [] for a pod that asks
    none, or has them all: so applying its result and asking again gives []."""
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
    mounts = _mounts_of(pod, volume)
    pipe = _pipe_of(mounts, index)
    ops += [
        {"op": "remove", "path": f"/spec/{field}/{c}/volumeMounts/{m}"}
        for field, c, m in sorted(mounts, reverse=True)
        if (field, c, m) != pipe
    ]
    if pipe is None:
        ops += _append(container, "volumeMounts", at, _pipe_mount(volume))
    if not gpu_config_of(pod):
        sources = container.get("envFrom") or []
        ops += [
            {"op": "remove", "path": f"{at}/envFrom/{i}"}
            for i in reversed(range(len(sources)))
            if _ours(sources[i])
        ]
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
    # Its pipe folder under the MPS root, as the agent names it (MpsDaemons.pipe_dir): set
    # where MPS is off too, for a pod that mounts it all the same (the kubelet cannot start
    # a container whose subPathExpr names an unset variable).
    env = {VISIBLE_DEVICES: device, MPS_PIPE: f"{device}/pipe"}
    if limits is not None:
        env.update(mps_env(limits, POD_PIPE_DIRECTORY))
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
