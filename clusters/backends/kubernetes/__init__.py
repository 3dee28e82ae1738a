"""A Kubernetes cluster through the official `kubernetes` client.

- Objects GPUPool creates carry `app.kubernetes.io/managed-by=gpupool`; only those are
  listed, and nothing else is ever changed or deleted (but an adopted namespace's labels).
- A namespace per project (labelled). One that exists already is adopted: it gets the
  labels (a namespace another tool's managed-by label claims is refused, never taken).
  Pods pinned to the node the cycle chose
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
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from clusters.backends import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TERMINAL_PHASES,
    Backend,
    BackendError,
    BackendUnreachable,
    NodeInfo,
    PodSpec,
    PodSpecInvalid,
    PodStatus,
    ReconcileReport,
    grace_for,
)
from clusters.backends.kubernetes.manifests import (
    PROJECT_LABEL,
    ROLE,
    SELECTOR,
    node_info,
    pod_manifest,
    pod_status,
    service_manifest,
)
from clusters.backends.kubernetes.repairs import repair
from clusters.backends.kubernetes.reservations import Reservations
from clusters.crypto import KubeconfigKeyMissing, kubeconfig_decrypt

log = logging.getLogger(__name__)
RETRYABLE = {429, 500, 502, 503, 504}
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class KubernetesBackend(Backend):
    def __init__(self, cluster: Any, *, kubeconfig: dict | None = None):
        super().__init__(cluster)
        self._kubeconfig = kubeconfig
        self._api: k8s.CoreV1Api | None = None
        self._namespaces: set[str] = set()
        self._listed: list[dict] | None = None
        self.reservations = Reservations(self)
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
        self.reservation_image = config.get("reservation_image", "ubuntu:24.04")

    # --- plumbing ----------------------------------------------------------------------------
    @property
    def api(self) -> k8s.CoreV1Api:
        if self._api is None:
            api_client = self._api_client()
            api_client.configuration.retries = False  # our own retries, with backoff
            api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = self.workers
            self._api = k8s.CoreV1Api(api_client)
        return self._api

    def _api_client(self) -> k8s.ApiClient:
        """A client from the stored kubeconfig. A kubeconfig that cannot be decrypted (the
        key changed) or read makes the cluster unreachable, with the reason as its error."""
        try:
            kubeconfig = self._kubeconfig or yaml.safe_load(
                kubeconfig_decrypt(self.cluster.kubeconfig_encrypted)
            )
            return k8s_config.new_client_from_config_dict(kubeconfig)
        except KubeconfigKeyMissing as exc:
            raise BackendUnreachable(f"{self.cluster.name}: {exc}") from exc
        except Exception as exc:  # the client fails on a broken kubeconfig in many ways
            raise BackendUnreachable(
                f"{self.cluster.name}: the kubeconfig cannot be used: {type(exc).__name__}: {exc}"
            ) from exc

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
            delay = max(self.backoff_s * 2**attempt, _retry_after(error))
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
        return [node_info(item) for item in items]

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
            pod["metadata"]["name"]: pod_status(pod)
            for pod in self._listed
            if pod["metadata"]["labels"].get(ROLE) == "workload"
        }

    def ensure_namespace(self, name: str, project: str = "") -> None:
        if name in self._namespaces:
            return
        labels = {MANAGED_BY_LABEL: MANAGED_BY, PROJECT_LABEL: (project or name)[:63]}
        body = {"metadata": {"name": name, "labels": labels}}
        try:
            self.call(self.api.create_namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"namespace {name}: {exc.status} {exc.reason}") from exc
            self._adopt_namespace(name, labels)
        self._namespaces.add(name)

    def _adopt_namespace(self, name: str, labels: dict[str, str]) -> None:
        """The namespace exists already: ours (from an earlier try, or before a rename of
        the project) or made by hand for the project. It gets GPUPool's labels, so that
        it is known as the project's; one another tool manages is refused, not taken."""
        try:
            found = self._json(self.api.read_namespace, name)
        except ApiException as exc:
            raise BackendError(f"namespace {name}: {exc.status} {exc.reason}") from exc
        current = found.get("metadata", {}).get("labels") or {}
        manager = current.get(MANAGED_BY_LABEL)
        if manager not in (None, MANAGED_BY):
            raise BackendError(
                f"namespace {name} exists and is managed by {manager}: give the project "
                "another namespace or remove that label"
            )
        if all(current.get(k) == v for k, v in labels.items()):
            return
        try:
            self.call(self.api.patch_namespace, name, {"metadata": {"labels": labels}})
        except ApiException as exc:
            raise BackendError(f"namespace {name}: {exc.status} {exc.reason}") from exc
        if manager is None:
            log.info("%s: adopted the existing namespace %s", self.cluster.name, name)

    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        self.ensure_namespace(spec.namespace, spec.project)
        body = pod_manifest(spec, pin_with_node_name=self.pin != "binding")
        try:
            created = self._json(self.api.create_namespaced_pod, spec.namespace, body)
            if self.pin == "binding":
                self.bind(spec)
        except ApiException as exc:
            if exc.status in (400, 422):
                raise PodSpecInvalid(f"{exc.status} {exc.reason}: {_message(exc)}") from exc
            if exc.status != 409:
                raise BackendError(f"pod {spec.name}: {exc.status} {exc.reason}") from exc
            created = self._adopt(spec)
        if spec.ports:
            self.ensure_service(spec)
        return pod_status(created)

    def bind(self, spec: PodSpec) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": spec.name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": spec.node_name},
        }
        try:
            self.call(
                self.api.create_namespaced_pod_binding,
                spec.name,
                spec.namespace,
                body,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: bound already, by a try whose answer was lost
                raise

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

    def ensure_service(self, spec: PodSpec) -> None:
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
        if status.terminating and not status.stuck:
            return False  # asked already; the kubelet is giving it its grace period
        self.delete_service(status.name, status.namespace)
        gone = self.delete_quietly(
            self.api.delete_namespaced_pod,
            status.name,
            status.namespace,
            grace_period_seconds=0 if status.stuck else grace_period_s,
        )
        if status.stuck:
            log.warning(
                "%s: %s/%s deleted by force", self.cluster.name, status.namespace, status.name
            )
        # A finished pod holds no GPU any more, even while the kubelet cleans it up; a pod
        # deleted by force is gone, though the answer still carries its deletionTimestamp.
        return gone or status.stuck or status.phase in TERMINAL_PHASES

    def delete_service(self, name: str, namespace: str) -> None:
        self.delete_quietly(self.api.delete_namespaced_service, name, namespace)

    def delete_quietly(self, fn: Callable[..., Any], name: str, ns: str, **kwargs: Any) -> bool:
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
    def reconcile(
        self,
        desired: list[PodSpec],
        *,
        grace_period_s: int,
        grace_periods: Mapping[int, int] | None = None,
    ) -> ReconcileReport:
        """1. list managed pods; 2. delete those nobody wants, each with its workload's
        grace period (deleteOptions gracePeriodSeconds); 3. reservation pods for the shared
        GPUs in use; 4. create what is missing (shared pods once their device is known),
        in namespaces that exist; 5. repair what an earlier pass left half done (a pod
        whose Binding failed, a Service missing or left over).
        Deletes and creates run on a thread pool: reconcile is latency-bound."""
        pods = self._listed if self._listed is not None else self._managed_pods()
        self._listed = None
        report = ReconcileReport(
            statuses={
                p["metadata"]["name"]: pod_status(p)
                for p in pods
                if p["metadata"]["labels"].get(ROLE) == "workload"
            }
        )
        wanted = {spec.name: spec for spec in desired}
        doomed = [s for n, s in report.statuses.items() if n not in wanted]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(
                pool.map(
                    lambda s: self._delete_into(
                        report, s, grace_for(s, grace_period_s, grace_periods)
                    ),
                    doomed,
                )
            )
            # Pods that were there before this pass and stay: checked for a missing Binding
            # or Service below.
            existing = [wanted[n] for n in report.statuses if n in wanted]
            devices = self.reservations.sync(pods, desired, report)
            missing = [
                ready
                for spec in desired
                if spec.name not in report.statuses
                and (ready := _on_device(spec, devices)) is not None
            ]
            ready = self._namespaces_into(report, {(s.namespace, s.project) for s in missing})
            missing = [s for s in missing if s.namespace in ready]
            list(pool.map(lambda s: self._create_into(report, s), missing))
            repair(self, report, pool, existing)
        return report

    def _namespaces_into(self, report: ReconcileReport, needed: set[tuple[str, str]]) -> set:
        """Create the projects' namespaces; one that fails (refused, 5xx) holds back only
        its own pods, and is tried again on the next pass."""
        ready = set()
        for namespace, project in sorted(needed):
            try:
                self.ensure_namespace(namespace, project)
            except BackendError as exc:
                report.errors.append(str(exc))
            else:
                ready.add(namespace)
        return ready


def _on_device(spec: PodSpec, devices: dict[tuple[str, int], str]) -> PodSpec | None:
    """A shared pod points at the device its reservation holds; None until that is known."""
    if spec.shared_gpu_index is None:
        return spec
    device = devices.get((spec.node_name, spec.shared_gpu_index))
    return None if device is None else replace(spec, shared_gpu_uuid=device)


def _retry_after(error: Exception) -> float:
    """The seconds a 429 (API priority and fairness) asks to wait, at most a minute."""
    headers = getattr(error, "headers", None) if isinstance(error, ApiException) else None
    try:
        return min(float((headers or {}).get("Retry-After", 0)), 60.0)
    except (TypeError, ValueError):
        return 0.0


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", ""))
    except ValueError:
        return str(exc.body or "")[:500]
