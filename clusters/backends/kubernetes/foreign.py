"""What pods GPUPool did not bind hold on each node: the default scheduler's, another
GPUPool installation's (or another Cluster record's), DaemonSets', an admin's debugging pod.

A pod is GPUPool's own when it carries this owner's identity labels or its
`gpupool.io/bound-by` annotation (ownership.Owner.holds); every other pod bound to a node
(`spec.nodeName` set) that has not finished holds its requests there, also while it
terminates (a pod with a deletionTimestamp holds them until it is gone). Requests are
summed as the Kubernetes scheduler sums them (resource.PodRequests):
max(sum of containers + restartable init containers (sidecars), each init container on top
of the sidecars started before it) + the pod's overhead; `nvidia.com/gpu` is an extended
resource, whose request equals its limit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from clusters.backends import ForeignUse
from clusters.backends.kubernetes.manifests import GPU_RESOURCE
from clusters.backends.kubernetes.ownership import Owner

log = logging.getLogger(__name__)

# The list each inventory sync makes: pods bound to a node that have not finished.
FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
FINISHED = ("Succeeded", "Failed")
RESOURCES = ("cpu", "memory", GPU_RESOURCE)
NAMED = 5  # pods named per node on the nodes page
# Bounds on what one pod may add (a planted quantity must not overflow a column): a node
# never holds more than this, so neither does one pod.
BOUND = {"cpu": Decimal(10**5), "memory": Decimal(2**60), GPU_RESOURCE: Decimal(10**4)}

Amounts = dict[str, Decimal]


def foreign_use(pods: Iterable[Mapping[str, Any]], owner: Owner) -> dict[str, ForeignUse]:
    """By node name: what the bound, unfinished pods that are not `owner`'s hold there."""
    held: dict[str, list[tuple[str, Amounts]]] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = spec.get("nodeName")
        # The list's field selector says the same; filtered here too, for servers (and the
        # in-suite one) that do not apply it.
        if not node or (pod.get("status") or {}).get("phase") in FINISHED or owner.holds(meta):
            continue
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        amounts = pod_requests(spec, name)
        if any(amounts.values()):  # a pod that asks for nothing holds nothing
            held.setdefault(node, []).append((name, amounts))
    return {node: _summed(found) for node, found in held.items()}


def _summed(found: list[tuple[str, Amounts]]) -> ForeignUse:
    gpus = sum((a[GPU_RESOURCE] for _, a in found), Decimal(0))
    cpu = sum((a["cpu"] for _, a in found), Decimal(0))
    memory = sum((a["memory"] for _, a in found), Decimal(0))
    largest = sorted(
        found, key=lambda f: (-f[1][GPU_RESOURCE], -f[1]["cpu"], -f[1]["memory"], f[0])
    )
    return ForeignUse(
        gpus=math.ceil(gpus),
        cpu=float(cpu),
        memory_mib=math.ceil(memory / 2**20),
        pod_count=len(found),
        pods=tuple(name[:253] for name, _ in largest[:NAMED]),
    )


def pod_requests(spec: Mapping[str, Any], name: str = "") -> Amounts:
    """cpu (cores), memory (bytes) and GPUs the scheduler counts for a pod spec."""
    sidecars = _zero()
    init_peak = _zero()
    for container in spec.get("initContainers") or []:
        own = _container(container, name)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside the others
            sidecars = _plus(sidecars, own)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _plus(sidecars, own))
    running = sidecars
    for container in spec.get("containers") or []:
        running = _plus(running, _container(container, name))
    overhead = _amounts(spec.get("overhead") or {}, name)
    return _plus(_max(running, init_peak), overhead)


def _container(container: Mapping[str, Any], name: str) -> Amounts:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})  # a request left out defaults to its limit
    requests.update(resources.get("requests") or {})
    limits = resources.get("limits") or {}
    if GPU_RESOURCE in limits:  # extended resources: the limit is the request
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE]
    return _amounts(requests, name)


def _amounts(quantities: Mapping[str, Any], name: str) -> Amounts:
    """The quantities of RESOURCES, parsed; one the API server would not have taken counts
    as nothing (and is logged), never stops the sync."""
    amounts = _zero()
    for resource in RESOURCES:
        if resource not in quantities:
            continue
        try:
            value = parse_quantity(quantities[resource])
            if not value.is_finite():
                raise ValueError(value)
        except (ValueError, TypeError, InvalidOperation):
            log.warning("pod %s: %s=%r is not a quantity", name, resource, quantities[resource])
            continue
        amounts[resource] = min(max(value, Decimal(0)), BOUND[resource])
    return amounts


def _zero() -> Amounts:
    return dict.fromkeys(RESOURCES, Decimal(0))


def _plus(a: Amounts, b: Amounts) -> Amounts:
    return {r: a[r] + b[r] for r in RESOURCES}


def _max(a: Amounts, b: Amounts) -> Amounts:
    return {r: max(a[r], b[r]) for r in RESOURCES}
