"""Dynamic MIG on Kubernetes: the portal publishes each node's wanted MIG layout on its Node
object; the node's agent applies it through NVML and reports the MIG devices to the portal
(clusters/agent/kubenode.py; the format: clusters/agent/miglayout.py). docs/mig.md.

`mig_publish(backend, wanted)`, level-triggered, each reconcile pass:
1. list the nodes (one request) and read each one's `gpupool.io/mig-layout` annotation,
   unless this process published every node's wanted layout itself less than `resync_s`
   ago (a steady cluster costs no request);
2. a node whose annotation already says what is wanted keeps it (and its id); one whose
   layout changed gets the new layout under a new id (a merge patch of that annotation
   only); one another GPUPool publishes to is left alone, with an error;
3. the devices: those the node's agent reported for the id now published, else the ones
   known already (clusters.mig.mig_reported).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from clusters.agent.miglayout import ANNOTATION, LayoutInvalid, layout_decode, layout_encode
from clusters.backends import BackendUnreachable, MigKey, MigLayout
from clusters.backends.kubernetes.errors import said

if TYPE_CHECKING:
    from clusters.backends.kubernetes import KubernetesBackend


# What this process last saw published, per API server, credentials and owner (a Cluster
# record; the watch's fingerprint): {node: (gpus, destroy, id)}, and when the nodes were
# last listed. A lock: Celery may run passes in threads.
_SEEN: dict[str, tuple[float, dict[str, tuple[Any, bool, str]]]] = {}
_LOCK = threading.Lock()


def owner_name(backend: KubernetesBackend) -> str:
    return f"{backend.owner.installation}/{backend.owner.cluster}"


def mig_publish(
    backend: KubernetesBackend, wanted: MigLayout
) -> tuple[dict[MigKey, str], list[str]]:
    """Steps 1-3 of the module docstring."""
    from clusters.backends.kubernetes import _fingerprint  # noqa: PLC0415 - imports this
    from clusters.mig import mig_node_states, mig_reported  # noqa: PLC0415 - models

    by_node: dict[str, dict[int, list[tuple[str, int]]]] = {}
    for (node, index), instances in wanted.items():
        by_node.setdefault(node, {})[index] = sorted(instances, key=lambda i: i[1])
    states = mig_node_states(backend.cluster)
    destroys = {n: states[n].repartition if n in states else True for n in by_node}
    key = _fingerprint(backend)
    with _LOCK:
        listed_at, seen = _SEEN.get(key, (0.0, {}))
    fresh = time.monotonic() - listed_at < backend.resync_s
    if fresh and all(seen.get(n, (None,))[:2] == (g, destroys[n]) for n, g in by_node.items()):
        published = {n: seen[n][2] for n in by_node}
        made, reported = mig_reported(backend.cluster, published, states)
        return made, reported
    try:
        items = backend._json(backend.api.list_node)["items"]
    except ApiException as exc:
        raise BackendUnreachable(f"cannot list nodes: {said(exc)}") from exc
    nodes = {item["metadata"]["name"]: item for item in items}
    published = {}
    errors: list[str] = []
    for name, gpus in sorted(by_node.items()):
        item = nodes.get(name)
        if item is None:
            errors.append(f"node {name} is not in the cluster: its MIG layout is not published")
            continue
        layout_id, error = _publish(backend, item, gpus, destroys[name])
        if layout_id:
            published[name] = layout_id
        if error:
            errors.append(error)
    with _LOCK:
        _SEEN[key] = (
            time.monotonic() if not errors else 0.0,  # an error: look again next pass
            {n: (by_node[n], destroys[n], i) for n, i in published.items()},
        )
    made, reported = mig_reported(backend.cluster, published, states)
    return made, errors + reported


def _publish(
    backend: KubernetesBackend, item: dict[str, Any], gpus: dict, destroy: bool
) -> tuple[str, str]:
    """(the id of the layout the node now carries, an error)."""
    name = item["metadata"]["name"]
    text = (item["metadata"].get("annotations") or {}).get(ANNOTATION, "")
    owner = owner_name(backend)
    try:
        current = layout_decode(text) if text else None
    except LayoutInvalid:
        current = None  # overwritten: the portal's annotation, mangled by hand
    if current is not None and current["owner"] != owner:
        return "", (
            f"node {name}: its MIG layout is published by another GPUPool "
            f"({current['owner']}); not changed"
        )
    if current is not None and current["destroy"] == destroy and current["gpus"] == gpus:
        return current["id"], ""
    layout_id = secrets.token_hex(8)
    body = layout_encode(layout_id, owner, gpus, destroy=destroy)
    patch = {"metadata": {"annotations": {ANNOTATION: body}}}
    try:
        backend.call(backend.api.patch_node, name, patch, _preload_content=False)
    except ApiException as exc:
        return "", f"node {name}: MIG layout not published: {said(exc)}"
    return layout_id, ""
