"""Workspace pages: the list, the launch form, a workspace's page and its live status."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from clusters.selectors import pool_backends
from portal.errors import ValidationFailed
from portal.permissions import submittable_projects
from portal.queueing import deferrals, deferred_notice
from scheduling.bounds import query_id
from scheduling.form_layout import image_help
from scheduling.selectors import QUEUED, queued_banner_stale, workload_links, workload_why
from workspaces import selectors, services
from workspaces.forms import LaunchForm
from workspaces.jupyter import tool_answers
from workspaces.models import Workspace


def _workspace_for(request: HttpRequest, workspace_id: int) -> Workspace:
    workspace = selectors.workspace_get(workspace_id)
    if workspace is None or not selectors.can_view_workspace(request.user, workspace):
        raise Http404("No such workspace.")
    return workspace


@login_required
def workspace_list(request: HttpRequest) -> HttpResponse:
    workspaces = selectors.workspace_list_for_user(request.user)
    can_launch = submittable_projects(request.user).exists()
    return render(
        request,
        "workspaces/workspace_list.html",
        {"workspaces": workspaces, "can_launch": can_launch},
    )


@login_required
def workspace_launch(request: HttpRequest) -> HttpResponse:
    projects = submittable_projects(request.user).order_by("name")
    if not projects.exists():
        raise PermissionDenied("You are not a researcher in any project.")
    form = LaunchForm(request.POST or None, projects=projects, initial=_relaunch(request))
    if request.method == "POST" and form.is_valid():
        try:
            with deferrals() as deferred:
                workspace = services.workspace_launch(
                    actor=request.user,
                    project=form.cleaned_data["project"],
                    request=form.launch_request(),
                )
        except ValidationFailed as exc:
            form.add_service_errors(exc)
        else:
            messages.success(
                request, f"Workspace {workspace.workload.name} is queued.", extra_tags=QUEUED
            )
            if notice := deferred_notice(deferred):
                messages.warning(request, notice)
            return redirect("workspaces:detail", workspace_id=workspace.workload_id)
    context = {
        "form": form,
        "environments": selectors.environment_list(),
        "policies": selectors.submit_limits_for_projects(projects),
        "image_help": image_help(set().union(*pool_backends().values())),
    }
    return render(request, "workspaces/launch.html", context)


def _relaunch(request: HttpRequest) -> dict:
    """`?from=<id>`: the owner launches a finished workspace again (its settings, its files)."""
    source = query_id(request.GET.get("from"))
    if request.method != "GET" or source is None:
        return {}
    workspace = _workspace_for(request, source)
    if request.user.pk != workspace.workload.submitted_by_id:
        raise PermissionDenied("Only the owner launches a workspace again.")
    return selectors.relaunch_initial(workspace)


@login_required
def workspace_detail(request: HttpRequest, workspace_id: int) -> HttpResponse:
    workspace = _workspace_for(request, workspace_id)
    context = {
        **_status_context(request, workspace),
        "stale_tag": queued_banner_stale(workspace.workload),
    }
    return render(request, "workspaces/detail.html", context)


@login_required
def workspace_status(request: HttpRequest, workspace_id: int) -> HttpResponse:
    """The live part of the page, polled by static/js/workspace.js."""
    workspace = _workspace_for(request, workspace_id)
    return render(request, "workspaces/_status.html", _status_context(request, workspace))


def _status_context(request: HttpRequest, workspace: Workspace) -> dict:
    workload = workspace.workload
    can_open = selectors.can_open_workspace(request.user, workspace)
    return {
        "workspace": workspace,
        "workload": workload,
        "why": workload_why(workload),
        "allocations": workload.allocations.select_related("node", "node__cluster"),
        "events": workload.events.order_by("-created_at", "-id")[:20],
        "gpu_use": selectors.workspace_gpu_use(workspace),
        "policy": selectors.idle_policy_for(workload.project),
        "can_open": can_open,
        "tool_ready": can_open and tool_answers(workspace),
        "can_manage": selectors.can_manage_workspace(request.user, workspace),
        "is_owner": request.user.pk == workload.submitted_by_id,
        "links": workload_links(workload),
    }


def _post_action(request: HttpRequest, workspace_id: int, action: str) -> HttpResponse:
    workspace = _workspace_for(request, workspace_id)
    try:
        if action == "keep":
            services.workspace_keep_alive(actor=request.user, workspace=workspace)
            messages.success(request, "The idle clock restarted: it keeps running.")
        elif action == "share":
            shared = request.POST.get("shared") == "1"
            services.workspace_share_set(actor=request.user, workspace=workspace, shared=shared)
            messages.success(request, "Shared with the project." if shared else "Not shared.")
        else:
            services.workspace_stop(actor=request.user, workspace=workspace)
            messages.success(request, "Stopping the workspace.")
    except ValidationFailed as exc:
        messages.error(request, str(exc))
    return redirect("workspaces:detail", workspace_id=workspace_id)


@require_POST
@login_required
def workspace_keep_alive(request: HttpRequest, workspace_id: int) -> HttpResponse:
    return _post_action(request, workspace_id, "keep")


@require_POST
@login_required
def workspace_share(request: HttpRequest, workspace_id: int) -> HttpResponse:
    return _post_action(request, workspace_id, "share")


@require_POST
@login_required
def workspace_stop(request: HttpRequest, workspace_id: int) -> HttpResponse:
    return _post_action(request, workspace_id, "stop")
