"""Usage report pages (HTML and CSV), GPU prices, and node agent tokens."""

from __future__ import annotations

import csv
import datetime as dt
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from clusters.metrics import charts, conf, reports, services
from clusters.metrics.forms import GROUP_LABELS, GpuPriceForm, UsageReportForm
from clusters.metrics.models import GpuPrice, NodeToken
from clusters.models import Gpu, Node
from portal.permissions import is_platform_admin, platform_admin_required, visible_projects
from portal.views.common import form_saved


def _report(request: HttpRequest) -> dict[str, Any]:
    """The report the form asks for; with a bad field, only the form and its errors (no
    figures for a period or grouping the user did not ask for)."""
    form = UsageReportForm(request.GET or None)
    context: dict[str, Any] = {
        "form": form,
        "scope_all": is_platform_admin(request.user),
        "idle_minutes": conf.get("GPUPOOL_METRICS_IDLE_MINUTES"),
    }
    if form.is_bound and not form.is_valid():
        return {**context, "invalid": True}
    data = form.cleaned_data if form.is_bound else {}
    preset, group = data.get("period", "this_month"), data.get("group", "project")
    start, end = reports.period_for(preset, timezone.now(), data.get("start"), data.get("end"))
    cluster = data.get("cluster")
    rows = reports.usage_report(
        visible_projects(request.user), start, end, group, cluster.pk if cluster else None
    )
    return {
        **context,
        "invalid": False,
        "rows": rows,
        "total": reports.report_total(rows),
        "start": start,
        "end": end,
        "group": group,
        "group_label": GROUP_LABELS[group],
        "cluster": cluster,
        "currency": GpuPrice.objects.values_list("currency", flat=True).first() or "USD",
    }


@login_required
def usage_report(request: HttpRequest) -> HttpResponse:
    context = _report(request)
    if not context["invalid"]:
        title = f"GPU-hours by {context['group_label'].lower()}"
        context["figure"] = charts.report_figure([vars(r) for r in context["rows"][:30]], title)
        context["query"] = request.GET.urlencode()
    return render(request, "metrics/usage_report.html", context, status=200)


def _cell(text: str) -> str:
    """A name as a CSV cell that spreadsheets show as text, never run as a formula."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@login_required
def usage_report_csv(request: HttpRequest) -> HttpResponse:
    context = _report(request)
    if context["invalid"]:
        # Never hand over this month's figures under a period the user did not ask for.
        errors = [f"{field}: {' '.join(msgs)}" for field, msgs in context["form"].errors.items()]
        return HttpResponse(
            "The report's period is not valid:\n" + "\n".join(errors) + "\n",
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    # Named by the first and the last day in the period (its end is exclusive).
    last_day = context["end"] - dt.timedelta(microseconds=1)
    name = f"gpu-usage-{context['start']:%Y%m%d}-{last_day:%Y%m%d}-{context['group']}"
    if context["cluster"]:
        name += f"-{context['cluster'].name}"
    name += ".csv"
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow([
        context["group"], "allocated_gpu_hours", "used_gpu_hours", "utilization_pct",
        "idle_gpu_hours", "over_quota_gpu_hours", "cost", "currency", "unpriced_gpu_hours",
    ])  # fmt: skip
    for row in [*context["rows"], context["total"]]:
        util = row.utilisation_pct
        writer.writerow([
            _cell(row.name), f"{row.allocated_h:.4f}", f"{row.used_h:.4f}",
            "" if util is None else f"{util:.2f}", f"{row.idle_h:.4f}",
            f"{row.over_quota_h:.4f}", f"{row.cost:.2f}", context["currency"],
            f"{row.unpriced_h:.4f}",
        ])  # fmt: skip
    return response


@platform_admin_required
@require_http_methods(["GET", "POST"])
def gpu_prices(request: HttpRequest) -> HttpResponse:
    form = GpuPriceForm(request.POST or None)
    if request.method == "POST" and "delete" in request.POST:
        price = get_object_or_404(GpuPrice, pk=request.POST["delete"])
        services.gpu_price_delete(actor=request.user, price=price)
        messages.success(request, f"Removed the price of {price.gpu_model}.")
        return redirect("gpu_prices")
    done = form_saved(
        request,
        form,
        lambda: services.gpu_price_set(actor=request.user, **form.cleaned_data),
        message=lambda _: f"Saved the price of {form.cleaned_data['gpu_model']}.",
        then=lambda _: redirect("gpu_prices"),
    )
    if done:
        return done
    models = sorted(set(Gpu.objects.exclude(model="").values_list("model", flat=True)))
    context = {"form": form, "prices": GpuPrice.objects.all(), "gpu_models": models}
    return render(request, "metrics/gpu_prices.html", context)


@platform_admin_required
@require_http_methods(["GET", "POST"])
def node_tokens(request: HttpRequest) -> HttpResponse:
    """Issue and revoke node agent tokens; a new token is shown once, on this response."""
    issued = None
    if request.method == "POST" and request.POST.get("issue"):
        node = get_object_or_404(Node, pk=request.POST["issue"])
        token, plain = services.node_token_issue(actor=request.user, node=node)
        issued = {"node": node, "token": plain}
    elif request.method == "POST" and request.POST.get("revoke"):
        token = get_object_or_404(NodeToken, pk=request.POST["revoke"], revoked_at__isnull=True)
        services.node_token_revoke(actor=request.user, token=token)
        messages.success(request, f"Revoked token {token.prefix}….")
        return redirect("node_tokens")
    tokens: dict[int, list[NodeToken]] = {}
    for token in NodeToken.objects.filter(revoked_at__isnull=True):
        tokens.setdefault(token.node_id, []).append(token)
    nodes = [(n, tokens.get(n.pk, [])) for n in Node.objects.select_related("cluster")]
    return render(request, "metrics/node_tokens.html", {"nodes": nodes, "issued": issued})
