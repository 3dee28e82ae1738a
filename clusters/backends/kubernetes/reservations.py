"""Reservation pods: how shared (fractional) GPUs work on Kubernetes.

One reservation pod per shared GPU asks for `nvidia.com/gpu: 1` and so holds a physical
device while any share of it is in use. The device plugin, not GPUPool, picks which device
that is, so the reservation pod prints the UUID it was given; GPUPool reads it from the
pod's log once, keeps it as an annotation on the reservation pod, and points the shared
pods at it with NVIDIA_VISIBLE_DEVICES. Shared pods are created only once it is known.

Reservation pods are Guaranteed and run under a PriorityClass GPUPool makes (once, and
again if someone deleted it), so that a node under pressure evicts the sharers first: a
reservation evicted before them would let the kubelet hand their GPU to someone else.
A reservation the cluster's admission refuses fails the workloads that share its GPU.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters.backends import BackendError, PodSpec, ReconcileReport, never_runs
from clusters.backends.kubernetes.errors import priority_class_missing, refused_by_admission, said
from clusters.backends.kubernetes.manifests import (
    POD_LABEL,
    RESERVATION_CONTAINER,
    ROLE,
    priority_class_manifest,
    reservation_manifest,
)
from clusters.backends.kubernetes.native import POD_NAME

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
        # GPUPool's name of the pod: a label on its own pods, an annotation on those it bound.
        name = (meta.get("labels") or {}).get(POD_LABEL) or (meta.get("annotations") or {}).get(
            POD_NAME
        )
        if shared and name in report.statuses:
            # The node GPUPool chose: a pod whose Binding failed has no nodeName yet.
            keys.add((meta["annotations"]["gpupool.io/node"], int(shared.split(":")[0])))
    return keys


def _failed(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


class Reservations:
    def __init__(self, backend: KubernetesBackend):
        self.backend = backend
        self._priority_class_made = False

    def sync(self, pods: list[dict], desired: list[PodSpec], report: ReconcileReport) -> dict:
        """1. create a reservation for each shared GPU in use; 2. read the device each one
        holds; 3. delete reservations of GPUs no pod shares any more.
        Returns {(node, index): GPU UUID} for the reservations whose device is known."""
        held = {
            _key(p): p
            for p in pods
            if (p["metadata"].get("labels") or {}).get(ROLE) == "reservation"
        }
        in_use = {
            (s.node_name, s.shared_gpu_index) for s in desired if s.shared_gpu_index is not None
        } | _sharers_left(pods, report)
        devices: dict[Key, str] = {}
        try:
            if in_use:
                self.backend.ensure_namespace(self.backend.system_namespace, shared=True)
                self._ensure_priority_class()
            for key in sorted(in_use):
                if key not in held:
                    self._create(key, desired, report)
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

    def _ensure_priority_class(self) -> None:
        """Once per backend: create the PriorityClass; 409 means it is there already."""
        if self._priority_class_made:
            return
        api = k8s.SchedulingV1Api(self.backend.api.api_client)
        body = priority_class_manifest(self.backend.priority_class)
        try:
            self.backend.call(api.create_priority_class, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                name = body["metadata"]["name"]
                raise BackendError(f"priority class {name}: {said(exc)}") from exc
        self._priority_class_made = True

    def _create(self, key: Key, desired: list[PodSpec], report: ReconcileReport) -> None:
        backend = self.backend
        body = reservation_manifest(
            backend.owner, *key, backend.reservation_image, backend.priority_class
        )
        try:
            backend._json(backend.api.create_namespaced_pod, backend.system_namespace, body)
        except ApiException as exc:
            if refused_by_admission(exc):
                _fail_sharers(key, desired, report, said(exc))
            elif priority_class_missing(exc):
                self._priority_class_made = False  # deleted by someone: made again next pass
                raise
            elif exc.status != 409:  # 409: created by an earlier pass whose answer was lost
                raise

    def _device(self, pod: dict, report: ReconcileReport) -> str | None:
        meta = pod["metadata"]
        known = (meta.get("annotations") or {}).get(UUID_ANNOTATION)
        if known:
            return str(known)
        if (pod.get("status") or {}).get("phase") != "Running":
            return None
        try:
            text = self.backend.read_log(
                meta["name"], meta["namespace"], RESERVATION_CONTAINER, tail_lines=20
            )
        except ApiException as exc:
            report.errors.append(f"reservation pod {meta['name']}: its log: {said(exc)}")
            return None
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


def _fail_sharers(key: Key, desired: list[PodSpec], report: ReconcileReport, said: str) -> None:
    """The cluster will never run this reservation: the pods that would share its GPU
    fail with the API server's reason, so their workloads release it in this pass."""
    report.errors.append(f"reservation pod for {key[0]} GPU {key[1]} refused: {said}")
    for spec in desired:
        if (spec.node_name, spec.shared_gpu_index) == key and spec.name not in report.statuses:
            report.statuses[spec.name] = never_runs(spec, f"its GPU's reservation pod: {said}")
