"""Dashboard pages: the overview (with live fragments) and the nodes heat map."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from clusters.metrics import charts, conf, heatmap, selectors
from portal.permissions import visible_projects
from scheduling.bounds import query_id

TOTALS = ("total", "allocated", "used", "used_unallocated")  # PoolNow fields the cards add up


def _pool_ids(request: HttpRequest) -> list[int]:
    return [pk for pk in map(query_id, request.GET.getlist("pool")) if pk is not None]


def _overview_figure(request: HttpRequest) -> dict[str, Any]:
    range_name = selectors.range_key(request.GET.get("range"))
    _, rows = selectors.pool_series(range_name, timezone.now(), _pool_ids(request))
    return charts.pool_figure(rows, f"Allocation and utilisation, last {range_name}")


def _now_context(request: HttpRequest) -> dict[str, Any]:
    projects = visible_projects(request.user)
    pool_ids = _pool_ids(request)
    pools = selectors.gpus_now()
    if pool_ids:
        pools = [p for p in pools if p.pool_id in pool_ids]
    return {
        "pools": pools,
        "totals": {name: sum(getattr(p, name) for p in pools) for name in TOTALS},
        "idle": selectors.idle_workloads(projects, pool_ids=pool_ids)[:20],
        "pending": selectors.pending_demand(projects, pool_ids),
        "updated_at": timezone.now(),
        "idle_minutes": conf.get("GPUPOOL_METRICS_IDLE_MINUTES"),
    }


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    context = _now_context(request)
    context.update(
        figure=_overview_figure(request),
        range=selectors.range_key(request.GET.get("range")),
        ranges=list(selectors.RANGES),
        pool_choices=selectors.pool_choices(),
        selected_pools=_pool_ids(request),
        query=request.GET.urlencode(),
    )
    return render(request, "metrics/dashboard.html", context)


@login_required
def dashboard_now(request: HttpRequest) -> HttpResponse:
    """The live part of the overview, polled every few seconds by static/js/dashboard.js."""
    return render(request, "metrics/_now.html", _now_context(request))


@login_required
def dashboard_chart(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_overview_figure(request))


@login_required
def nodes_heatmap(request: HttpRequest) -> HttpResponse:
    range_name = heatmap.range_key(request.GET.get("range"))
    figure = heatmap.figure(range_name, timezone.now(), _pool_ids(request))
    context = {
        "figure": figure,
        "range": range_name,
        "ranges": list(heatmap.RANGES),
        "pool_choices": selectors.pool_choices(),
        "selected_pools": _pool_ids(request),
    }
    return render(request, "metrics/heatmap.html", context)
