"""A Kubernetes cluster through the official `kubernetes` client.

- Objects GPUPool creates carry `app.kubernetes.io/managed-by=gpupool`; only those are
  listed, and nothing else is ever changed or deleted.
- A namespace per project (labelled); pods pinned to the node the cycle chose
  (`spec.nodeName`, or a Binding when config `pin: binding`), whole GPUs as
  `nvidia.com/gpu` limits. A fractional pod gets no GPU limit: a reservation pod per
  shared GPU holds the device, and shared pods see it through NVIDIA_VISIBLE_DEVICES.
- Pods that expose ports get a Service of the same name.
- Calls are retried with exponential backoff on 5xx, 429 and connection errors; a
  cluster that cannot be listed is unreachable (the caller keeps its workloads).
- Lists and creates skip the client's model deserialization (`_preload_content=False`):
  it dominates the cost of large reconciles.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from clusters.backends import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Backend,
    BackendError,
    BackendUnreachable,
    GpuInfo,
    NodeInfo,
    PodPhase,
    PodSpec,
    PodSpecInvalid,
    PodStatus,
    ReconcileReport,
)
from clusters.crypto import kubeconfig_decrypt

log = logging.getLogger(__name__)
SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
ROLE = "gpupool.io/role"
GPU_RESOURCE = "nvidia.com/gpu"
RETRYABLE = {429, 500, 502, 503, 504}
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)


def _quantity_mib(value: str) -> int:
    units = {
        "Ki": 1 / 1024,
        "Mi": 1,
        "Gi": 1024,
        "Ti": 1024**2,
        "k": 1e3 / 2**20,
        "M": 1e6 / 2**20,
        "G": 1e9 / 2**20,
    }
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(value))
    if not match:
        return 0
    number, unit = match.groups()
    return int(float(number) * units.get(unit, 1 / 2**20))


def _cpu(value: str) -> float:
    value = str(value)
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value or 0)


class KubernetesBackend(Backend):
    def __init__(self, cluster: Any, *, kubeconfig: dict | None = None):
        super().__init__(cluster)
        self._kubeconfig = kubeconfig
        self._api: k8s.CoreV1Api | None = None
        self._namespaces: set[str] = set()
        self._listed: list[dict] | None = None
        config = cluster.config or {}
        self.attempts = int(config.get("retries", 4))
        self.backoff_s = float(config.get("backoff_s", 0.2))
        self.timeout = (
            float(config.get("connect_timeout_s", 3)),
            float(config.get("timeout_s", 10)),
        )
        self.workers = int(config.get("workers", 32))
        self.pin = config.get("pin", "nodeName")
        self.system_namespace = config.get("system_namespace", "gpupool-system")
        self.reservation_image = config.get("reservation_image", "registry.k8s.io/pause:3.10")

    # --- plumbing ----------------------------------------------------------------------------
    @property
    def api(self) -> k8s.CoreV1Api:
        if self._api is None:
            kubeconfig = self._kubeconfig or yaml.safe_load(
                kubeconfig_decrypt(self.cluster.kubeconfig_encrypted)
            )
            api_client = k8s_config.new_client_from_config_dict(kubeconfig)
            api_client.configuration.retries = False  # our own retries, with backoff
            api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = self.workers
            self._api = k8s.CoreV1Api(api_client)
        return self._api

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the API, retrying transient faults; ApiException for 4xx is raised at once."""
        kwargs.setdefault("_request_timeout", self.timeout)
        for attempt in range(self.attempts):
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                if exc.status not in RETRYABLE or attempt == self.attempts - 1:
                    raise
                error: Exception = exc
            except TRANSPORT_ERRORS as exc:
                if attempt == self.attempts - 1:
                    raise BackendUnreachable(f"{self.cluster.name}: {exc}") from exc
                error = exc
            delay = self.backoff_s * 2**attempt
            log.info(
                "%s: %s failed (%s), retrying in %.2fs",
                self.cluster.name,
                fn.__name__,
                error,
                delay,
            )
            time.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        response = self.call(fn, *args, _preload_content=False, **kwargs)
        return json.loads(response.data)

    # --- inventory ---------------------------------------------------------------------------
    def test_connection(self) -> str:
        try:
            version = self._json(k8s.VersionApi(self.api.api_client).get_code)
            nodes = self._json(self.api.list_node)["items"]
        except ApiException as exc:
            raise BackendUnreachable(f"{self.cluster.name}: {exc.status} {exc.reason}") from exc
        return f"Kubernetes {version.get('gitVersion', '?')}: {len(nodes)} nodes"

    def list_inventory(self) -> list[NodeInfo]:
        try:
            items = self._json(self.api.list_node)["items"]
        except ApiException as exc:
            raise BackendUnreachable(f"cannot list nodes: {exc.status} {exc.reason}") from exc
        return [_node_info(item) for item in items]

    # --- pods --------------------------------------------------------------------------------
    def _managed_pods(self) -> list[dict]:
        try:
            return self._json(self.api.list_pod_for_all_namespaces, label_selector=SELECTOR)[
                "items"
            ]
        except ApiException as exc:
            raise BackendUnreachable(f"cannot list pods: {exc.status} {exc.reason}") from exc

    def pod_statuses(self) -> dict[str, PodStatus]:
        # Kept for the reconcile that usually follows at once: one list per pass, not two.
        self._listed = self._managed_pods()
        return {
            pod["metadata"]["name"]: _status(pod)
            for pod in self._listed
            if pod["metadata"]["labels"].get(ROLE) == "workload"
        }

    def ensure_namespace(self, name: str, project: str = "") -> None:
        if name in self._namespaces:
            return
        body = {
            "metadata": {
                "name": name,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, "gpupool.io/project": project or name},
            }
        }
        try:
            self.call(self.api.create_namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"namespace {name}: {exc.status} {exc.reason}") from exc
        self._namespaces.add(name)

    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        self.ensure_namespace(spec.namespace, spec.project)
        body = pod_manifest(spec, pin_with_node_name=self.pin != "binding")
        try:
            created = self._json(self.api.create_namespaced_pod, spec.namespace, body)
            if self.pin == "binding":
                self._bind(spec)
        except ApiException as exc:
            if exc.status in (400, 422):
                raise PodSpecInvalid(f"{exc.status} {exc.reason}: {_message(exc)}") from exc
            if exc.status != 409:
                raise BackendError(f"pod {spec.name}: {exc.status} {exc.reason}") from exc
            created = self._adopt(spec)
        if spec.ports:
            self._ensure_service(spec)
        return _status(created)

    def _bind(self, spec: PodSpec) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": spec.name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": spec.node_name},
        }
        self.call(
            self.api.create_namespaced_pod_binding,
            spec.name,
            spec.namespace,
            body,
            _preload_content=False,
        )

    def _adopt(self, spec: PodSpec) -> dict:
        """409 on create: ours from an earlier attempt whose answer was lost, or a stranger's."""
        try:
            pod = self._json(self.api.read_namespaced_pod, spec.name, spec.namespace)
        except ApiException as exc:  # an injected or racing conflict: retry next pass
            raise BackendError(f"pod {spec.name}: conflict, then {exc.status}") from exc
        labels = pod["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or labels.get(
            "gpupool.io/workload-id"
        ) != str(spec.workload_id):
            raise BackendError(
                f"a pod named {spec.namespace}/{spec.name} exists that GPUPool did not create"
            )
        return pod

    def _ensure_service(self, spec: PodSpec) -> None:
        try:
            self.call(
                self.api.create_namespaced_service,
                spec.namespace,
                service_manifest(spec),
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"service {spec.name}: {exc.status} {exc.reason}") from exc

    def delete_pod(self, status: PodStatus, *, grace_period_s: int) -> bool:
        if status.terminating:
            return False  # asked already; the kubelet is giving it its grace period
        self._delete_quietly(self.api.delete_namespaced_service, status.name, status.namespace)
        gone = self._delete_quietly(
            self.api.delete_namespaced_pod,
            status.name,
            status.namespace,
            grace_period_seconds=grace_period_s,
        )
        return gone or status.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    def _delete_quietly(self, fn: Callable[..., Any], name: str, ns: str, **kwargs: Any) -> bool:
        """Delete; True when the object is gone now."""
        try:
            answer = self._json(fn, name, ns, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise BackendError(f"delete {ns}/{name}: {exc.status} {exc.reason}") from exc
        # A pod that must shut down comes back with a deletionTimestamp; one removed at
        # once (never started, already finished, grace 0) comes back without.
        return not (answer.get("metadata") or {}).get("deletionTimestamp")

    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        try:
            response = self.call(
                self.api.read_namespaced_pod_log,
                name,
                namespace,
                container="main",
                tail_lines=tail_lines,
                _preload_content=False,
            )
        except (ApiException, BackendError) as exc:
            return f"(logs unavailable: {exc})"
        return response.data.decode("utf-8", "replace")

    # --- reconcile ---------------------------------------------------------------------------
    def reconcile(self, desired: list[PodSpec], *, grace_period_s: int) -> ReconcileReport:
        """1. list managed pods; 2. namespaces; 3. deletes and creates on a thread pool;
        4. reservation pods follow the shared GPUs still in use."""
        pods = self._listed if self._listed is not None else self._managed_pods()
        self._listed = None
        report = ReconcileReport(
            statuses={
                p["metadata"]["name"]: _status(p)
                for p in pods
                if p["metadata"]["labels"].get(ROLE) == "workload"
            }
        )
        wanted = {spec.name: spec for spec in desired}
        doomed = [s for n, s in report.statuses.items() if n not in wanted]
        missing = [s for s in desired if s.name not in report.statuses]
        for namespace, project in sorted({(s.namespace, s.project) for s in missing}):
            self.ensure_namespace(namespace, project)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(lambda s: self._delete_into(report, s, grace_period_s), doomed))
            list(pool.map(lambda s: self._create_into(report, s), missing))
        self._reconcile_reservations(pods, desired, report)
        return report

    def _reconcile_reservations(
        self, pods: list[dict], desired: list[PodSpec], report: ReconcileReport
    ) -> None:
        held = {
            p["metadata"]["name"]: p
            for p in pods
            if p["metadata"]["labels"].get(ROLE) == "reservation"
        }
        shared = {
            (s.node_name, s.shared_gpu_index): s for s in desired if s.shared_gpu_index is not None
        }
        wanted = {reservation_name(node, index): (node, index) for node, index in shared}
        try:
            if wanted:
                self.ensure_namespace(self.system_namespace)
            for name, (node, index) in sorted(wanted.items()):
                if name not in held:
                    self._create_reservation(name, node, index)
            for name, pod in held.items():
                if name not in wanted:
                    self._delete_quietly(
                        self.api.delete_namespaced_pod,
                        name,
                        pod["metadata"]["namespace"],
                        grace_period_seconds=0,
                    )
        except (ApiException, BackendError) as exc:
            report.errors.append(f"reservation pods: {exc}")

    def _create_reservation(self, name: str, node: str, index: int) -> None:
        body = reservation_manifest(name, node, index, self.reservation_image)
        try:
            self.call(
                self.api.create_namespaced_pod, self.system_namespace, body, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 409:
                raise


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))
    except ValueError:
        return str(exc.body or "")[:500]


def reservation_name(node: str, index: int) -> str:
    return f"gp-reserve-{node}-{index}"[:253]


def _labels(spec: PodSpec) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        ROLE: "workload",
        "gpupool.io/pod": spec.name,
        "gpupool.io/workload-id": str(spec.workload_id),
        "gpupool.io/pod-index": str(spec.pod_index),
        "gpupool.io/project": spec.project[:63],
        "gpupool.io/workload": spec.workload_name[:63],
        "gpupool.io/kind": spec.kind,
    }


def pod_manifest(spec: PodSpec, *, pin_with_node_name: bool = True) -> dict:
    env = dict(spec.env)
    limits: dict[str, str] = {"memory": f"{spec.memory_mib}Mi"}
    if spec.gpu_indices:
        limits[GPU_RESOURCE] = str(len(spec.gpu_indices))
    elif spec.shared_gpu_index is not None:
        # The reservation pod holds the device; this pod only points at it.
        env["NVIDIA_VISIBLE_DEVICES"] = spec.shared_gpu_uuid or str(spec.shared_gpu_index)
    else:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"  # a CPU-only pod sees no GPU
    container: dict[str, Any] = {
        "name": "main",
        "image": spec.image or "busybox:1.36",
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": {
            "requests": {"cpu": str(spec.cpu), "memory": f"{spec.memory_mib}Mi"},
            "limits": limits,
        },
        "ports": [{"name": p.name[:15], "containerPort": p.port} for p in spec.ports],
    }
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
    }
    if pin_with_node_name:
        pod_spec["nodeName"] = spec.node_name
    else:
        pod_spec["schedulerName"] = "gpupool"  # no default scheduler races our Binding
    annotations = {
        "gpupool.io/node": spec.node_name,
        "gpupool.io/gpu-indices": ",".join(map(str, spec.gpu_indices)),
    }
    if spec.shared_gpu_index is not None:
        annotations["gpupool.io/shared-gpu"] = f"{spec.shared_gpu_index}:{spec.gpu_share}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": spec.name, "labels": _labels(spec), "annotations": annotations},
        "spec": pod_spec,
    }


def service_manifest(spec: PodSpec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "labels": _labels(spec)},
        "spec": {
            "selector": {"gpupool.io/pod": spec.name},
            "ports": [
                {"name": p.name[:15], "port": p.port, "targetPort": p.port} for p in spec.ports
            ],
        },
    }


def reservation_manifest(name: str, node: str, index: int, image: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                ROLE: "reservation",
                "gpupool.io/gpu-index": str(index),
            },
            "annotations": {"gpupool.io/node": node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "priorityClassName": "system-node-critical",
            "containers": [
                {"name": "hold", "image": image, "resources": {"limits": {GPU_RESOURCE: "1"}}}
            ],
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def _node_info(item: dict) -> NodeInfo:
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    labels = meta.get("labels") or {}
    allocatable = status.get("allocatable") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    count = int(allocatable.get(GPU_RESOURCE, 0) or 0)
    model = labels.get("nvidia.com/gpu.product", "")
    memory = int(labels.get("nvidia.com/gpu.memory", 0) or 0)
    return NodeInfo(
        name=meta["name"],
        labels=labels,
        cpu_cores=_cpu(allocatable.get("cpu", "0")),
        memory_mib=_quantity_mib(allocatable.get("memory", "0")),
        schedulable=ready and not spec.get("unschedulable", False),
        gpus=tuple(GpuInfo(index=i, model=model, memory_mib=memory) for i in range(count)),
    )


def _status(pod: dict) -> PodStatus:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    phase = status.get("phase") or "Pending"
    result = PodStatus(
        name=meta["name"],
        namespace=meta.get("namespace", ""),
        workload_id=int(labels.get("gpupool.io/workload-id", 0)),
        pod_index=int(labels.get("gpupool.io/pod-index", 0)),
        phase=PodPhase(phase) if phase in PodPhase.__members__.values() else PodPhase.UNKNOWN,
        backend_ref=meta.get("uid", ""),
        node_name=(pod.get("spec") or {}).get("nodeName", ""),
        terminating=bool(meta.get("deletionTimestamp")),
    )
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            result.exit_code = terminated.get("exitCode")
            result.message = terminated.get("message") or terminated.get("reason") or ""
    if status.get("message"):
        result.message = status["message"]
    ports = [p for c in (pod.get("spec") or {}).get("containers", []) for p in c.get("ports") or []]
    if ports:
        result.endpoint = f"{meta['name']}.{result.namespace}.svc:{ports[0]['containerPort']}"
    return result
