"""Repairs: what an earlier reconcile left half done, found level-triggered like the pods.

A create answers for the pod alone; its Binding (`pin: binding`) and its Service are
separate requests that may fail after it. The next pass lists what is there and makes
what is missing, and removes Services whose pod is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from clusters.backends import (
    BackendError,
    BackendUnreachable,
    PodPhase,
    PodSpec,
    ReconcileReport,
)
from clusters.backends.kubernetes.manifests import POD_LABEL

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend


def repair(
    backend: KubernetesBackend,
    report: ReconcileReport,
    pool: ThreadPoolExecutor,
    existing: list[PodSpec],
) -> None:
    """Level-triggered, like the pods: a pod created in an earlier pass whose Binding
    or Service failed after the create gets them now; a Service without a wanted pod
    (its pod deleted by hand, say) goes."""
    jobs: list[Callable[[], Any]] = []
    if backend.pin == "binding":
        unbound = [
            spec
            for spec in existing
            if (status := report.statuses[spec.name]).phase == PodPhase.PENDING
            and not status.node_name
            and not status.terminating
        ]
        jobs += [lambda s=spec: backend.bind(s) for spec in unbound]
    try:
        services = backend._json(
            backend.api.list_service_for_all_namespaces, label_selector=backend.owner.selector
        )["items"]
    except ApiException as exc:
        report.errors.append(f"cannot list services: {exc.status} {exc.reason}")
        services = []
        existing = []  # unknown which exist: create none, and delete none
    # (namespace, the pod's name in GPUPool) -> the Service's name in the cluster
    listed = {
        (s["metadata"]["namespace"], (s["metadata"].get("labels") or {}).get(POD_LABEL, "")): s[
            "metadata"
        ]["name"]
        for s in services
    }
    keep = {(s.namespace, s.name) for s in existing if s.ports}
    jobs += [
        lambda s=spec: backend.ensure_service(s)
        for spec in existing
        if spec.ports and (spec.namespace, spec.name) not in listed
    ]
    jobs += [
        lambda ns=key[0], name=listed[key]: backend.delete_service(name, ns)
        for key in sorted(set(listed) - keep)
        if key[1] not in report.statuses  # a pod shutting down had it deleted already
    ]

    def run(job: Callable[[], Any]) -> None:
        try:
            job()
        except BackendUnreachable:
            raise
        except (ApiException, BackendError) as exc:
            report.errors.append(f"repair: {exc}")

    list(pool.map(run, jobs))
