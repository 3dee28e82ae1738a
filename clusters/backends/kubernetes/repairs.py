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
from clusters.backends.kubernetes.manifests import POD_LABEL, ROLE

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
        services = backend.managed_services()  # observed with the pods (watch or list)
    except BackendError as exc:
        report.errors.append(f"cannot list services: {exc}")
        services = []
        existing = []  # unknown which exist: create none, and delete none
    # Services by their names in the cluster (the owner's identities in each).
    listed = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services}
    name = backend.owner.object_name
    keep = {(s.namespace, name(s.name)) for s in existing if s.ports}
    jobs += [
        lambda s=spec: backend.ensure_service(s)
        for spec in existing
        if spec.ports and (spec.namespace, name(spec.name)) not in listed
    ]
    jobs += [
        lambda s=spec: backend.ensure_rendezvous(s)
        for spec in existing
        if spec.rendezvous and (spec.namespace, spec.rendezvous.service) not in listed
    ]
    # A headless Service stays while any pod of its workload is there (running, starting,
    # shutting down); a pod's own Service goes with its pod (deleted with it already).
    # Pods are known by their names in GPUPool: a pod's Service carries it as a label.
    workloads = {(s.namespace, str(s.workload_id)) for s in report.statuses.values()}
    jobs += [
        lambda ns=ns, service=service: backend.delete_service(service, ns)
        for ns, service, labels in sorted(
            (s["metadata"]["namespace"], s["metadata"]["name"], s["metadata"].get("labels") or {})
            for s in services
        )
        if (ns, service) not in keep
        and (
            (ns, labels.get("gpupool.io/workload-id")) not in workloads
            if labels.get(ROLE) == "rendezvous"
            else labels.get(POD_LABEL) not in report.statuses
            and labels.get(POD_LABEL) not in report.deleted
        )
    ]

    def run(job: Callable[[], Any]) -> None:
        try:
            job()
        except BackendUnreachable:
            raise
        except (ApiException, BackendError) as exc:
            report.errors.append(f"repair: {exc}")

    list(pool.map(run, jobs))
