"""Reservation pods: how shared (fractional) GPUs work on Kubernetes.

One reservation pod per shared GPU asks for `nvidia.com/gpu: 1` and so holds a physical
device while any share of it is in use. The device plugin, not GPUPool, picks which device
that is, so the reservation pod prints the UUID it was given; GPUPool reads it from the
pod's log once, keeps it as an annotation on the reservation pod, and points the shared
pods at it with NVIDIA_VISIBLE_DEVICES. Shared pods are created only once it is known.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from clusters.backends import BackendError, PodSpec, ReconcileReport
from clusters.backends.kubernetes.manifests import ROLE, reservation_manifest

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend

UUID_ANNOTATION = "gpupool.io/gpu-uuid"
UUID = re.compile(r"GPU-[0-9A-Za-z-]+")
Key = tuple[str, int]  # (node name, GPU index as the cycle numbered it)


def _key(pod: dict) -> Key:
    meta = pod["metadata"]
    return (meta["annotations"]["gpupool.io/node"], int(meta["labels"]["gpupool.io/gpu-index"]))


def _sharers_left(pods: list[dict], report: ReconcileReport) -> set[Key]:
    """Shared GPUs that pods still use, though nobody wants them (a pod shutting down)."""
    keys = set()
    for pod in pods:
        meta = pod["metadata"]
        shared = (meta.get("annotations") or {}).get("gpupool.io/shared-gpu")
        if shared and meta["name"] in report.statuses:
            # The node GPUPool chose: a pod whose Binding failed has no nodeName yet.
            keys.add((meta["annotations"]["gpupool.io/node"], int(shared.split(":")[0])))
    return keys


def _failed(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


class Reservations:
    def __init__(self, backend: KubernetesBackend):
        self.backend = backend

    def sync(self, pods: list[dict], desired: list[PodSpec], report: ReconcileReport) -> dict:
        """1. create a reservation for each shared GPU in use; 2. read the device each one
        holds; 3. delete reservations of GPUs no pod shares any more.
        Returns {(node, index): GPU UUID} for the reservations whose device is known."""
        held = {_key(p): p for p in pods if p["metadata"]["labels"].get(ROLE) == "reservation"}
        in_use = {
            (s.node_name, s.shared_gpu_index) for s in desired if s.shared_gpu_index is not None
        } | _sharers_left(pods, report)
        devices: dict[Key, str] = {}
        try:
            if in_use:
                self.backend.ensure_namespace(self.backend.system_namespace)
            for key in sorted(in_use):
                if key not in held:
                    self._create(*key)
                elif _failed(held[key]):
                    self._give_up(held.pop(key), report)
                elif device := self._device(held[key], report):
                    devices[key] = device
            for key, pod in held.items():
                if key not in in_use:
                    self._delete(pod)
        except (ApiException, BackendError) as exc:
            report.errors.append(f"reservation pods: {exc}")
        return devices

    def _create(self, node: str, index: int) -> None:
        body = reservation_manifest(node, index, self.backend.reservation_image)
        api = self.backend.api
        try:
            self.backend._json(api.create_namespaced_pod, self.backend.system_namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # 409: created by an earlier pass whose answer was lost
                raise

    def _device(self, pod: dict, report: ReconcileReport) -> str | None:
        meta = pod["metadata"]
        known = (meta.get("annotations") or {}).get(UUID_ANNOTATION)
        if known:
            return str(known)
        if (pod.get("status") or {}).get("phase") != "Running":
            return None
        text = self.backend.pod_logs(meta["name"], meta["namespace"], tail_lines=20)
        match = UUID.search(text)
        if match is None:
            report.errors.append(f"reservation pod {meta['name']} runs but reported no GPU UUID")
            return None
        patch: dict[str, Any] = {"metadata": {"annotations": {UUID_ANNOTATION: match.group(0)}}}
        self.backend._json(
            self.backend.api.patch_namespaced_pod, meta["name"], meta["namespace"], patch
        )
        return match.group(0)

    def _give_up(self, pod: dict, report: ReconcileReport) -> None:
        """A reservation the node refused (no free device: pods GPUPool does not know of
        hold them) is deleted, and made again on the next pass: it never holds anything."""
        status = pod.get("status") or {}
        reason = status.get("message") or status.get("reason") or "no reason given"
        report.errors.append(f"reservation pod {pod['metadata']['name']} failed: {reason}")
        self._delete(pod)

    def _delete(self, pod: dict) -> None:
        meta = pod["metadata"]
        self.backend.delete_quietly(
            self.backend.api.delete_namespaced_pod,
            meta["name"],
            meta["namespace"],
            grace_period_seconds=0,
        )
