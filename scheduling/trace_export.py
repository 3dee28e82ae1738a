"""The product's own history as a simulator trace (docs/simulator.md, "Your own history").

One CSV row per workload submitted in a window, in the columns `scheduling/engine/sim/trace.py`
reads, plus `origin` (portal, or `kubernetes:<owner kind>` for native work), which the replay
ignores. Two streamed queries: the workloads, and their allocation intervals (the pods'
GPU-holding history), both in workload order and merged as they come.

duration_s is the time the workload held its pods until it ended (succeeded, failed or
stopped): the union of its allocation intervals. A run lost to an eviction counts when the
job resumes from a checkpoint (an upper bound on its work); a job without one restarts
from scratch, so only its last run counts. Work that has not ended has no duration (the
replay runs it to the end), and work that ended without ever running is left out: it held
nothing, and the replay cannot express "withdrawn while waiting".
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import IO, Any

from django.db.models import F, Max
from django.db.models.functions import Coalesce

from clusters.models import Gpu
from clusters.selectors import workload_pod_history
from portal.models import ProjectQuota
from scheduling.models import FINISHED_STATES, GpuRequestKind, Workload, WorkloadKind

COLUMNS = (
    "id", "submit_time", "duration_s", "team", "gpus", "pods", "min_pods", "gpu_model", "cpu",
    "memory_gib", "priority", "preemptible", "topology_level", "topology_required",
    "handles_resize", "mig_profile", "gpu_memory_mib", "origin",
)  # fmt: skip
# The only topology level the simulated nodes carry (trace.TOPOLOGY_LEVELS).
SIM_TOPOLOGY = "rack"
NEVER_RAN = -1.0  # duration_s of work that ended without running: left out
DEFAULT_GPU_MEMORY_MIB = 81920  # a memory request's share when no GPU is known at all
FIELDS = (
    "pk", "name", "project__name", "submit", "state", "gpu_request", "gpus", "gpu_memory_mib",
    "mig_profile", "cpu", "memory_mib", "pods", "min_pods", "elastic", "handles_resize",
    "gpu_model", "topology_level", "topology_required", "priority", "preemptible",
    "checkpoint_dir", "last_checkpoint_at", "restart_count", "started_at", "admitted_at",
    "finished_at", "spec",
)  # fmt: skip


@dataclass
class ExportStats:
    rows: int = 0
    left_out: int = 0  # ended without ever running
    topology_dropped: int = 0  # a level the simulator's nodes do not have
    teams: set[str] = field(default_factory=set)


def workloads_in_window(
    since: dt.datetime | None, until: dt.datetime | None, cluster: str | None
) -> Any:
    """The workloads submitted in [since, until), sweeps left out (their trials are the work)."""
    rows = Workload.objects.exclude(kind=WorkloadKind.HPO).annotate(
        submit=Coalesce(F("queued_at"), F("created_at"))
    )
    if since is not None:
        rows = rows.filter(submit__gte=since)
    if until is not None:
        rows = rows.filter(submit__lt=until)
    if cluster is not None:
        rows = rows.filter(cluster__name=cluster)
    return rows


def origin(spec: dict[str, Any] | None) -> str:
    """`portal`, or `kubernetes:<kind of the top owner>` for work made in the cluster."""
    native = (spec or {}).get("native")
    if not native:
        return "portal"
    return f"kubernetes:{(native.get('owner') or {}).get('kind') or 'Pod'}"


Held = list[tuple[dt.datetime, dt.datetime | None]]  # (started, ended) of a workload's pods


def runs(intervals: Held, end: dt.datetime) -> list[list[dt.datetime]]:
    """The intervals merged into runs (start, end): pods held together count once."""
    merged: list[list[dt.datetime]] = []
    for start, ended in sorted(intervals, key=lambda pair: pair[0]):
        stop = ended or end
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def duration_s(wl: dict[str, Any], held: Held) -> float | None:
    """Seconds of work the replay gives it; None: still going (runs to the end)."""
    if wl["state"] not in FINISHED_STATES:
        return None
    end = wl["finished_at"]
    segments = runs(held, end) if end else []
    if not segments:
        start = wl["started_at"] or wl["admitted_at"]
        if start is None or end is None:
            return NEVER_RAN
        segments = [[start, end]]
    checkpointed = bool(wl["checkpoint_dir"] or wl["last_checkpoint_at"])
    if not checkpointed:
        segments = segments[-1:]  # each restart began again from nothing
    return sum((stop - start).total_seconds() for start, stop in segments)


def _gpu_cells(wl: dict[str, Any], share: float | None, gpu_memory: int) -> dict[str, str]:
    kind = wl["gpu_request"]
    if kind == GpuRequestKind.MIG:
        profile = wl["mig_profile"] or "auto"
        memory = str(wl["gpu_memory_mib"]) if profile == "auto" else ""
        return {"gpus": "1", "mig_profile": profile, "gpu_memory_mib": memory}
    if kind == GpuRequestKind.FRACTION:
        gpus = float(wl["gpus"])
    elif kind == GpuRequestKind.MEMORY:
        # The share it held where it ran, else of the largest GPU known.
        gpus = share if share else wl["gpu_memory_mib"] / gpu_memory
        gpus = min(max(round(gpus, 3), 0.001), 1.0)
    else:
        gpus = int(wl["gpus"])
    return {"gpus": _number(gpus), "mig_profile": "", "gpu_memory_mib": ""}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def trace_row(wl: dict[str, Any], held: list, gpu_memory: int, stats: ExportStats) -> dict | None:
    """The trace row of one workload (a dict of COLUMNS), None when it is left out."""
    duration = duration_s(wl, [(s, e) for s, e, _ in held])
    if duration == NEVER_RAN:
        stats.left_out += 1
        return None
    level = wl["topology_level"]
    if level and level != SIM_TOPOLOGY:
        stats.topology_dropped += 1
        level = ""
    pods, min_pods = wl["pods"], wl["min_pods"]
    share = next((s for _, _, s in held if s), None)
    stats.teams.add(wl["project__name"])
    return {
        "id": f"{wl['project__name']}/{wl['name']}",
        "submit_time": wl["submit"].astimezone(dt.UTC).isoformat(),
        "duration_s": "" if duration is None else _number(round(duration, 3)),
        "team": wl["project__name"],
        "pods": str(pods),
        "min_pods": str(min_pods) if wl["elastic"] and min_pods < pods else "",
        "gpu_model": wl["gpu_model"],
        "cpu": _number(float(wl["cpu"])),
        "memory_gib": _number(round(wl["memory_mib"] / 1024, 3)),
        "priority": str(wl["priority"]),
        "preemptible": "yes" if wl["preemptible"] else "no",
        "topology_level": level,
        "topology_required": ("yes" if wl["topology_required"] else "no") if level else "",
        "handles_resize": "yes" if wl["handles_resize"] else "no",
        "origin": origin(wl["spec"]),
        **_gpu_cells(wl, share, gpu_memory),
    }


def _intervals(workloads: Any) -> Iterator[tuple[int, list]]:
    """(workload id, [(started, ended, share)]) in workload order, streamed."""
    rows = workload_pod_history(workloads)
    for workload_id, group in groupby(rows, key=lambda row: row[0]):
        yield workload_id, [row[1:] for row in group]


def trace_export(
    out: IO[str],
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    cluster: str | None = None,
) -> ExportStats:
    """Write the trace of the window to `out`; returns what was written and left out."""
    stats = ExportStats()
    largest = Gpu.objects.aggregate(most=Max("memory_mib"))["most"]
    gpu_memory = largest or DEFAULT_GPU_MEMORY_MIB
    workloads = workloads_in_window(since, until, cluster)
    intervals = _intervals(workloads)
    pending = next(intervals, None)
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for wl in workloads.order_by("pk").values(*FIELDS).iterator(chunk_size=2000):
        while pending is not None and pending[0] < wl["pk"]:
            pending = next(intervals, None)
        held = pending[1] if pending is not None and pending[0] == wl["pk"] else []
        row = trace_row(wl, held, gpu_memory, stats)
        if row is not None:
            writer.writerow(row)
            stats.rows += 1
    return stats


def quotas_export(teams: Iterable[str]) -> dict[str, Any]:
    """The simulator's quotas JSON for these projects: deserved GPUs, limit and over-quota
    weight per node pool, and each project's department (one query)."""
    quotas = (
        ProjectQuota.objects.filter(project__name__in=list(teams))
        .select_related("project__department", "node_pool")
        .order_by("project__name", "node_pool__name")
    )
    found: dict[str, Any] = {}
    for quota in quotas:
        entry = found.setdefault(
            quota.project.name, {"department": quota.project.department.name, "pools": {}}
        )
        limit = quota.gpus_limit if quota.over_quota_allowed else quota.gpus
        entry["pools"][quota.node_pool.name] = {
            "deserved": float(quota.gpus),
            "limit": None if limit is None else float(limit),
            "weight": float(quota.over_quota_weight),
        }
    return {"teams": found}
