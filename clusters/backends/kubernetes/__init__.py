"""A Kubernetes cluster through the official `kubernetes` client.

- Objects GPUPool creates carry `app.kubernetes.io/managed-by=gpupool` and the identities
  of this installation and this Cluster record (`ownership.py`); only those are listed,
  and nothing else is ever changed or deleted (but an adopted namespace's labels).
- A namespace per project (labelled, and annotated with its owner). One that exists
  already is adopted: it gets the labels and annotations (a namespace another tool's
  managed-by label, or another GPUPool's annotations, claims is refused, never taken).
- Pods satisfy the `restricted` Pod Security level unless their workload needs root; a
  pod the cluster's admission refuses (Pod Security, a webhook) fails its workload with
  the API server's message.
  Pods pinned to the node the cycle chose
  (`spec.nodeName`, or a Binding when config `pin: binding`), whole GPUs as
  `nvidia.com/gpu` limits. A fractional pod gets no GPU limit: a reservation pod per
  shared GPU holds the device, and shared pods see it through NVIDIA_VISIBLE_DEVICES.
- Pods that expose ports get a Service of the same name (ClusterIP: the portal's proxy and
  SSH tunnel reach them); with the cluster's `publish_ports` also a NodePort Service or an
  Ingress (`ingress_class`, `ingress_domain`) for their ports, never for the SSH server's.
- Calls are retried with exponential backoff on 5xx, 429 and connection errors; a
  cluster that cannot be listed is unreachable (the caller keeps its workloads).
- Lists and creates skip the client's model deserialization (`_preload_content=False`):
  it dominates the cost of large reconciles. The requests a pass makes by the thousand
  (Bindings, Events, Evictions, owner reads) skip the client's REST layer too: urllib3's
  own API on the client's pool (`_send`). Native pods are bound `bind_workers` (8) at once.
- Pods and services are observed through a list-then-watch cache (watch.py) kept per
  cluster in each worker process; a pass lists the cluster only when that cache cannot be
  trusted, and every `resync_s` (default 300) as a safety resync. Config `watch: false`
  lists on every pass (the poll).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from clusters.backends import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NO_FOREIGN_USE,
    PUBLISH_INGRESS,
    PUBLISH_NODEPORT,
    TERMINAL_PHASES,
    Backend,
    BackendError,
    BackendUnreachable,
    ForeignUse,
    MigKey,
    MigLayout,
    NodeInfo,
    PodPhase,
    PodSpec,
    PodSpecInvalid,
    PodStatus,
    ReconcileReport,
    as_enforced,
    grace_for,
    never_runs,
)
from clusters.backends.kubernetes import grants, native
from clusters.backends.kubernetes.errors import refused_by_admission
from clusters.backends.kubernetes.errors import said as _said
from clusters.backends.kubernetes.foreign import FIELD_SELECTOR as FOREIGN_SELECTOR
from clusters.backends.kubernetes.foreign import foreign_use
from clusters.backends.kubernetes.manifests import (
    DEFAULT_UID,
    MPS_ROOT,
    POD_LABEL,
    PROJECT_LABEL,
    ROLE,
    WORKLOAD_CONTAINER,
    hostfile_manifest,
    ingress_hosts,
    ingress_manifest,
    node_info,
    node_port_service_manifest,
    pod_manifest,
    pod_status,
    rendezvous_service_manifest,
    service_manifest,
)
from clusters.backends.kubernetes.mig import mig_publish
from clusters.backends.kubernetes.ownership import Owner, owner_of
from clusters.backends.kubernetes.repairs import repair
from clusters.backends.kubernetes.reservations import Reservations
from clusters.backends.kubernetes.watch import ClusterWatch, as_version, watch_get, watch_start
from clusters.crypto import KubeconfigKeyMissing, kubeconfig_decrypt

log = logging.getLogger(__name__)
RETRYABLE = {429, 500, 502, 503, 504}
WRITTEN_KINDS = {"Pod": "pods", "Service": "services"}
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
BIND_WORKERS = 8  # Bindings of native pods in flight at once (config `bind_workers`)


class KubernetesBackend(Backend):
    # The targeted pass (clusters.reconcile): a kept pod that lacks its Binding or a Service
    # says so in its status and is handed over with its workload instead.
    partial_reconcile = True

    def __init__(
        self, cluster: Any, *, kubeconfig: dict | None = None, installation: str | None = None
    ):
        super().__init__(cluster)
        self._kubeconfig = kubeconfig
        self._installation = installation
        self._owner: Owner | None = None
        self._api: k8s.CoreV1Api | None = None
        # The client's own pool of connections and the path below its URL (`direct`).
        self._direct: tuple[urllib3.HTTPConnectionPool | None, str] | None = None
        self._namespaces: set[str] = set()
        self._subject: dict[str, str] | None = None  # who the kubeconfig is (grants.py)
        self._rendezvous: set[tuple[str, str]] = set()
        self._listed: list[dict] | None = None
        self._native: list[native.NativePod] | None = None
        self._native_index: dict[tuple[str, str], native.NativePod] | None = None
        # Pods bound this pass on a 201, not read back: (namespace, name) -> (uid, node).
        self.bound_native: dict[tuple[str, str], tuple[str, str]] = {}
        self._services: list[dict] | None = None
        self.reservations = Reservations(self)
        config = cluster.config or {}
        self.attempts = int(config.get("retries", 4))
        self.backoff_s = float(config.get("backoff_s", 0.2))
        self.timeout = (
            float(config.get("connect_timeout_s", 3)),
            float(config.get("timeout_s", 10)),
        )
        self.workers = int(config.get("workers", 32))
        # A row that get_backend refuses (clusters/stored.py) may still be handed over
        # directly: held to the same bounds.
        self.bind_workers = min(max(int(config.get("bind_workers", BIND_WORKERS)), 1), 64)
        self.pin = config.get("pin", "nodeName")
        self.system_namespace = config.get("system_namespace", "gpupool-system")
        self.reservation_image = config.get("reservation_image", "ubuntu:24.04")
        self.priority_class = config.get("reservation_priority_class", "gpupool-reservation")
        self.run_as_user = config.get("run_as_user", DEFAULT_UID)
        self.publish_ports = config.get("publish_ports", "")
        self.ingress_class = config.get("ingress_class", "")
        self.ingress_domain = config.get("ingress_domain", "")
        self.mps_root = str(config.get("mps_root", MPS_ROOT))
        self.watch = bool(config.get("watch", True))
        self.resync_s = float(config.get("resync_s", 300))
        self.watch_wait_s = float(config.get("watch_wait_s", 2))
        # The highest resourceVersion of a pod / service this installation wrote, kept on
        # the Cluster row: a pass reads the watch cache only once it has seen them.
        state = getattr(cluster, "watch_state", None) or {}
        self.written = {r: as_version(state.get(r)) or 0 for r in ("pods", "services", "native")}
        self._written_saved = dict(self.written)
        self.observed_by = ""  # "watch" or "list": how the last pass saw the cluster
        self.requests = 0  # API requests this instance made (the bench counts them)
        self.bytes_read = 0

    # --- plumbing ----------------------------------------------------------------------------
    @property
    def owner(self) -> Owner:
        """This installation and Cluster record: in every label selector, name and
        namespace annotation (read from the database once per backend)."""
        if self._owner is None:
            self._owner = owner_of(self.cluster, self._installation)
        return self._owner

    @property
    def api(self) -> k8s.CoreV1Api:
        if self._api is None:
            api_client = self._api_client()
            api_client.configuration.retries = False  # our own retries, with backoff
            # A connection for each request in flight: those of the pass's pool of workers,
            # and the Bindings' (`_bind_into`).
            maxsize = max(self.workers, self.bind_workers)
            api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = maxsize
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
        self.requests += 1
        for attempt in range(self.attempts):
            try:
                answer = fn(*args, **kwargs)
                if kwargs.get("_preload_content") is False:
                    # Read to the end, kept on the answer: only then does its connection go
                    # back to the pool (unread, the next request opens another: on a real
                    # cluster, a TLS handshake per request).
                    self.bytes_read += len(answer.data)
                return answer
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

    def post(self, body: dict, *path: str) -> None:
        """POST a JSON body to /api/v1/<path...> (each piece quoted) and read nothing
        back but its status: the writes a pass makes by the thousand (Bindings, Evictions,
        Events) go through `_send`, without the generated API's per-call work nor its REST
        layer's, with the client's credentials, TLS, timeouts, retries and ApiException."""
        url = "/api/v1/" + "/".join(quote(p, safe="") for p in path)
        if self.direct is None:
            self.call(self._post_rest, body, url, _preload_content=False)
        else:
            data = json.dumps(body, separators=(",", ":")).encode()
            self.call(self._send, "POST", url, data, _preload_content=False)

    def get_json(self, fn: Callable[..., Any], path: str, *args: Any) -> dict:
        """GET one object: `path` (below the server's URL, its pieces quoted) through
        `_send`, or `fn(*args)` through the generated API where the client's pool cannot
        be used directly (an HTTP proxy). Retried and raised as `call` does."""
        if self.direct is None:
            return self._json(fn, *args)
        return json.loads(self.call(self._send, "GET", path, None, _preload_content=False).data)

    @property
    def direct(self) -> urllib3.HTTPConnectionPool | None:
        """The client's own urllib3 pool of connections to the API server (the same
        connections, TLS, client certificates, verification and keep-alive as its REST
        layer's); None through an HTTP proxy (a ProxyManager), where the REST layer is used."""
        if self._direct is None:
            client = self.api.api_client
            host, manager = client.configuration.host, client.rest_client.pool_manager
            pool = (
                None
                if isinstance(manager, urllib3.ProxyManager)
                else manager.connection_from_url(host)
            )
            self._direct = (pool, urlsplit(host).path.rstrip("/"))  # a server behind a path
        return self._direct[0]

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        _preload_content: bool,
        _request_timeout: Any,
    ) -> urllib3.BaseHTTPResponse:
        """One request through urllib3's API on the client's pool (`direct`), the answer
        read to its end and its connection given back; the client's REST layer and models
        are skipped (about 0.3 ms of CPU a request), not its configuration: URL prefix,
        default headers, credentials (refreshed tokens too), timeouts as the REST layer
        makes them. A status outside 2xx is the ApiException the generated client raises;
        a failed connection or a broken answer urllib3's error (no retries of its own:
        `call` retries)."""
        pool, prefix = self._direct or (None, "")
        assert pool is not None, "through an HTTP proxy: the REST layer"
        timeout = _request_timeout
        answer = pool.urlopen(
            method,
            prefix + path,
            body=body,
            headers=self._headers(json_body=body is not None),
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1])
            if isinstance(timeout, tuple)
            else urllib3.Timeout(total=timeout),
            retries=False,
            preload_content=True,
            release_conn=True,
        )
        if not 200 <= answer.status <= 299:
            raise ApiException(http_resp=rest.RESTResponse(answer))
        return answer

    def _headers(self, *, json_body: bool) -> dict[str, str]:
        """The client's default headers and credentials (refreshed tokens too), JSON."""
        client = self.api.api_client
        headers = {**client.default_headers, "Accept": "application/json"}
        if json_body:
            headers["Content-Type"] = "application/json"
        client.update_params_for_auth(headers, [], ["BearerToken"])
        return headers

    def _post_rest(
        self, body: dict, url: str, *, _preload_content: bool, _request_timeout: Any
    ) -> Any:
        """POST through the client's REST layer (through an HTTP proxy)."""
        client = self.api.api_client
        return client.rest_client.POST(
            client.configuration.host + url,
            headers=self._headers(json_body=True),
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )

    def _json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        response = self.call(fn, *args, _preload_content=False, **kwargs)
        answer = json.loads(response.data)
        resource = WRITTEN_KINDS.get(answer.get("kind", "")) if isinstance(answer, dict) else None
        if resource and fn.__name__.startswith(("create_", "delete_", "patch_", "replace_")):
            version = as_version((answer.get("metadata") or {}).get("resourceVersion")) or 0
            self.written[resource] = max(self.written[resource], version)
        return answer

    # --- inventory ---------------------------------------------------------------------------
    def test_connection(self) -> str:
        try:
            version = self._json(k8s.VersionApi(self.api.api_client).get_code)
            nodes = self._json(self.api.list_node)["items"]
        except ApiException as exc:
            raise BackendUnreachable(f"{self.cluster.name}: {exc.status} {exc.reason}") from exc
        return f"Kubernetes {version.get('gitVersion', '?')}: {len(nodes)} nodes"

    def kube_system_uid(self) -> str:
        """The uid of the cluster's kube-system namespace: made with the cluster and never
        changed, it tells one cluster from another whatever URL reaches it."""
        try:
            return str(self._json(self.api.read_namespace, "kube-system")["metadata"]["uid"])
        except ApiException as exc:
            raise BackendUnreachable(f"{self.cluster.name}: {_said(exc)}") from exc

    def list_inventory(self) -> list[NodeInfo]:
        try:
            items = self._json(self.api.list_node)["items"]
        except ApiException as exc:
            raise BackendUnreachable(f"cannot list nodes: {exc.status} {exc.reason}") from exc
        held = self.foreign_use()
        infos = [
            replace(node_info(item), foreign=held.get(item["metadata"]["name"], NO_FOREIGN_USE))
            for item in items
        ]
        if not getattr(self.cluster, "pk", None):
            return infos
        from clusters.mig import mig_mode_reported  # noqa: PLC0415 - models need apps ready

        # MIG mode is not on the Node object: each node's agent reads it through NVML.
        modes = mig_mode_reported(self.cluster)
        return [
            replace(
                info,
                gpus=tuple(replace(g, mig=g.index in modes.get(info.name, ())) for g in info.gpus),
            )
            for info in infos
        ]

    def foreign_use(self) -> dict[str, ForeignUse]:
        """What pods GPUPool did not bind hold, by node (foreign.py). One list of every
        bound, unfinished pod of the cluster: made with the inventory (every 60 s), not
        on each reconcile pass, whose watch sees only GPUPool's own pods."""
        try:
            pods = self._json(
                self.api.list_pod_for_all_namespaces, field_selector=FOREIGN_SELECTOR
            )["items"]
        except ApiException as exc:
            raise BackendUnreachable(f"cannot list pods: {exc.status} {exc.reason}") from exc
        return foreign_use(pods, self.owner)

    def mig_sync(self, wanted: MigLayout) -> tuple[dict[MigKey, str], list[str]]:
        """Publish each node's wanted MIG layout on its Node; its agent makes the instances
        and reports their devices (kubernetes/mig.py, clusters/agent/kubenode.py)."""
        return mig_publish(self, wanted)

    # --- pods --------------------------------------------------------------------------------
    def _list(self, fn: Callable[..., Any], what: str) -> dict:
        try:
            return self._json(fn, label_selector=self.owner.selector)
        except ApiException as exc:
            raise BackendUnreachable(f"cannot list {what}: {exc.status} {exc.reason}") from exc

    def _observe(self) -> None:
        """GPUPool's pods and services now: from this process's watch cache when it has
        caught up with our own writes and is not due a resync, else from a full list
        (which also starts the watch, or refreshes its cache)."""
        native.caught_up(self, self._watch())  # binds made outside a reconcile, if any
        watch = self._watch()
        if watch is not None:
            pods, services, natives = (
                getattr(watch, r).cache.fresh(self.written[r], self.resync_s, self.watch_wait_s)
                for r in ("pods", "services", "native")
            )
            if pods is not None and services is not None and natives is not None:
                # A pass that reads the cache still asks the server one small thing: a
                # cluster that stopped answering is marked unreachable, as the poll did,
                # even while a half-open watch connection has not noticed yet.
                self._alive()
                self._listed, self._services, self.observed_by = pods, services, "watch"
                self._native = native.native_pods(self, natives)
                return
        pods = self._list(self.api.list_pod_for_all_namespaces, "pods")
        services = self._list(self.api.list_service_for_all_namespaces, "services")
        natives = native.list_native(self)
        self._listed, self._services = pods["items"], services["items"]
        self._native = native.native_pods(self, natives["items"])
        self.observed_by = "list"
        if not self.watch:
            return
        seeds = {
            "pods": (pods["items"], pods["metadata"].get("resourceVersion")),
            "services": (services["items"], services["metadata"].get("resourceVersion")),
            "native": (natives["items"], natives["metadata"].get("resourceVersion")),
        }
        if watch is None:
            watch_start(self, _fingerprint(self), seeds)
        else:  # the periodic resync, or the watch fell behind: the cache takes the list
            for resource, (items, version) in seeds.items():
                getattr(watch, resource).cache.replace(items, version)

    def _alive(self) -> None:
        try:
            self._json(k8s.VersionApi(self.api.api_client).get_code)
        except ApiException as exc:
            raise BackendUnreachable(f"{self.cluster.name}: {exc.status} {exc.reason}") from exc

    def managed_services(self) -> list[dict]:
        """The services observed with this pass's pods (repairs compares them)."""
        if self._services is None:
            self._observe()
        return list(self._services or [])

    def _watch(self) -> ClusterWatch | None:
        """This process's watch of the cluster, when it runs one."""
        return watch_get(self.cluster.pk, _fingerprint(self)) if self.watch else None

    def native_listed(self, namespace: str, name: str) -> native.NativePod | None:
        """The native pod of that name as this pass observed it (None: not observed)."""
        if self._native is None:
            return None
        if self._native_index is None:
            self._native_index = {p.key: p for p in self._native}
        return self._native_index.get((namespace, name))

    def save_written(self) -> None:
        """Keep the versions this pass wrote on the Cluster row, for the next pass in
        whichever worker process runs it (read-your-writes through the watch cache)."""
        native.caught_up(self, self._watch())
        if self.written == self._written_saved or not getattr(self.cluster, "pk", None):
            return
        state = {r: str(v) for r, v in self.written.items()}
        type(self.cluster).objects.filter(pk=self.cluster.pk).update(watch_state=state)
        self.cluster.watch_state = state
        self._written_saved = dict(self.written)

    def pod_statuses(self) -> dict[str, PodStatus]:
        # Kept for the reconcile that usually follows at once: one observation per pass
        # (made already when the pass began with the pods that name our scheduler).
        if self._listed is None:
            self._observe()
        return self._statuses()

    def _statuses(self) -> dict[str, PodStatus]:
        """GPUPool's pods: those it made, and those it bound (native pods)."""
        ours = native.identity(self)
        statuses = _workload_statuses(self._listed or [])
        self._mark_incomplete(statuses)
        for pod in self.native_pods():
            if pod.bound_by(ours) and pod.annotations.get(native.POD_NAME):
                status = native.native_status(pod)
                statuses[status.name] = status
        return statuses

    def _mark_incomplete(self, statuses: dict[str, PodStatus]) -> None:
        """What a pod of ours lacks that the pass that made it made beside it: its Binding
        (`pin: binding`), its own Service (a pod with ports), its gang's headless Service.
        A full pass repairs these for every pod; a targeted one, for the pods marked."""
        services = {
            (s["metadata"]["namespace"], s["metadata"]["name"]) for s in self._services or []
        }
        for pod in self._listed or []:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            status = statuses.get(meta["labels"].get(POD_LABEL, ""))
            if status is None or status.terminating or meta.get("deletionTimestamp"):
                continue
            unbound = (
                self.pin == "binding" and status.phase == PodPhase.PENDING and not status.node_name
            )
            own = bool(status.ports) and (status.namespace, meta["name"]) not in services
            gang = spec.get("subdomain") and (status.namespace, spec["subdomain"]) not in services
            status.incomplete = "binding" if unbound else "service" if own or gang else ""

    def native_pods(self) -> list[native.NativePod]:
        """The pods that name our scheduler, observed with GPUPool's own, once a pass
        (clusters/native.py)."""
        if self._native is None:
            self._observe()
        return self._native or []

    def create_manifest(self, body: dict, plural: str, templates: list[tuple[str, dict]]) -> dict:
        """Create an object a user submitted as YAML (a Pod, a Job, a PyTorchJob...) in its
        namespace, which must be the project's (clusters/manifest_submit.py checked it, its
        kind, and found its pod `templates`)."""
        return native.create(self, body, plural, templates)

    def ensure_namespace(self, name: str, project: str = "", *, shared: bool = False) -> None:
        """A project's namespace belongs to one installation and Cluster record (its
        annotations say which); the system namespace of reservation pods is `shared` by
        every GPUPool on the cluster, whose pods there are told apart by their labels."""
        if name in self._namespaces:
            return
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        if not shared:
            labels[PROJECT_LABEL] = (project or name)[:63]
        annotations = {} if shared else self.owner.identity
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations}}
        try:
            self.call(self.api.create_namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"namespace {name}: {_said(exc)}") from exc
            self._adopt_namespace(name, labels, annotations)
        if not shared:  # where users' manifests are created (grants.py)
            if self._subject is None:
                self._subject = grants.subject(self) or {}
            if self._subject:
                grants.ensure_grant(self, name, self._subject)
        self._namespaces.add(name)

    def _adopt_namespace(self, name: str, labels: dict[str, str], annotations: dict) -> None:
        """The namespace exists already: ours (from an earlier try, or before a rename of
        the project) or made by hand for the project. It gets GPUPool's labels and owner
        annotations, so that it is known as the project's; one another tool manages, or
        another GPUPool (installation or Cluster record) owns, is refused, not taken: for
        good (PodSpecInvalid), its pods' workloads fail with the reason."""
        try:
            found = self._json(self.api.read_namespace, name)
        except ApiException as exc:
            raise BackendError(f"namespace {name}: {_said(exc)}") from exc
        current = found.get("metadata", {}).get("labels") or {}
        claimed = found.get("metadata", {}).get("annotations") or {}
        manager = current.get(MANAGED_BY_LABEL)
        if manager not in (None, MANAGED_BY):
            raise PodSpecInvalid(
                f"namespace {name} exists and is managed by {manager}: give the project "
                "another namespace or remove that label"
            )
        others = {k: claimed[k] for k, v in annotations.items() if claimed.get(k, v) != v}
        if others:
            owner = ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
            raise PodSpecInvalid(
                f"namespace {name} belongs to another GPUPool ({owner}): give the project "
                "another namespace, or remove those annotations if that GPUPool is gone"
            )
        if all(current.get(k) == v for k, v in labels.items()) and all(
            claimed.get(k) == v for k, v in annotations.items()
        ):
            return
        patch = {"metadata": {"labels": labels, "annotations": annotations}}
        try:
            self.call(self.api.patch_namespace, name, patch, _preload_content=False)
        except ApiException as exc:
            raise BackendError(f"namespace {name}: {_said(exc)}") from exc
        if manager is None:
            log.info("%s: adopted the existing namespace %s", self.cluster.name, name)

    def ensure_pod(self, spec: PodSpec) -> PodStatus:
        if spec.native_pod:
            return native.bind(self, spec)
        spec = as_enforced(spec, self.cluster.config)
        self.ensure_namespace(spec.namespace, spec.project)
        self.ensure_rendezvous(spec)
        body = pod_manifest(
            spec,
            self.owner,
            pin_with_node_name=self.pin != "binding",
            uid=self.run_as_user,
            mps_root=self.mps_root,
        )
        try:
            created = self._json(self.api.create_namespaced_pod, spec.namespace, body)
            if self.pin == "binding":
                self.bind(spec)
        except ApiException as exc:
            if exc.status in (400, 422) or refused_by_admission(exc):
                raise PodSpecInvalid(_said(exc) + (MPS_REFUSED if spec.mps else "")) from exc
            if exc.status != 409:
                raise BackendError(f"pod {spec.name}: {_said(exc)}") from exc
            created = self._adopt(spec)
        if spec.ports:
            self.ensure_service(spec)
        return pod_status(created)

    def bind(self, spec: PodSpec) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": self.owner.object_name(spec.name)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": spec.node_name},
        }
        try:
            self.post(
                body, "namespaces", spec.namespace, "pods", body["metadata"]["name"], "binding"
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: bound already, by a try whose answer was lost
                raise

    def _adopt(self, spec: PodSpec) -> dict:
        """409 on create: ours from an earlier attempt whose answer was lost, or a stranger's
        (another GPUPool's among them): only a pod with both of our identities is ours."""
        name = self.owner.object_name(spec.name)
        try:
            pod = self._json(self.api.read_namespaced_pod, name, spec.namespace)
        except ApiException as exc:  # an injected or racing conflict: retry next pass
            raise BackendError(f"pod {spec.name}: conflict, then {exc.status}") from exc
        labels = pod["metadata"].get("labels") or {}
        if not self.owner.owns(labels) or labels.get("gpupool.io/workload-id") != str(
            spec.workload_id
        ):
            raise BackendError(
                f"a pod named {spec.namespace}/{name} exists that GPUPool did not create"
            )
        return pod

    def ensure_service(self, spec: PodSpec) -> None:
        """The pod's own (ClusterIP) Service, and what the admin publishes beside it."""
        try:
            try:
                service = self._json(
                    self.api.create_namespaced_service,
                    spec.namespace,
                    service_manifest(spec, self.owner),
                )
            except ApiException as exc:
                if exc.status != 409 or not self.publish_ports:
                    raise
                name = self.owner.object_name(spec.name)
                service = self._json(self.api.read_namespaced_service, name, spec.namespace)
            self.publish(spec, service)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"service {spec.name}: {_said(exc)}") from exc

    def publish(self, spec: PodSpec, service: dict) -> None:
        """The cluster's choice (config `publish_ports`): the pod's ports, never its SSH
        server's, on every node or through an Ingress class. Owned by the pod's Service,
        they go with it. A 409 is ours from an earlier pass."""
        if self.publish_ports == PUBLISH_NODEPORT:
            body = node_port_service_manifest(spec, self.owner, service)
            create = self.api.create_namespaced_service
        elif self.publish_ports == PUBLISH_INGRESS:
            body = ingress_manifest(spec, self.owner, service, ingress_class=self.ingress_class,
                                    domain=self.ingress_domain)  # fmt: skip
            create = k8s.NetworkingV1Api(self.api.api_client).create_namespaced_ingress
        else:
            return
        if body is None:
            return
        if self.publish_ports == PUBLISH_INGRESS:
            self._refuse_taken_hosts(spec, body)
        try:
            self._json(create, spec.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _refuse_taken_hosts(self, spec: PodSpec, body: dict) -> None:
        """An API server takes two Ingresses with one host (the controller then routes one
        tenant's traffic to the other's pod): a host an Ingress that is not ours holds
        already is refused, the cluster's error, and the pod runs unpublished. Hosts are
        cluster-wide, so every namespace's Ingresses are listed (only when one is made)."""
        wanted = ingress_hosts(body)
        api = k8s.NetworkingV1Api(self.api.api_client)
        for other in self._json(api.list_ingress_for_all_namespaces)["items"]:
            meta = other["metadata"]
            taken = wanted & ingress_hosts(other)
            if taken and not self.owner.owns(meta.get("labels")):
                raise BackendError(
                    f"ingress for {spec.name}: host {', '.join(sorted(taken))} is taken by "
                    f"ingress {meta.get('namespace')}/{meta['name']}, which is not this "
                    "GPUPool's: not published (its ports stay reachable through the portal)"
                )

    def ensure_rendezvous(self, spec: PodSpec) -> None:
        """A distributed workload's headless Service and hostfile ConfigMap, made before
        its first pod (another pod of the workload may race us: 409 is fine)."""
        if spec.rendezvous is None or (spec.namespace, spec.rendezvous.service) in self._rendezvous:
            return
        name = spec.rendezvous.service
        try:
            try:
                service = self._json(
                    self.api.create_namespaced_service,
                    spec.namespace,
                    rendezvous_service_manifest(spec, self.owner),
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
                service = self._json(self.api.read_namespaced_service, name, spec.namespace)
                labels = service["metadata"].get("labels") or {}
                if (
                    labels.get(ROLE) != "rendezvous"
                    or not self.owner.owns(labels)
                    or labels.get("gpupool.io/workload-id") != str(spec.workload_id)
                ):
                    raise BackendError(
                        f"a service named {spec.namespace}/{name} exists that GPUPool did not "
                        "create"
                    ) from exc
            try:
                self._json(
                    self.api.create_namespaced_config_map,
                    spec.namespace,
                    hostfile_manifest(spec, service),
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
        except ApiException as exc:
            raise BackendError(f"rendezvous {name}: {_said(exc)}") from exc
        self._rendezvous.add((spec.namespace, name))

    def delete_pod(self, status: PodStatus, *, grace_period_s: int) -> bool:
        if status.terminating and not status.stuck:
            return False  # asked already; the kubelet is giving it its grace period
        if status.native:  # not ours to delete: evicted, as its disruption budget allows
            # A finished one holds nothing and stays for its owner (`kubectl logs`).
            return status.phase in TERMINAL_PHASES or native.evict(
                self, status, grace_period_s=grace_period_s
            )
        name = self.owner.object_name(status.name)
        self.delete_service(name, status.namespace)
        gone = self.delete_quietly(
            self.api.delete_namespaced_pod,
            name,
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
        # A pod that must shut down comes back with a deletionTimestamp and its grace; one
        # removed at once (grace 0, never bound, already finished) comes back with grace 0,
        # and is gone (the next read is 404). Other kinds come back without a timestamp.
        meta = answer.get("metadata") or {}
        return not meta.get("deletionTimestamp") or meta.get("deletionGracePeriodSeconds") == 0

    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        try:
            return self.read_log(
                self.owner.object_name(name), namespace, WORKLOAD_CONTAINER, tail_lines
            )
        except (ApiException, BackendError) as exc:
            return f"(logs unavailable: {exc})"

    def native_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        """The output of a pod made outside GPUPool (its first container's)."""
        try:
            pod = self._json(self.api.read_namespaced_pod, name, namespace)
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            return self.read_log(name, namespace, containers[0].get("name", ""), tail_lines)
        except (ApiException, BackendError) as exc:
            return f"(logs unavailable: {_said(exc) if isinstance(exc, ApiException) else exc})"

    def read_log(self, name: str, namespace: str, container: str, tail_lines: int) -> str:
        """The log of one container of a pod, by its Kubernetes name; raises ApiException
        (400 when the container is not the pod's, or has not started)."""
        response = self.call(
            self.api.read_namespaced_pod_log,
            name,
            namespace,
            container=container,
            tail_lines=tail_lines,
            _preload_content=False,
        )
        return response.data.decode("utf-8", "replace")

    # --- reconcile ---------------------------------------------------------------------------
    def reconcile(
        self,
        desired: list[PodSpec],
        *,
        grace_period_s: int,
        grace_periods: Mapping[int, int] | None = None,
        keep: frozenset[str] = frozenset(),
        observed: Mapping[str, PodStatus] | None = None,
    ) -> ReconcileReport:
        """1. list managed pods; 2. delete those nobody wants, each with its workload's
        grace period (deleteOptions gracePeriodSeconds); 3. reservation pods for the shared
        GPUs in use; 4. create what is missing (shared pods once their device is known, a
        native sharer once its GPU's MPS daemon runs for it), in namespaces that exist;
        5. repair what an earlier pass left half done (a pod whose Binding failed, a Service
        missing or left over).
        A targeted pass hands the pods to `keep` as they are by name: they stay, their
        shared GPUs keep their reservations (observed sharers), their Services stay (their
        pods are there); one that lacked something was not kept (`_mark_incomplete`).
        `observed`: this pass's statuses, read a moment ago from the same observation.
        Deletes and creates run on a thread pool: reconcile is latency-bound."""
        if self._listed is None:
            self._observe()
        pods = self._listed or []
        report = ReconcileReport(statuses=dict(observed) if observed else self._statuses())
        wanted = {spec.name: spec for spec in desired}
        doomed = [s for n, s in report.statuses.items() if n not in wanted and n not in keep]
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
            # The sharers there: GPUPool's own pods, and the native pods it bound.
            bound = [p.raw for p in self.native_pods() if p.annotations.get(native.POD_NAME)]
            devices = self.reservations.sync(pods + bound, desired, report)
            report.mps_devices.update(devices)  # the node agents run these GPUs' daemons
            missing = [
                ready
                for spec in desired
                if spec.name not in report.statuses
                and (ready := _on_device(spec, devices)) is not None
                and not native.waits_for_mps(self, ready, report)
            ]
            missing = self._namespaces_into(report, missing)
            list(pool.map(lambda s: self._create_into(report, s), _own(missing)))
            self._bind_into(report, [s for s in missing if s.native_pod])
            repair(self, report, pool, existing)
        self.save_written()
        self._listed = self._services = self._native = None  # the next pass observes afresh
        self._native_index = None
        return report

    def _bind_into(self, report: ReconcileReport, specs: list[PodSpec]) -> None:
        """Bind native pods, `bind_workers` Bindings in flight at once (kube-scheduler binds
        each pod in a goroutine of its own): while the API server answers one, this side
        writes the next, and the two processes' CPU overlap. The threads only ask the API
        server (`native.bind`: the Binding, then its `Scheduled` event) and put each pod's
        status or error into the report, as `_create_into` does; the database stays this
        thread's (the owner, the one thing a Binding reads of it, is read here first). An
        exception other than a pod's own error reaches the caller."""
        if not specs:
            return
        _ = self.owner
        workers = min(self.bind_workers, len(specs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bind") as binders:
            list(binders.map(lambda s: self._create_into(report, s), specs))

    def _namespaces_into(self, report: ReconcileReport, missing: list[PodSpec]) -> list[PodSpec]:
        """Create the projects' namespaces; the pods whose namespace is ready. One another
        GPUPool owns or another tool manages fails its pods' workloads with the reason; one
        that fails otherwise (403 from RBAC, 5xx) holds back only its own pods, is the
        cluster's error and is tried again on the next pass."""
        refused: dict[str, str | None] = {}
        for namespace, project in sorted({(s.namespace, s.project) for s in missing}):
            try:
                self.ensure_namespace(namespace, project)
            except PodSpecInvalid as exc:
                refused[namespace] = str(exc)
            except BackendError as exc:
                report.errors.append(str(exc))
                refused[namespace] = None
        for spec in missing:
            if refused.get(spec.namespace):
                report.statuses[spec.name] = never_runs(spec, refused[spec.namespace])
        return [s for s in missing if s.namespace not in refused]


MPS_REFUSED = (
    " (its GPU share is enforced through MPS, which needs hostIPC and its GPU's pipe folder "
    "from the host: let the project's namespace run privileged pods, or set `mps: false` in "
    "the cluster's config to share GPUs without enforced limits)"
)


def _own(specs: list[PodSpec]) -> list[PodSpec]:
    """GPUPool's own pods among the specs (not native pods, which are bound instead)."""
    return [spec for spec in specs if not spec.native_pod]


def _workload_statuses(pods: list[dict]) -> dict[str, PodStatus]:
    """The workload pods' statuses by their names in GPUPool (`gp-<workload>-<index>`)."""
    statuses = (pod_status(p) for p in pods if p["metadata"]["labels"].get(ROLE) == "workload")
    return {status.name: status for status in statuses}


def _fingerprint(backend: KubernetesBackend) -> str:
    """Which API server, credentials and owner (installation and Cluster record) a watch
    was made with: a changed kubeconfig, or another owner, gets a watch of its own."""
    source = backend._kubeconfig or getattr(backend.cluster, "kubeconfig_encrypted", "")
    raw = json.dumps([source, backend.owner.selector], sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()


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
