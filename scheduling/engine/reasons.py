"""Readable reasons why a workload could not be placed in a pool.

Each check looks at one cause, coarse to fine; the first that applies is the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.engine.context import Context
from scheduling.engine.mig import mig_reason
from scheduling.engine.state import UNITS
from scheduling.engine.types import PodRequest, TopologyMode, Workload

Check = Callable[[Context, Workload, str, list[str], list[PodRequest]], str | None]


def capacity_reason(ctx: Context, wl: Workload, pool: str) -> str:
    """The first thing that blocks the workload in the pool."""
    models = ctx.state.models_for(pool, wl.gpu_models)
    pods = sorted(wl.pods, key=lambda p: -p.gpus)[: wl.gang_min]
    for check in CHECKS:
        reason = check(ctx, wl, pool, models, pods)
        if reason is not None:
            return reason
    if len(pods) > 1:
        return f"gang of {len(pods)} pods does not fit together in pool {pool}"
    return f"no node in pool {pool} has the CPU and memory the pod asks for next to free GPUs"


def _no_model(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    if models or not any(p.gpus or p.is_shared for p in pods):
        return None
    wanted = " or ".join(wl.gpu_models) or "any model"
    return f"pool {pool} has no GPU of {wanted}"


def _too_few_free(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    whole = sum(p.gpus for p in pods)
    free = ctx.state.free_whole(pool, models)
    if whole <= free:
        return None
    model_text = f" of model {' or '.join(wl.gpu_models)}" if wl.gpu_models else ""
    verb = "is" if free == 1 else "are"
    return f"needs {gpus(whole)}{model_text} in pool {pool}; {free} {verb} free"


def _no_block(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    largest = max((p.gpus for p in pods), default=0)
    block = ctx.state.largest_block(pool, models)
    if largest <= block:
        return None
    return f"needs {gpus(largest)} on one node; largest free block in pool {pool} is {block}"


def _no_domain(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    topo = wl.topology
    if topo is None or topo.mode is not TopologyMode.REQUIRED:
        return None
    best = max(
        (n for (p, lvl, _), n in ctx.state.domain_free.items() if p == pool and lvl == topo.level),
        default=0,
    )
    whole = sum(p.gpus for p in pods)
    return (
        f"needs {gpus(whole)} inside one {topo.level}; the most free in one {topo.level}"
        f" of pool {pool} is {best}"
    )


def _no_share(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    pod = next((p for p in pods if p.is_shared), None)
    if pod is None:
        return None
    best = 0
    for model in models:
        for free, bucket in ctx.state.shared.get((pool, model), {}).items():
            if bucket:
                best = max(best, free)
    asked = f"{pod.gpu_memory_mib} MiB" if pod.gpu_memory_mib else f"{pod.gpu_fraction:g}"
    return (
        f"needs {asked} of a GPU in pool {pool}; no GPU is free and the roomiest shared"
        f" GPU has {best / UNITS:g} left"
    )


def gpus(count: float) -> str:
    """'1 GPU', '2 GPUs', '0.5 GPU'."""
    return f"{count:g} GPU" if count == 1 or 0 < count < 1 else f"{count:g} GPUs"


def _no_mig(
    ctx: Context, wl: Workload, pool: str, models: list[str], pods: list[PodRequest]
) -> str | None:
    pod = next((p for p in pods if p.mig_profile), None)
    if pod is None:
        return None
    return mig_reason(ctx.state.mig, pod, pool, wl.gpu_models)


CHECKS: tuple[Check, ...] = (_no_mig, _no_model, _too_few_free, _no_block, _no_domain, _no_share)
