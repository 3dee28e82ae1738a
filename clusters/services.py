"""Writes of the clusters app: registering and changing clusters, testing connections.

Each admin change writes an audit row in its transaction; kubeconfigs are encrypted before
they touch the database and never appear in the audit log or on a page.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from django.db import transaction

from clusters.backends import PUBLISH_INGRESS, PUBLISH_MODES, BackendError, get_backend
from clusters.backends.simulated import description_parse
from clusters.crypto import KubeconfigKeyMissing, kubeconfig_encrypt
from clusters.inventory import SyncResult, inventory_sync
from clusters.models import Backend, Cluster
from clusters.reconcile import cluster_mark_contacted, cluster_mark_unreachable
from clusters.stored import config_of, texts_of
from clusters.tasks import sync_inventory
from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed
from portal.models import k8s_name_validator

log = logging.getLogger(__name__)
AUDITED = ["name", "backend", "node_pool_label", "topology_labels", "config",
           "data_volume_roots", "enabled"]  # fmt: skip
MAX_DATA_VOLUME_ROOTS = 20
# A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of at most
# 63 characters (alphanumerics, with "-", "_" and "." inside).
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_key_error(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not LABEL_PREFIX.fullmatch(prefix)):
        return f"{key!r} is not a label key: the part before / must be a DNS name."
    if not LABEL_NAME.fullmatch(name):
        return (
            f"{key!r} is not a label key: at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit (after an optional prefix/)."
        )
    return None


def _check_labels(node_pool_label: str, topology_labels: list[str]) -> None:
    errors = {}
    if node_pool_label and (error := label_key_error(node_pool_label)):
        errors["node_pool_label"] = [error]
    if wrong := [e for key in topology_labels if (e := label_key_error(key))]:
        errors["topology_labels"] = wrong
    if errors:
        raise ValidationFailed(errors)


def _kubeconfig_token(text: str) -> str:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationFailed({"kubeconfig": [f"Not valid YAML: {exc}"]}) from None
    if not isinstance(data, dict) or not data.get("clusters") or not data.get("contexts"):
        raise ValidationFailed(
            {"kubeconfig": ["Not a kubeconfig: it needs clusters and contexts."]}
        )
    try:
        return kubeconfig_encrypt(text)
    except KubeconfigKeyMissing as exc:
        raise ValidationFailed({"kubeconfig": [str(exc)]}) from None


def kubeconfig_api_server(data: dict) -> str:
    """The API server the kubeconfig's current context points at, normalized (scheme and
    host lower-case, the default port written out, no trailing slash)."""
    contexts = {c.get("name"): c.get("context") or {} for c in data.get("contexts") or []}
    context = contexts.get(data.get("current-context")) or next(iter(contexts.values()), {})
    clusters = {c.get("name"): c.get("cluster") or {} for c in data.get("clusters") or []}
    server = str((clusters.get(context.get("cluster")) or {}).get("server") or "")
    try:
        url = urlsplit(server.strip())
        port = url.port or {"https": 443, "http": 80}.get(url.scheme.lower())
    except ValueError:
        raise ValidationFailed({"kubeconfig": [f"Not a URL: {server!r}."]}) from None
    if not url.hostname:
        raise ValidationFailed({"kubeconfig": ["The kubeconfig names no API server."]})
    return f"{url.scheme.lower()}://{url.hostname.lower()}:{port}{url.path.rstrip('/')}"


def _kubernetes_identity(name: str, text: str) -> dict[str, str]:
    """Where the kubeconfig points, and the cluster's kube-system namespace uid when the
    cluster answers now (briefly: an unreachable cluster may still be registered)."""
    from clusters.backends.kubernetes import KubernetesBackend  # noqa: PLC0415 - heavy

    data = yaml.safe_load(text)
    identity = {"api_server": kubeconfig_api_server(data), "kube_system_uid": ""}
    probe = Cluster(
        name=name,
        backend=Backend.KUBERNETES,
        config={"retries": 1, "connect_timeout_s": 2, "timeout_s": 5},
    )
    try:
        identity["kube_system_uid"] = KubernetesBackend(probe, kubeconfig=data).kube_system_uid()
    except Exception as exc:  # the client fails on an unreachable cluster in many ways
        log.info("%s: kube-system not read at registration: %s", name, exc)
    return identity


def _check_registered_once(identity: dict[str, str], cluster: Cluster | None) -> None:
    """One Cluster record per cluster: a second would offer its GPUs twice."""
    others = Cluster.objects.exclude(pk=getattr(cluster, "pk", None))
    for field, words in (
        ("api_server", "the same API server"),
        ("kube_system_uid", "the same kube-system namespace"),
    ):
        value = identity[field]
        same = others.filter(**{field: value}).first() if value else None
        if same is not None:
            message = f"This cluster is registered already as {same.name} ({words}: {value})."
            raise ValidationFailed({"kubeconfig": [message]})


def _config_for(backend: str, description: str, current: dict[str, Any]) -> dict[str, Any]:
    if backend == Backend.SIMULATED:
        if not description.strip() and current:
            return current
        return description_parse(description)
    if description.strip():
        raise ValidationFailed({"description": ["Only simulated clusters take a description."]})
    return current


DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")
PUBLISH_KEYS = ("publish_ports", "ingress_class", "ingress_domain")


def _publishing(
    backend: str, publish_ports: str, ingress_class: str, ingress_domain: str
) -> dict[str, str]:
    """How workloads' ports are published beyond the cluster (the backend's config keys):
    Kubernetes only; an Ingress needs its class and the domain its hosts end in."""
    mode = publish_ports or ""
    if mode not in PUBLISH_MODES:
        raise ValidationFailed({"publish_ports": [f"Use one of: {', '.join(PUBLISH_MODES[1:])}."]})
    if mode and backend != Backend.KUBERNETES:
        raise ValidationFailed({"publish_ports": ["Only Kubernetes clusters publish ports."]})
    errors: dict[str, list[str]] = {}
    if mode == PUBLISH_INGRESS:
        for field, value in (("ingress_class", ingress_class), ("ingress_domain", ingress_domain)):
            if not value or len(value) > 253 or not DNS_NAME.fullmatch(value):
                errors[field] = ["Give a DNS name: lower-case letters, digits, '-' and '.'."]
    if errors:
        raise ValidationFailed(errors)
    if mode != PUBLISH_INGRESS:
        ingress_class = ingress_domain = ""
    return {"publish_ports": mode, "ingress_class": ingress_class, "ingress_domain": ingress_domain}


def _with_publishing(config: dict[str, Any], publishing: dict[str, str]) -> dict[str, Any]:
    kept = {k: v for k, v in config.items() if k not in PUBLISH_KEYS}
    return {**kept, **{k: v for k, v in publishing.items() if v}}


def _data_volume_roots(backend: str, roots: list[str]) -> list[str]:
    """Existing absolute directories, resolved (no link or '..' leads elsewhere later), and
    never the whole machine: a workload's data volume must lie under one of them."""
    if roots and backend != Backend.LOCAL:
        raise ValidationFailed({"data_volume_roots": ["Only local clusters take data roots."]})
    if len(roots) > MAX_DATA_VOLUME_ROOTS:
        raise ValidationFailed(
            {"data_volume_roots": [f"At most {MAX_DATA_VOLUME_ROOTS} directories."]}
        )
    resolved = []
    for root in roots:
        path = Path(os.path.realpath(root)) if root.startswith("/") else None
        if path is None or not path.is_dir() or path == Path("/"):
            raise ValidationFailed(
                {"data_volume_roots": [f"{root[:200]} is not an absolute directory (not /)."]}
            )
        resolved.append(str(path))
    return list(dict.fromkeys(resolved))


def _check_name(name: str, cluster: Cluster | None) -> None:
    try:
        k8s_name_validator(name)
    except Exception as exc:  # Django's ValidationError: its messages are for people
        raise ValidationFailed({"name": list(getattr(exc, "messages", [str(exc)]))}) from None
    taken = Cluster.objects.filter(name=name).exclude(pk=getattr(cluster, "pk", None)).exists()
    if taken:
        raise ValidationFailed({"name": [f"A cluster named {name} exists already."]})


def cluster_register(
    *,
    actor: Any,
    name: str,
    backend: str,
    kubeconfig: str = "",
    node_pool_label: str = "gpupool.io/node-pool",
    topology_labels: list[str] | None = None,
    description: str = "",
    data_volume_roots: list[str] | None = None,
    publish_ports: str = "",
    ingress_class: str = "",
    ingress_domain: str = "",
) -> Cluster:
    """Register a cluster and sync its inventory once the row is committed."""
    _check_name(name, None)
    _check_labels(node_pool_label, list(topology_labels or []))
    if backend not in Backend.values:
        raise ValidationFailed({"backend": [f"Unknown backend {backend!r}."]})
    local = Cluster.objects.filter(backend=Backend.LOCAL).first()
    if backend == Backend.LOCAL and local is not None:
        # Two local clusters would offer the same machine's GPUs twice.
        raise ValidationFailed({"backend": [f"This machine is registered already: {local}."]})
    token, identity = "", {}
    if backend == Backend.KUBERNETES:
        if not kubeconfig.strip():
            raise ValidationFailed({"kubeconfig": ["A Kubernetes cluster needs a kubeconfig."]})
        token = _kubeconfig_token(kubeconfig)
        identity = _kubernetes_identity(name, kubeconfig)
        _check_registered_once(identity, None)
    publishing = _publishing(backend, publish_ports, ingress_class, ingress_domain)
    config = _with_publishing(_config_for(backend, description, {}), publishing)
    roots = _data_volume_roots(backend, list(data_volume_roots or []))
    with transaction.atomic():
        cluster = Cluster.objects.create(
            name=name,
            backend=backend,
            kubeconfig_encrypted=token,
            **identity,
            node_pool_label=node_pool_label or "gpupool.io/node-pool",
            topology_labels=list(topology_labels or []),
            config=config,
            data_volume_roots=roots,
        )
        audit_log(
            actor=actor, action="cluster.register", obj=cluster, after=snapshot(cluster, AUDITED)
        )
        transaction.on_commit(lambda: _sync_soon(cluster.pk))
    return cluster


def cluster_update(
    *,
    actor: Any,
    cluster: Cluster,
    name: str,
    kubeconfig: str = "",
    node_pool_label: str,
    topology_labels: list[str],
    description: str = "",
    data_volume_roots: list[str] | None = None,
    enabled: bool = True,
    publish_ports: str = "",
    ingress_class: str = "",
    ingress_domain: str = "",
) -> Cluster:
    """Change a cluster; an empty kubeconfig or description keeps the stored one."""
    _check_name(name, cluster)
    _check_labels(node_pool_label, topology_labels)
    publishing = _publishing(cluster.backend, publish_ports, ingress_class, ingress_domain)
    before = snapshot(cluster, AUDITED)
    changes: dict[str, Any] = {
        "name": name,
        "node_pool_label": node_pool_label or "gpupool.io/node-pool",
        "topology_labels": list(topology_labels),
        "config": _with_publishing(
            _config_for(cluster.backend, description, config_of(cluster)), publishing
        ),
        "data_volume_roots": texts_of(cluster.data_volume_roots)
        if data_volume_roots is None
        else _data_volume_roots(cluster.backend, data_volume_roots),
        "enabled": enabled,
    }
    if cluster.backend == Backend.KUBERNETES and kubeconfig.strip():
        changes["kubeconfig_encrypted"] = _kubeconfig_token(kubeconfig)
        identity = _kubernetes_identity(name, kubeconfig)
        _check_registered_once(identity, cluster)
        changes.update(identity)
    with transaction.atomic():
        for field, value in changes.items():
            setattr(cluster, field, value)
        cluster.save()
        after = snapshot(cluster, AUDITED)
        if "kubeconfig_encrypted" in changes:
            after["kubeconfig"] = "replaced"  # that it changed, never what it is
        audit_log(actor=actor, action="cluster.update", obj=cluster, before=before, after=after)
        transaction.on_commit(lambda: _sync_soon(cluster.pk))
    return cluster


def cluster_test_connection(*, actor: Any, cluster: Cluster) -> tuple[bool, str]:
    """Ask the cluster for its version and nodes; records the outcome as the cluster's health."""
    try:
        message = get_backend(cluster).test_connection()
    except (BackendError, KubeconfigKeyMissing) as exc:
        cluster_mark_unreachable(cluster, str(exc))
        return False, str(exc)
    except Exception as exc:  # a broken kubeconfig fails inside the client in many ways
        cluster_mark_unreachable(cluster, f"{type(exc).__name__}: {exc}")
        return False, f"{type(exc).__name__}: {exc}"
    cluster_mark_contacted(cluster)
    return True, message


def cluster_sync_inventory(*, actor: Any, cluster: Cluster) -> SyncResult:
    """Sync now, on an admin's request (raises BackendUnreachable); audited with its counts."""
    result = inventory_sync(cluster)
    with transaction.atomic():
        counts = {"nodes": result.nodes, "gpus": result.gpus, "vanished": result.vanished}
        audit_log(actor=actor, action="cluster.sync_inventory", obj=cluster, after=counts)
    return result


def _sync_soon(cluster_id: int) -> None:
    sync_inventory.delay(cluster_id)
