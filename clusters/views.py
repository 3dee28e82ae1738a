"""Cluster pages: the clusters and their health, registration, and the nodes with their GPUs."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters import selectors, services
from clusters.backends import BackendUnreachable
from clusters.forms import ClusterForm
from clusters.models import Backend, Cluster, NodePool
from clusters.reconcile import cluster_mark_unreachable
from clusters.stored import config_of, texts_of
from portal.errors import ValidationFailed
from portal.forms import show_errors
from portal.permissions import platform_admin_required
from scheduling.bounds import query_id


@platform_admin_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    return render(request, "clusters/cluster_list.html", {"clusters": selectors.cluster_list()})


@platform_admin_required
def cluster_new(request: HttpRequest) -> HttpResponse:
    form = ClusterForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            cluster = services.cluster_register(actor=request.user, **form.service_fields())
        except ValidationFailed as exc:
            show_errors(form, exc)
        else:
            messages.success(request, f"Cluster {cluster.name} registered; its nodes sync now.")
            return redirect("cluster_list")
    return render(request, "clusters/cluster_form.html", {"form": form, "cluster": None})


@platform_admin_required
def cluster_edit(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=pk)
    initial = {
        "name": cluster.name,
        "backend": cluster.backend,
        "node_pool_label": cluster.node_pool_label,
        "topology_labels": ", ".join(texts_of(cluster.topology_labels)),
        "description": _description_text(cluster),
        "data_volume_roots": "\n".join(texts_of(cluster.data_volume_roots)),
        "enabled": cluster.enabled,
        **{key: config_of(cluster).get(key, "") for key in services.PUBLISH_KEYS},
    }
    form = ClusterForm(request.POST or None, request.FILES or None, initial=initial, editing=True)
    if request.method == "POST" and form.is_valid():
        fields = form.service_fields()
        fields.pop("backend", None)
        try:
            services.cluster_update(actor=request.user, cluster=cluster, **fields)
        except ValidationFailed as exc:
            show_errors(form, exc)
        else:
            messages.success(request, f"Cluster {cluster.name} saved.")
            return redirect("cluster_list")
    context = {
        "form": form,
        "cluster": cluster,
        "has_kubeconfig": bool(cluster.kubeconfig_encrypted),
    }
    return render(request, "clusters/cluster_form.html", context)


def _description_text(cluster: Cluster) -> str:
    if cluster.backend != Backend.SIMULATED or not config_of(cluster):
        return ""
    return yaml.safe_dump(config_of(cluster), sort_keys=False)


@platform_admin_required
@require_POST
def cluster_test(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=pk)
    ok, message = services.cluster_test_connection(actor=request.user, cluster=cluster)
    if ok:
        messages.success(request, f"{cluster.name}: {message}")
    else:
        messages.error(request, f"{cluster.name} cannot be reached: {message}")
    return redirect("cluster_list")


@platform_admin_required
@require_POST
def cluster_sync(request: HttpRequest, pk: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=pk)
    try:
        result = services.cluster_sync_inventory(actor=request.user, cluster=cluster)
    except BackendUnreachable as exc:
        cluster_mark_unreachable(cluster, str(exc))
        messages.error(request, f"{cluster.name} cannot be reached: {exc}")
    else:
        messages.success(
            request,
            f"{cluster.name}: {result.nodes} nodes, {result.gpus} GPUs"
            + (f", {result.vanished} gone" if result.vanished else ""),
        )
    return redirect("cluster_list")


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    cluster_id, pool_id = query_id(request.GET.get("cluster")), query_id(request.GET.get("pool"))
    rows = selectors.node_rows(request.user, cluster_id=cluster_id, pool_id=pool_id)
    context = {
        "rows": rows,
        "clusters": Cluster.objects.all(),
        "pools": NodePool.objects.all(),
        "cluster_id": cluster_id,
        "pool_id": pool_id,
        "gpus_total": sum(len(r.gpus) for r in rows),
        "gpus_used": sum(r.used for r in rows),
    }
    return render(request, "clusters/node_list.html", context)
