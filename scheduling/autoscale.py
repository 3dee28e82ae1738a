"""Scale-up (and down) on load for elastic inference services.

A service with `scale_target` (GPU utilization, percent) in its spec wants as many
replicas as keep its GPUs' mean utilization at the target: wanted = ceil(replicas x
utilization / target), within min_replicas .. max_replicas, read from the GPU samples
the node agents post (clusters.metrics: GpuSample rows carry the workload's id) over the
last `scale_cooldown_s` seconds. A change is made at most once per cool-down, so the
replica count does not flap.

Up: `wanted_replicas` tells the engine how far the service may grow (adapters give it
that many pods); it grows with idle GPUs, as any elastic workload does. Down: the newest
replicas beyond the wanted count are taken back here, and the change is a `resized`
event on the service's timeline. Without a target a service grows to max_replicas.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from clusters.selectors import workload_gpu_utilization
from scheduling.elastic import release_pods
from scheduling.lifecycle import workload_event
from scheduling.models import ACTIVE_STATES, Workload, WorkloadKind

DEFAULT_COOLDOWN_S = 300
SCALED_AT = "scaled_at"  # spec key: epoch seconds of the last change
WANTED = "wanted_replicas"  # spec key: what the load asks for


def wanted_replicas(wl: Workload) -> int:
    """How many replicas the engine may give the service now (its pods)."""
    spec = wl.spec or {}
    if not wl.elastic or not spec.get("scale_target"):
        return wl.pods
    return max(wl.min_pods, min(wl.pods, int(spec.get(WANTED) or wl.min_pods)))


def autoscale_apply(now: datetime) -> set[int]:
    """Update every scaled service's wanted replicas from its load; take replicas back
    where the load fell. Returns the clusters whose pods were taken back."""
    clusters: set[int] = set()
    services = Workload.objects.filter(
        kind=WorkloadKind.INFERENCE, elastic=True, state__in=ACTIVE_STATES
    )
    for wl in services:
        if (wl.spec or {}).get("scale_target"):
            clusters |= _scale(wl, now)
    return clusters


def _scale(wl: Workload, now: datetime) -> set[int]:
    spec: dict[str, Any] = dict(wl.spec)
    cooldown = int(spec.get("scale_cooldown_s") or DEFAULT_COOLDOWN_S)
    last = spec.get(SCALED_AT)
    if last is not None and now.timestamp() - float(last) < cooldown:
        return set()
    running = wl.allocations.filter(releasing=False).count()
    load = workload_gpu_utilization(wl.pk, now - timedelta(seconds=cooldown))
    if load is None or running == 0:
        return set()
    wanted = math.ceil(running * load / float(spec["scale_target"]))
    wanted = max(wl.min_pods, min(wl.pods, wanted))
    if wanted == wanted_replicas(wl) and wanted >= running:
        return set()
    spec[WANTED], spec[SCALED_AT] = wanted, now.timestamp()
    wl.spec = spec
    wl.save(update_fields=["spec"])
    if wanted >= running:
        return set()
    return _take_back(wl, running, wanted, load)


def _take_back(wl: Workload, running: int, wanted: int, load: float) -> set[int]:
    active = wl.allocations.filter(releasing=False).select_related("node")
    newest = list(active.order_by("-pod_index")[: running - wanted])
    clusters = {a.node.cluster_id for a in newest}
    release_pods(newest)
    target = wl.spec["scale_target"]
    workload_event(
        wl,
        type="resized",
        reason="ScaledDown",
        message=f"From {running} to {wanted} replicas (range {wl.min_pods}..{wl.pods}): "
        f"GPU utilization {load:.0f}% is under the target of {target}%.",
    )
    return clusters
