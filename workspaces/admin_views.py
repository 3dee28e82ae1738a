"""Administration pages of workspaces: environments (platform admins), project templates
and idle policies (department and platform admins)."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from portal.errors import ValidationFailed
from portal.models import Project
from portal.permissions import (
    admin_required,
    departments_for_admin,
    is_platform_admin,
    platform_admin_required,
)
from workspaces import services
from workspaces.forms import EnvironmentForm, IdlePolicyForm, TemplateForm
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate


@platform_admin_required
def environment_list(request: HttpRequest) -> HttpResponse:
    environments = Environment.objects.order_by("name")
    return render(request, "workspaces/environment_list.html", {"environments": environments})


@platform_admin_required
def environment_edit(request: HttpRequest, environment_id: int | None = None) -> HttpResponse:
    environment = get_object_or_404(Environment, pk=environment_id) if environment_id else None
    form = EnvironmentForm(request.POST or None, instance=environment)
    if request.method == "POST" and form.is_valid():
        services.environment_save(actor=request.user, environment=form.save(commit=False))
        messages.success(request, f"Environment {form.instance.name} saved.")
        return redirect("workspaces:environments")
    title = f"Environment {environment.name}" if environment else "New environment"
    return render(request, "workspaces/admin_form.html", {"form": form, "title": title})


def _administered_projects(user) -> object:
    return Project.objects.filter(department__in=departments_for_admin(user)).order_by("name")


@admin_required
def template_list(request: HttpRequest) -> HttpResponse:
    projects = _administered_projects(request.user)
    form = TemplateForm(request.POST or None, projects=projects)
    if request.method == "POST" and form.is_valid():
        services.template_save(actor=request.user, template=form.save(commit=False))
        messages.success(request, f"Template {form.instance.name} saved.")
        return redirect("workspaces:templates")
    templates = WorkspaceTemplate.objects.filter(project__in=projects).select_related(
        "project", "environment", "node_pool"
    )
    return render(request, "workspaces/template_list.html", {"templates": templates, "form": form})


def _policy_scopes(user) -> list[tuple[str, str]]:
    scopes = [("platform", "The whole platform")] if is_platform_admin(user) else []
    scopes += [(f"department:{d.pk}", f"Department {d.name}") for d in departments_for_admin(user)]
    scopes += [(f"project:{p.pk}", f"Project {p.name}") for p in _administered_projects(user)]
    return scopes


@admin_required
def idle_policy_list(request: HttpRequest) -> HttpResponse:
    form = IdlePolicyForm(request.POST or None, scopes=_policy_scopes(request.user))
    if request.method == "POST" and form.is_valid():
        kind, _, pk = form.cleaned_data["scope"].partition(":")
        data = {k: v for k, v in form.cleaned_data.items() if k != "scope"}
        try:
            services.idle_policy_set(
                actor=request.user,
                project=Project.objects.get(pk=pk) if kind == "project" else None,
                department=departments_for_admin(request.user).get(pk=pk)
                if kind == "department"
                else None,
                **data,
            )
        except ValidationFailed as exc:
            for field, errors in exc.errors.items():
                for error in errors:
                    form.add_error(field if field in form.fields else None, error)
        else:
            messages.success(request, "Idle policy saved.")
            return redirect("workspaces:idle_policies")
    departments = departments_for_admin(request.user)
    policies = IdlePolicy.objects.select_related("project", "department")
    if not is_platform_admin(request.user):
        policies = policies.filter(
            Q(department__in=departments) | Q(project__department__in=departments)
        )
    return render(request, "workspaces/idle_policy_list.html", {"policies": policies, "form": form})
