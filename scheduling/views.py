"""Workload pages: list, submit, detail, stop/delete/clone, logs, the queue, cycles, policies."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from clusters.selectors import enforced_limits, pod_limits, workload_pod_logs
from portal.errors import ValidationFailed
from portal.permissions import (
    admin_required,
    can_submit_to_project,
    departments_for_admin,
    platform_admin_required,
    visible_projects,
)
from portal.queueing import deferrals, deferred_notice
from scheduling import bounds, form_layout, selectors, services
from scheduling.forms import (
    FORM_KINDS,
    ManifestForm,
    PolicyForm,
    WorkloadForm,
    initial_from,
    kind_noun,
    show_errors,
)
from scheduling.models import (
    FINISHED_STATES,
    CycleRun,
    Workload,
    WorkloadKind,
    WorkloadPolicy,
    WorkloadState,
)
from scheduling.policies import effective_policies, effective_policy, policy_owner

CSV_COLUMNS = [
    "id", "name", "project", "kind", "state", "user", "gpus_requested", "gpus_allocated",
    "node_pool", "node", "age_s", "runtime_s", "restarts", "pending_reason", "why",
]  # fmt: skip
LIST_LIMIT = 500


def _posted(request: HttpRequest) -> Any:
    return request.POST if request.method == "POST" else None


def visible_workload(request: HttpRequest, pk: int) -> Workload:
    """The workload if the user may see its project; 404 otherwise (no existence leak)."""
    qs = Workload.objects.filter(project__in=visible_projects(request.user))
    related = ("project__department", "submitted_by", "cluster")
    return get_object_or_404(qs.select_related(*related), pk=pk)


@login_required
def workload_list(request: HttpRequest) -> HttpResponse:
    workloads = selectors.workload_list(request.user, request.GET)
    if request.GET.get("format") == "csv":
        return _csv(workloads)
    shown = workloads[:LIST_LIMIT]
    rows = [{**selectors.workload_row(wl), "size": selectors.size_text(wl)} for wl in shown]
    context = {
        "rows": rows,
        "truncated": len(rows) == LIST_LIMIT,
        "projects": visible_projects(request.user),
        "clusters": selectors.cluster_names(),
        "kinds": WorkloadKind.choices,
        "states": WorkloadState.choices,
        "filters": {k: request.GET.get(k, "") for k in selectors.FILTERS},
        "sort": request.GET.get("sort", ""),
        "query": request.GET.urlencode(),
        "form_kinds": [(k, WorkloadKind(k).label) for k in FORM_KINDS],
    }
    return render(request, "scheduling/workload_list.html", context)


def _csv(workloads: Any) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="workloads.csv"'
    writer = csv.DictWriter(response, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for wl in workloads.iterator(chunk_size=500):
        writer.writerow(selectors.workload_row(wl))
    return response


@login_required
def workload_new(request: HttpRequest, kind: str) -> HttpResponse:
    if kind == WorkloadKind.WORKSPACE:
        return redirect("/workspaces/")
    if kind not in FORM_KINDS:
        raise Http404("No such workload kind.")
    form = WorkloadForm(_posted(request), user=request.user, kind=kind)
    if request.method == "POST" and form.is_valid():
        try:
            with deferrals() as deferred:
                workload = services.workload_submit(
                    actor=request.user,
                    project=form.cleaned_data["project"],
                    kind=kind,
                    name=form.cleaned_data["name"],
                    **form.spec(),
                )
        except ValidationFailed as exc:
            show_errors(form, exc)
        else:
            messages.success(request, f"{workload.name} is queued.", extra_tags=selectors.QUEUED)
            if notice := deferred_notice(deferred):
                messages.warning(request, notice)
            return redirect("workload_detail", pk=workload.pk)
    return render(request, "scheduling/workload_form.html", _form_context(form, kind))


@login_required
def workload_from_yaml(request: HttpRequest) -> HttpResponse:
    """ "From YAML": create a Kubernetes Pod or Job in the project's namespace; the intake
    queues it on the cluster's next pass (clusters/manifest_submit.py)."""
    # Imported here: it imports `kubernetes`, seconds of every process's start.
    from clusters.manifest_submit import manifest_submit, submitted_message  # noqa: PLC0415

    form = ManifestForm(_posted(request), user=request.user)
    if request.method == "POST" and form.is_valid():
        project = form.cleaned_data["project"]
        try:
            made = manifest_submit(
                actor=request.user,
                project=project,
                text=form.cleaned_data["manifest"],
                cluster=form.cleaned_data["cluster"],
            )
        except ValidationFailed as exc:
            show_errors(form, exc)
        else:
            messages.success(request, submitted_message(made, project))
            return redirect(f"{reverse('workload_list')}?project={project.name}")
    return render(request, "scheduling/manifest_form.html", {"form": form})


@login_required
def workload_clone(request: HttpRequest, pk: int) -> HttpResponse:
    """Open the submit form of the same kind, filled in from this workload."""
    workload = visible_workload(request, pk)
    if not can_submit_to_project(request.user, workload.project):
        raise PermissionDenied("You may not submit work to this project.")
    kind = workload.kind if workload.kind in FORM_KINDS else WorkloadKind.TRAINING
    form = WorkloadForm(user=request.user, kind=kind, initial=initial_from(workload))
    context = {**_form_context(form, kind), "clone_of": workload}
    return render(request, "scheduling/workload_form.html", context)


def _form_context(form: WorkloadForm, kind: str) -> dict[str, Any]:
    """The form in its sections, with what each backend does with the image, each
    project's policy limits beside the fields they bound, and the environments' images."""
    projects = list(form.fields["project"].queryset.select_related("department"))
    policies = effective_policies(projects)
    return {
        "form": form,
        "kind": kind,
        "kind_label": WorkloadKind(kind).label,
        "kind_noun": kind_noun(kind),
        "sections": form_layout.sections(form),
        "image_help": form_layout.image_help(form.backends),
        "limits": {pk: form_layout.policy_limits(p, kind) for pk, p in policies.items()},
        "selected_project": str(form["project"].value() or (projects[0].pk if projects else "")),
        "environment_images": {str(e.pk): e.image for e in form.environments},
        "simulated_pools": [
            name for name, backends in form.pool_backends.items() if "simulated" in backends
        ],
        "real_pools": [
            name for name, backends in form.pool_backends.items() if backends - {"simulated"}
        ],
    }


def _live_context(workload: Workload) -> dict[str, Any]:
    allocations = list(workload.allocations.select_related("node__cluster", "node__pool"))
    for allocation in allocations:
        allocation.enforced = enforced_limits(allocation)  # type: ignore[attr-defined]
        allocation.limits = pod_limits(allocation)  # type: ignore[attr-defined]
    return {
        "wl": workload,
        "row": selectors.workload_row(workload),
        "waits": selectors.workload_waits(workload),
        "size": selectors.size_text(workload),
        "events": workload.events.all(),
        "allocations": allocations,
    }


@login_required
def workload_detail(request: HttpRequest, pk: int) -> HttpResponse:
    workload = visible_workload(request, pk)
    context = {
        **_live_context(workload),
        "trials": workload.children.order_by("pk") if workload.kind == WorkloadKind.HPO else [],
        "can_act": can_submit_to_project(request.user, workload.project),
        "clonable": workload.kind in FORM_KINDS,
        "links": selectors.workload_links(workload),
        "stale_tag": selectors.queued_banner_stale(workload),
        "origin": selectors.workload_origin(workload),
    }
    return render(request, "scheduling/workload_detail.html", context)


@login_required
def workload_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The changing part of the workload page (state, allocation, events) for polling."""
    workload = visible_workload(request, pk)
    return render(request, "scheduling/_workload_live.html", _live_context(workload))


@login_required
@require_POST
def workload_stop(request: HttpRequest, pk: int) -> HttpResponse:
    workload = visible_workload(request, pk)
    try:
        services.workload_stop(actor=request.user, workload=workload)
    except ValidationFailed as exc:
        messages.error(request, " ".join(m for msgs in exc.errors.values() for m in msgs))
    else:
        messages.success(request, f"{workload.name} is stopping.")
    return redirect("workload_detail", pk=pk)


@login_required
def workload_delete(request: HttpRequest, pk: int) -> HttpResponse:
    workload = visible_workload(request, pk)
    if not can_submit_to_project(request.user, workload.project):
        raise PermissionDenied("You may not delete work in this project.")
    error = ""
    if request.method == "POST":
        try:
            services.workload_delete(actor=request.user, workload=workload)
        except ValidationFailed as exc:
            error = " ".join(m for msgs in exc.errors.values() for m in msgs)
        else:
            messages.success(request, f"{workload.name} deleted.")
            return redirect("workload_list")
    return render(request, "scheduling/workload_delete.html", {"wl": workload, "error": error})


@login_required
def workload_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """One pod's log, followed while the workload runs (static/js/logs.js polls the
    fragment below), with a pod choice for multi-pod work and a download."""
    workload = visible_workload(request, pk)
    pod, tail = _log_choice(request, workload)
    pods, unavailable = workload_pod_logs(workload, tail_lines=tail, pod=pod)
    context = {
        "wl": workload,
        "pod": pod,
        "tail": tail,
        "pod_choices": range(workload.pods),
        "text": pods[0][1] if pods else "",
        "unavailable": unavailable,
        "why": selectors.workload_why(workload),
        "following": workload.state not in FINISHED_STATES,
    }
    return render(request, "scheduling/workload_logs.html", context)


@login_required
def workload_logs_fragment(request: HttpRequest, pk: int) -> HttpResponse:
    """The followed part of the logs page: the pod's latest lines and the state."""
    workload = visible_workload(request, pk)
    pod, tail = _log_choice(request, workload)
    pods, unavailable = workload_pod_logs(workload, tail_lines=tail, pod=pod)
    context = {
        "wl": workload,
        "text": pods[0][1] if pods else "",
        "unavailable": unavailable,
        "why": selectors.workload_why(workload),
        "following": workload.state not in FINISHED_STATES,
    }
    return render(request, "scheduling/_workload_log.html", context)


@login_required
def workload_logs_download(request: HttpRequest, pk: int) -> HttpResponse:
    """The pod's log as a text file, as many lines as the cluster keeps up to the bound."""
    workload = visible_workload(request, pk)
    pod, _ = _log_choice(request, workload)
    pods, unavailable = workload_pod_logs(workload, tail_lines=int(bounds.LOG_LINES.high), pod=pod)
    response = HttpResponse(
        pods[0][1] if pods else unavailable, content_type="text/plain; charset=utf-8"
    )
    filename = f"{workload.project.name}-{workload.name}-pod{pod}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _log_choice(request: HttpRequest, workload: Workload) -> tuple[int, int]:
    """?pod= (0 .. pods - 1) and ?tail= (lines), each bounded; out of range is a 400."""
    choice = []
    pods = bounds.pod_index(workload.pods)
    for name, bound, default in (("pod", pods, 0), ("tail", bounds.LOG_LINES, 500)):
        value = request.GET.get(name)
        if value in (None, ""):
            choice.append(default)
            continue
        number, error = bound.whole(value)
        if error:
            raise BadRequest(f"{name}: {error}")
        choice.append(int(number))
    return choice[0], choice[1]


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    rows, order = selectors.queue_order(request.user)
    for _, wl in order:
        wl.gpus_text = selectors.gpus_requested(wl)
    context = {"rows": rows, "order": order, "cycle": selectors.last_cycle()}
    return render(request, "scheduling/queue.html", context)


@platform_admin_required
def cycles(request: HttpRequest) -> HttpResponse:
    runs = CycleRun.objects.all()[:100]
    return render(request, "scheduling/cycles.html", {"runs": runs})


@admin_required
def policies(request: HttpRequest) -> HttpResponse:
    departments = departments_for_admin(request.user).prefetch_related("projects")
    rows = []
    for dept in departments:
        rows.append(("department", dept, WorkloadPolicy.objects.filter(department=dept).first()))
        for project in dept.projects.all():
            policy = WorkloadPolicy.objects.filter(project=project).first()
            rows.append(("project", project, policy))
    return render(request, "scheduling/policies.html", {"rows": rows})


@admin_required
def policy_edit(request: HttpRequest, scope: str, pk: int) -> HttpResponse:
    owner = policy_owner(request.user, scope, pk)
    current = WorkloadPolicy.objects.filter(**{scope: owner}).first()
    initial = {f: getattr(current, f) for f in PolicyForm.base_fields} if current else {}
    form = PolicyForm(_posted(request), initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.policy_set(actor=request.user, **{scope: owner}, **form.values())
        except ValidationFailed as exc:
            show_errors(form, exc)
        else:
            messages.success(request, f"Policy of {owner} saved.")
            return redirect("workload_policies")
    effective = effective_policy(owner) if scope == "project" else None
    context = {"form": form, "owner": owner, "scope": scope, "effective": effective}
    return render(request, "scheduling/policy_form.html", context)
