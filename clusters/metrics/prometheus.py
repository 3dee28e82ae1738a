"""Prometheus exposition at /metrics, for scraping with a bearer token.

Quota, allocation and pending demand per project and node pool; GPUs per pool; each GPU's
recent utilisation; the last scheduling cycle's duration. Text format 0.0.4, by hand:
a handful of gauges needs no client library.
"""

from __future__ import annotations

import hmac
from collections import defaultdict
from collections.abc import Iterable

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from clusters.metrics.selectors import (
    PENDING_FIELDS,
    allocation_gpus,
    latest_utilisation,
    pending_gpu_counter,
)
from clusters.models import Gpu, Node
from portal.models import DepartmentQuota, ProjectQuota
from scheduling.models import CycleRun, CycleState, PodAllocation, Workload, WorkloadState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gauge(name: str, help_text: str, samples: Iterable[tuple[dict, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {float(value):g}" if text else f"{name} {float(value):g}")
    return lines


def _quota_lines() -> list[str]:
    projects = ProjectQuota.objects.values_list(
        "project__name", "project__department__name", "node_pool__name", "gpus"
    )
    departments = DepartmentQuota.objects.values_list("department__name", "node_pool__name", "gpus")
    return [
        *_gauge("gpupool_project_quota_gpus", "Deserved GPUs of a project in a node pool.",
                (({"project": p, "department": d, "pool": pool}, g) for p, d, pool, g in projects)),
        *_gauge("gpupool_department_quota_gpus", "Deserved GPUs of a department in a node pool.",
                (({"department": d, "pool": pool}, g) for d, pool, g in departments)),
    ]  # fmt: skip


def _allocation_lines() -> list[str]:
    memory = {(n, i): m for n, i, m in Gpu.objects.values_list("node_id", "index", "memory_mib")}
    held: dict[tuple[str, str], float] = defaultdict(float)
    for a in PodAllocation.objects.select_related("workload__project", "node__pool"):
        pool = a.node.pool.name if a.node.pool else ""
        held[(a.workload.project.name, pool)] += allocation_gpus(a, memory)
    totals = Gpu.objects.values("node__cluster__name", "node__pool__name").annotate(n=Count("id"))
    return [
        *_gauge("gpupool_project_allocated_gpus", "GPUs held by a project's pods now.",
                (({"project": p, "pool": pool}, g) for (p, pool), g in sorted(held.items()))),
        *_gauge("gpupool_gpus", "GPUs in a node pool.",
                (({"cluster": t["node__cluster__name"], "pool": t["node__pool__name"] or ""},
                  t["n"]) for t in totals)),
    ]  # fmt: skip


def _pending_lines() -> list[str]:
    counts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    pending = Workload.objects.filter(state=WorkloadState.PENDING).values(
        "project__name", *PENDING_FIELDS
    )
    count_gpus = pending_gpu_counter()
    for w in pending:
        counts[w["project__name"]][0] += 1
        counts[w["project__name"]][1] += count_gpus(w)
    return [
        *_gauge("gpupool_pending_workloads", "Workloads waiting for GPUs.",
                (({"project": p}, c[0]) for p, c in sorted(counts.items()))),
        *_gauge("gpupool_pending_gpus", "GPUs asked for by pending workloads.",
                (({"project": p}, c[1]) for p, c in sorted(counts.items()))),
    ]  # fmt: skip


def _utilisation_lines() -> list[str]:
    names = dict(Node.objects.values_list("id", "name"))
    util = latest_utilisation(timezone.now())
    samples = (
        ({"node": names.get(node, str(node)), "gpu": gpu}, round(u, 4))
        for (node, gpu), u in sorted(util.items())
    )
    return _gauge(
        "gpupool_gpu_utilization_ratio", "GPU utilisation over the last 2 minutes.", samples
    )


def _cycle_lines() -> list[str]:
    # A cycle still running has no result yet: report the last one that ended.
    last = CycleRun.objects.exclude(state=CycleState.RUNNING).order_by("-started_at", "-id").first()
    if last is None:
        return []
    return [
        *_gauge("gpupool_cycle_duration_seconds", "Duration of the last scheduling cycle.",
                [({}, last.duration_ms / 1000)]),
        *_gauge("gpupool_cycle_last_run_timestamp_seconds", "When the last cycle started.",
                [({}, last.started_at.timestamp())]),
        *_gauge("gpupool_cycle_last_ok", "1 if the last cycle succeeded.", [({}, int(last.ok))]),
    ]  # fmt: skip


def _authorised(request: HttpRequest) -> bool:
    expected = settings.GPUPOOL_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else ""
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def exposition(request: HttpRequest) -> HttpResponse:
    if not settings.GPUPOOL_METRICS_TOKEN:
        return HttpResponse("Set GPUPOOL_METRICS_TOKEN to enable /metrics.\n", status=404)
    if not _authorised(request):
        response = HttpResponse("A valid bearer token is required.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="gpupool-metrics"'
        return response
    lines = [
        *_quota_lines(), *_allocation_lines(), *_pending_lines(),
        *_utilisation_lines(), *_cycle_lines(),
    ]  # fmt: skip
    return HttpResponse("\n".join(lines) + "\n", content_type=CONTENT_TYPE)
