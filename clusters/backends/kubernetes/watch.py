"""List-then-watch: a per-cluster cache of GPUPool's pods and services, kept current by a watch.

One `ClusterWatch` per cluster per worker process. Its threads (one per resource) list
once, then watch from the list's resourceVersion with bookmarks, resume from the last
resourceVersion seen when a watch ends (timeoutSeconds, a dropped connection), and list
again on 410 Gone or any other ERROR event. A reconcile pass reads the cache instead of
listing the cluster when the cache is fresh enough (see `KubernetesBackend._observe`):

- it has caught up with the highest resourceVersion GPUPool itself wrote to the cluster
  (kept per cluster in the database, so a pass in another worker process that wrote last
  is seen too): read-your-writes, so a pod created a moment ago is never taken for lost;
- its watch is connected (or was, a moment ago) and its last full list is younger than the
  resync period: the full list stays as a periodic safety net.
Otherwise the pass lists, as it did before watches, and hands the list to the cache.

resourceVersions are compared as integers (etcd revisions). Kubernetes calls them opaque;
a server whose versions are not integers gets the list on every pass.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)
Key = tuple[str, str]  # namespace, name


def as_version(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ObjectCache:
    """The objects of one resource as the last list plus the watch events since say."""

    def __init__(self, resource: str):
        self.resource = resource
        self.items: dict[Key, dict] = {}
        self.version: int | None = None  # everything up to here is in `items`
        self.listed_at = 0.0  # monotonic time of the full list the cache rests on
        self.connected = False  # a watch stream is open now
        self.changed = threading.Condition()

    def replace(self, items: list[dict], version: Any) -> bool:
        """A full list; kept unless the watch already holds a later state."""
        number = as_version(version)
        with self.changed:
            if number is None or (self.version is not None and number < self.version):
                return False
            self.items = {_key(item): item for item in items}
            self.version = number
            self.listed_at = time.monotonic()
            self.changed.notify_all()
            return True

    def apply(self, kind: str, obj: dict) -> dict | None:
        """One watch event; returns the object it replaced (None if new). Events at or
        below the cache's version are already in it (a list taken meanwhile) and skipped."""
        number = as_version((obj.get("metadata") or {}).get("resourceVersion"))
        with self.changed:
            if number is None or self.version is None or number <= self.version:
                return None
            self.version = number
            if kind == "BOOKMARK":
                previous = None
            elif kind == "DELETED":
                previous = self.items.pop(_key(obj), None)
            else:
                previous = self.items.get(_key(obj))
                self.items[_key(obj)] = obj
            self.changed.notify_all()
            return previous

    def forget(self) -> None:
        """The watch cannot resume (410 Gone): the cache is stale until the next list."""
        with self.changed:
            self.version = None
            self.connected = False

    def fresh(self, written: int, resync_s: float, wait_s: float) -> list[dict] | None:
        """The objects, once the cache holds everything up to `written` (waiting up to
        `wait_s` for the watch to deliver it); None when the cache cannot be trusted."""
        deadline = time.monotonic() + wait_s
        with self.changed:
            while True:
                if self.version is None or not self.connected:
                    return None
                if time.monotonic() - self.listed_at > resync_s:
                    return None  # the periodic safety resync is due
                if self.version >= written:
                    return list(self.items.values())
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def wait_for(self, check: Callable[[dict[Key, dict]], bool], wait_s: float) -> int | None:
        """The cache's version once `check(items)` holds (waiting up to `wait_s` for the
        watch to deliver it); None when it does not in time, or the cache cannot be trusted."""
        deadline = time.monotonic() + wait_s
        with self.changed:
            while self.version is not None and self.connected:
                if check(self.items):
                    return self.version
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return None


def _key(obj: dict) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class ResourceWatch(threading.Thread):
    """List, then watch one resource from the list's version; resume, or list again."""

    def __init__(
        self,
        owner: ClusterWatch,
        resource: str,
        list_fn: Callable[..., Any],
        on_event: Callable[[str, dict, dict | None], None] | None = None,
        *,
        selector: dict[str, str] | None = None,
    ):
        super().__init__(name=f"gpupool-watch-{owner.name}-{resource}", daemon=True)
        self.owner = owner
        self.cache = ObjectCache(resource)
        self.list_fn = list_fn
        self.on_event = on_event
        # Which objects: GPUPool's (its label selector), or a field selector's.
        self.selector = selector or {"label_selector": owner.selector}
        self.response: Any = None

    def run(self) -> None:
        failures = 0
        while not self.owner.stopped.is_set():
            try:
                if self.cache.version is None:
                    self.relist()
                self.stream()
                failures = 0
            except Exception as exc:
                # Anything the server or the network throws: the cache is marked not
                # connected (passes list instead) and the watch resumes after a pause.
                self.cache.connected = False
                failures += 1
                if self.owner.stopped.is_set():
                    return
                pause = min(self.owner.backoff_s * 2 ** min(failures, 6), 30.0)
                log.info("%s: watch of %s failed (%s)", self.owner.name, self.cache.resource, exc)
                self.owner.stopped.wait(pause)
            if time.monotonic() - self.owner.used_at > self.owner.idle_s:
                log.info("%s: watch of %s idle, stopped", self.owner.name, self.cache.resource)
                self.owner.stopped.set()
        self.cache.connected = False

    def relist(self) -> None:
        answer = self.owner.backend._json(self.list_fn, **self.selector)
        self.cache.replace(answer["items"], answer["metadata"].get("resourceVersion"))

    def stream(self) -> None:
        """One watch request, until the server ends it (timeoutSeconds) or it fails."""
        backend = self.owner.backend
        self.response = self.list_fn(
            **self.selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=str(self.cache.version),
            timeout_seconds=self.owner.timeout_s,
            _preload_content=False,
            _request_timeout=(backend.timeout[0], self.owner.timeout_s + 30),
        )
        try:
            self.cache.connected = True
            for line in iter_resp_lines(self.response):
                if self.owner.stopped.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    # 410 Gone (the version left the server's window), 504 (a version
                    # the server does not know yet), anything else: start from a list.
                    log.info("%s: watch of %s: %s", self.owner.name, self.cache.resource, obj)
                    self.cache.forget()
                    return
                previous = self.cache.apply(kind, obj)
                if self.on_event is not None and kind != "BOOKMARK":
                    self.on_event(kind, obj, previous)
        finally:
            self.response.release_conn()
            self.response = None

    def stop(self) -> None:
        response = self.response
        if response is not None:
            # Wakes the thread blocked reading the stream; it may have ended meanwhile.
            with contextlib.suppress(Exception):
                response.shutdown()


class ClusterWatch:
    """The pods and services of one cluster, and the pods that name its scheduler, watched
    by three threads of this process."""

    def __init__(self, backend: Any, *, fingerprint: str, on_change: Callable[[], None] | None):
        config = backend.cluster.config or {}
        self.backend = backend
        self.name = backend.cluster.name
        self.fingerprint = fingerprint
        self.selector = backend.owner.selector  # this installation's and record's objects
        self.timeout_s = int(config.get("watch_timeout_s", 300))
        self.idle_s = float(config.get("watch_idle_s", 600))
        self.backoff_s = backend.backoff_s
        self.on_change = on_change
        self.stopped = threading.Event()
        self.used_at = time.monotonic()
        api = backend.api
        self.pods = ResourceWatch(self, "pods", api.list_pod_for_all_namespaces, self._pod_event)
        self.services = ResourceWatch(self, "services", api.list_service_for_all_namespaces)
        # Pods made outside GPUPool that name its scheduler (clusters/native.py).
        self.native = ResourceWatch(
            self,
            "native",
            api.list_pod_for_all_namespaces,
            self._native_event,
            selector=native_selector(backend),
        )
        self.threads = (self.pods, self.services, self.native)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.stop()

    @property
    def alive(self) -> bool:
        return not self.stopped.is_set() and all(t.is_alive() for t in self.threads)

    def _native_event(self, kind: str, obj: dict, previous: dict | None) -> None:
        """A new pod to queue asks for a reconcile at once (its intake); a change of one
        as for GPUPool's own pods."""
        if self.on_change is not None and kind == "ADDED":
            self.on_change()
        else:
            self._pod_event(kind, obj, previous)

    def _pod_event(self, kind: str, obj: dict, previous: dict | None) -> None:
        """Ask for a reconcile when a pod changed in a way a pass acts on: its phase, a
        container that ended or waits, a deletion; not for the pods GPUPool just created."""
        if self.on_change is None or kind == "ADDED":
            return
        if kind == "DELETED" or previous is None or _facts(obj) != _facts(previous):
            self.on_change()


def native_selector(backend: Any) -> dict[str, str]:
    """The pods that name the cluster's scheduler (clusters/backends/kubernetes/native.py)."""
    from clusters.backends.kubernetes.native import scheduler_name  # noqa: PLC0415 - a cycle

    return {"field_selector": f"spec.schedulerName={scheduler_name(backend)}"}


def _facts(pod: dict) -> tuple:
    status = pod.get("status") or {}
    states = tuple(
        tuple(sorted((c.get("state") or {}).keys())) for c in status.get("containerStatuses") or []
    )
    meta = pod.get("metadata") or {}
    return (status.get("phase"), states, bool(meta.get("deletionTimestamp")))


# --- the watches of this process -----------------------------------------------------------
_lock = threading.Lock()
_watches: dict[int, ClusterWatch] = {}
_pid = os.getpid()
_on_change: Callable[[int], None] | None = None


def set_change_listener(listener: Callable[[int], None] | None) -> None:
    """Called with the cluster's id when a watch sees a pod change a pass acts on (the
    Celery worker enqueues a reconcile; see clusters.tasks)."""
    global _on_change  # noqa: PLW0603 - one listener per process
    _on_change = listener


def watch_get(cluster_id: int, fingerprint: str) -> ClusterWatch | None:
    """This process's running watch of the cluster, if any. A forked process (a Celery
    prefork child) inherits no threads: it forgets the parent's watches."""
    global _pid  # noqa: PLW0603
    with _lock:
        if os.getpid() != _pid:
            _watches.clear()
            _pid = os.getpid()
        current = _watches.get(cluster_id)
        if current is not None and current.alive and current.fingerprint == fingerprint:
            current.used_at = time.monotonic()
            return current
        return None


def watch_start(backend: Any, fingerprint: str, seeds: dict[str, tuple[list, Any]]) -> ClusterWatch:
    """Start watching from a list the pass just made ({resource: (items, version)}), so
    the new watch does not list again. One that ran before (kubeconfig changed) stops."""
    cluster_id = backend.cluster.pk

    def changed() -> None:
        listener = _on_change  # the one set now (a worker sets it after start-up)
        if listener is not None:
            listener(cluster_id)

    # Its own client: the pass's backend is made per task run, the watch outlives it.
    # The owner is read from the database here, not in the watch's threads.
    own = type(backend)(
        backend.cluster, kubeconfig=backend._kubeconfig, installation=backend.owner.installation
    )
    watch = ClusterWatch(own, fingerprint=fingerprint, on_change=changed)
    for resource, (items, version) in seeds.items():
        cache = getattr(watch, resource).cache
        # Trusted from now: its thread watches from exactly this version (a failure
        # to do so marks it not connected), and events since then replay from there.
        cache.connected = cache.replace(items, version)
    with _lock:
        previous = _watches.pop(cluster_id, None)
        if previous is not None:
            previous.stop()
        _watches[cluster_id] = watch
    watch.start()
    return watch


def watches_stop(cluster_id: int | None = None) -> None:
    """Stop this process's watches (all, or one cluster's): tests, a disabled cluster."""
    with _lock:
        ids = list(_watches) if cluster_id is None else [cluster_id]
        for key in ids:
            watch = _watches.pop(key, None)
            if watch is not None:
                watch.stop()
