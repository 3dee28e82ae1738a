"""Chart partials other pages include with one line:

    {% load metrics_charts %}{% project_usage_chart project %}
    {% load metrics_charts %}{% department_usage_chart department %}
    {% load metrics_charts %}{% workload_gpu_chart workload %}

Each checks that the viewer may see the object, builds its figure on the server, and
renders it with a range selector (?chart_range=24h|7d|30d, ?chart_pool=<id>).
"""

from __future__ import annotations

import itertools
from typing import Any

from django import template
from django.utils import timezone

from clusters.metrics import charts, quota_history, selectors
from clusters.metrics.models import QuotaRecord
from clusters.metrics.workload_chart import current_processes, workload_series
from portal.models import Department, Project
from portal.permissions import can_view_department, can_view_project

register = template.Library()
_ids = itertools.count(1)


def _options(context: Any) -> tuple[str, int | None]:
    request = context.get("request")
    get = request.GET if request else {}
    pool = get.get("chart_pool", "")
    return selectors.range_key(get.get("chart_range")), int(pool) if pool.isdigit() else None


def _usage_chart(context: Any, title: str, kind: str, owner_id: int) -> dict[str, Any]:
    range_name, pool = _options(context)
    filters = {f"{kind}_id": owner_id} | ({"pool_id": pool} if pool else {})
    now = timezone.now()
    _, rows = selectors.usage_series(range_name, now, **filters)
    start = now - selectors.RANGES[range_name][0]
    deserved = quota_history.deserved_steps(kind, owner_id, start, now, pool_id=pool)
    return {
        "allowed": True,
        "figure": charts.usage_figure(rows, deserved, f"{title}, last {range_name}"),
        "figure_id": f"usage-chart-{next(_ids)}",
        "ranges": list(selectors.RANGES),
        "range": range_name,
        "pool": pool,
        "pool_choices": selectors.pool_choices(),
    }


@register.inclusion_tag("metrics/_usage_chart.html", takes_context=True)
def project_usage_chart(context: Any, project: Project) -> dict[str, Any]:
    if not can_view_project(context["request"].user, project):
        return {"allowed": False}
    title = f"{project.name}: allocated, deserved and used GPUs"
    return _usage_chart(context, title, QuotaRecord.PROJECT, project.pk)


@register.inclusion_tag("metrics/_usage_chart.html", takes_context=True)
def department_usage_chart(context: Any, department: Department) -> dict[str, Any]:
    if not can_view_department(context["request"].user, department):
        return {"allowed": False}
    title = f"{department.name}: allocated, deserved and used GPUs"
    return _usage_chart(context, title, QuotaRecord.DEPARTMENT, department.pk)


@register.inclusion_tag("metrics/_workload_chart.html", takes_context=True)
def workload_gpu_chart(context: Any, workload: Any) -> dict[str, Any]:
    if not can_view_project(context["request"].user, workload.project):
        return {"allowed": False}
    series = workload_series(workload)
    return {
        "allowed": True,
        "has_data": any(series.values()),
        "figure": charts.workload_figure(series, f"{workload.name}: GPU utilisation and memory"),
        "figure_id": f"workload-chart-{next(_ids)}",
        "processes": current_processes(workload),
    }
