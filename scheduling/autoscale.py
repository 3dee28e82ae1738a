"""Scale-up (and down) on load for elastic inference services.

A service scales on one or both targets in its spec:
- `scale_target`: GPU utilization, percent. It wants as many replicas as keep its GPUs'
  mean utilization at the target: ceil(replicas x utilization / target), from the GPU
  samples the node agents post (clusters.metrics: GpuSample rows carry the workload's id)
  over the last `scale_cooldown_s` seconds;
- `scale_target_requests`: requests per replica per minute. It wants ceil(requests per
  minute / target) replicas, from the requests the portal's proxy let through to its HTTP
  ports (scheduling/load.py) over the last min(cool-down, 15 minutes). The wanted count
  does not depend on how many replicas run, so it cannot chase its own tail.
With both, the larger wins (either load alone is reason enough to grow). The result is
kept within min_replicas .. max_replicas, and a change is made at most once per
cool-down, so the replica count does not flap.

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
from scheduling.load import requests_per_minute
from scheduling.models import ACTIVE_STATES, Workload, WorkloadKind

DEFAULT_COOLDOWN_S = 300
TARGETS = ("scale_target", "scale_target_requests")  # spec keys: what a service scales on
SCALED_AT = "scaled_at"  # spec key: epoch seconds of the last change
WANTED = "wanted_replicas"  # spec key: what the load asks for


def wanted_replicas(wl: Workload) -> int:
    """How many replicas the engine may give the service now (its pods)."""
    if not wl.elastic or not scales_on_load(wl):
        return wl.pods
    spec = wl.spec or {}
    return max(wl.min_pods, min(wl.pods, int(spec.get(WANTED) or wl.min_pods)))


def autoscale_apply(now: datetime) -> set[int]:
    """Update every scaled service's wanted replicas from its load; take replicas back
    where the load fell. Returns the clusters whose pods were taken back."""
    clusters: set[int] = set()
    services = Workload.objects.filter(
        kind=WorkloadKind.INFERENCE, elastic=True, state__in=ACTIVE_STATES
    )
    for wl in services:
        if scales_on_load(wl):
            clusters |= _scale(wl, now)
    return clusters


def scales_on_load(wl: Workload) -> bool:
    spec = wl.spec or {}
    return any(spec.get(key) for key in TARGETS)


def _scale(wl: Workload, now: datetime) -> set[int]:
    spec: dict[str, Any] = dict(wl.spec)
    cooldown = int(spec.get("scale_cooldown_s") or DEFAULT_COOLDOWN_S)
    last = spec.get(SCALED_AT)
    if last is not None and now.timestamp() - float(last) < cooldown:
        return set()
    running = wl.allocations.filter(releasing=False).count()
    if running == 0:
        return set()
    loads = _loads(wl, running, cooldown, now)
    if not loads:
        return set()
    wanted = max(wl.min_pods, min(wl.pods, max(w for w, _ in loads)))
    if wanted == wanted_replicas(wl) and wanted >= running:
        return set()
    spec[WANTED], spec[SCALED_AT] = wanted, now.timestamp()
    wl.spec = spec
    wl.save(update_fields=["spec"])
    if wanted >= running:
        return set()
    return _take_back(wl, running, wanted, "; ".join(why for _, why in loads))


def _loads(wl: Workload, running: int, cooldown: int, now: datetime) -> list[tuple[int, str]]:
    """Replicas each target asks for, and why in words; none without data for it."""
    spec = wl.spec
    found = []
    if spec.get("scale_target"):
        util = workload_gpu_utilization(wl.pk, now - timedelta(seconds=cooldown))
        if util is not None:
            target = spec["scale_target"]
            why = f"GPU utilization {util:.0f}% is under the target of {target}%"
            found.append((math.ceil(running * util / float(target)), why))
    if spec.get("scale_target_requests"):
        rate = requests_per_minute(wl.pk, cooldown, now.timestamp())
        target = spec["scale_target_requests"]
        why = f"{rate / running:.1f} requests per replica a minute is under the target of {target}"
        found.append((math.ceil(rate / float(target)), why))
    return found


def _take_back(wl: Workload, running: int, wanted: int, why: str) -> set[int]:
    active = wl.allocations.filter(releasing=False).select_related("node")
    newest = list(active.order_by("-pod_index")[: running - wanted])
    clusters = {a.node.cluster_id for a in newest}
    release_pods(newest)
    workload_event(
        wl,
        type="resized",
        reason="ScaledDown",
        message=f"From {running} to {wanted} replicas (range {wl.min_pods}..{wl.pods}): {why}.",
    )
    return clusters
