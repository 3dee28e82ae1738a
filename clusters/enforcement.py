"""Which namespaces the pod webhook changes (clusters/admission.py): those of projects that
enforce GPUPool's scheduler carry `gpupool.io/enforce-scheduler=true`, which the
MutatingWebhookConfiguration's namespaceSelector selects (deploy/webhook/).

`enforcement_sync(cluster)` makes the cluster's labels match the database, level-triggered:
after each inventory sync (every 60 s) and on commit of a project's change. It costs one
list of the labelled namespaces, plus a write per namespace whose label must change.
"""

from __future__ import annotations

import logging

from kubernetes.client.exceptions import ApiException

from clusters.admission import ENFORCE_LABEL
from clusters.backends import BackendError
from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.errors import said
from clusters.models import Backend, Cluster
from portal.models import Project

log = logging.getLogger(__name__)


def enforcing_projects(cluster: Cluster) -> dict[str, str]:
    """namespace -> project name, for the projects that enforce the scheduler and have
    quota in one of the cluster's pools (a project's namespace is made where it may run)."""
    rows = (
        Project.objects.filter(enforce_scheduler=True, quotas__node_pool__cluster=cluster)
        .distinct()
        .values_list("namespace", "name")
    )
    return dict(rows)


def enforcement_sync(cluster: Cluster, backend: KubernetesBackend | None = None) -> list[str]:
    """1. list the namespaces labelled now; 2. label the enforcing projects' namespaces
    (made if missing, as for their pods); 3. unlabel the other namespaces of this GPUPool
    (one another tool or person labelled is left alone). The errors, one per namespace."""
    if cluster.backend != Backend.KUBERNETES or not cluster.enabled:
        return []
    backend = backend or KubernetesBackend(cluster)
    try:
        labelled = backend._json(
            backend.api.list_namespace, label_selector=f"{ENFORCE_LABEL}=true"
        )["items"]
    except ApiException as exc:
        return [f"namespaces labelled {ENFORCE_LABEL}: {said(exc)}"]
    now = {n["metadata"]["name"]: n["metadata"] for n in labelled}
    wanted = enforcing_projects(cluster)
    errors = []
    for namespace, project in sorted(wanted.items()):
        if namespace not in now:
            errors += _set_label(backend, namespace, "true", project)
    for namespace, meta in sorted(now.items()):
        ours = all(
            (meta.get("annotations") or {}).get(k) == v for k, v in backend.owner.identity.items()
        )
        if namespace not in wanted and ours:
            errors += _set_label(backend, namespace, None)
    for error in errors:
        log.warning("%s: %s", cluster.name, error)
    return errors


def _set_label(
    backend: KubernetesBackend, namespace: str, value: str | None, project: str = ""
) -> list[str]:
    """Label (or, with None, unlabel) one namespace; the error as a list of one."""
    patch = {"metadata": {"labels": {ENFORCE_LABEL: value}}}
    try:
        if value is not None:
            backend.ensure_namespace(namespace, project)
        backend.call(backend.api.patch_namespace, namespace, patch, _preload_content=False)
    except (BackendError, ApiException) as exc:
        reason = said(exc) if isinstance(exc, ApiException) else str(exc)
        return [f"namespace {namespace}: {ENFORCE_LABEL}: {reason}"]
    log.info("%s: %s %s=%s", backend.cluster.name, namespace, ENFORCE_LABEL, value)
    return []
