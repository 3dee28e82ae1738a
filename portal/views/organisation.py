"""Overview, departments, projects and node pools."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from clusters.models import NodePool
from portal import selectors, services
from portal.forms import DepartmentForm, NodePoolForm, ProjectForm, QuotaTableForm
from portal.models import Department, Project, default_manifest_kinds
from portal.permissions import (
    admin_required,
    can_admin_project,
    departments_for_admin,
    is_platform_admin,
    platform_admin_required,
    visible_projects,
)
from portal.views.common import confirmed, form_saved, optional_template, posted

# --- Departments ------------------------------------------------------------------------------


@admin_required
def department_list(request: HttpRequest) -> HttpResponse:
    departments = selectors.department_list_for_user(request.user).prefetch_related(
        "quotas__node_pool"
    )
    context = {"departments": departments, "capacity": selectors.pool_capacity()}
    return render(request, "portal/department_list.html", context)


@platform_admin_required
def department_create(request: HttpRequest) -> HttpResponse:
    form = DepartmentForm(posted(request))
    done = form_saved(
        request,
        form,
        lambda: services.department_create(actor=request.user, **form.cleaned_data),
        message=lambda department: f"Department {department.name} created; set its quotas.",
        then=lambda department: redirect("department_edit", pk=department.pk),
    )
    return done or render(request, "portal/department_form.html", {"form": form})


def _department(request: HttpRequest, pk: int) -> Department:
    return get_object_or_404(departments_for_admin(request.user), pk=pk)


def _department_page(request: HttpRequest, department: Department, **forms: Any) -> HttpResponse:
    context = {
        "department": department,
        "form": forms.get("form")
        or DepartmentForm(initial={"name": department.name, "description": department.description}),
        "quota_form": forms.get("quota_form") or QuotaTableForm(selectors.quota_table(department)),
        "quota_rows": selectors.quota_table(department),
        "can_edit_quotas": is_platform_admin(request.user),
        "projects": department.projects.prefetch_related("quotas__node_pool"),
        "capacity": selectors.pool_capacity(),
    }
    return render(request, "portal/department_edit.html", context)


@admin_required
def department_edit(request: HttpRequest, pk: int) -> HttpResponse:
    department = _department(request, pk)
    form = DepartmentForm(posted(request))
    done = form_saved(
        request,
        form,
        lambda: services.department_update(
            actor=request.user, department=department, **form.cleaned_data
        ),
        message=lambda saved: f"Department {saved.name} saved.",
        then=lambda saved: redirect("department_edit", pk=saved.pk),
    )
    return done or _department_page(request, department, form=form if form.is_bound else None)


@platform_admin_required
def department_quotas(request: HttpRequest, pk: int) -> HttpResponse:
    department = _department(request, pk)
    quota_form = QuotaTableForm(selectors.quota_table(department), posted(request))
    done = _quotas_saved(
        request, quota_form, department, redirect("department_edit", pk=department.pk)
    )
    return done or _department_page(request, department, quota_form=quota_form)


def _quotas_saved(
    request: HttpRequest, quota_form: QuotaTableForm, owner: Department | Project, then: Any
) -> HttpResponse | None:
    return form_saved(
        request,
        quota_form,
        lambda: services.quota_set(actor=request.user, owner=owner, table=quota_form.table()),
        message=lambda _: f"Quotas of {owner.name} saved.",
        then=lambda _: then,
        show=QuotaTableForm.show_errors,
    )


@platform_admin_required
def department_delete(request: HttpRequest, pk: int) -> HttpResponse:
    department = _department(request, pk)
    return confirmed(
        request,
        ("portal/confirm_delete.html", {"object": department, "kind": "department"}),
        lambda: services.department_delete(actor=request.user, department=department),
        message=f"Department {department.name} deleted.",
        then=redirect("department_list"),
        back=redirect("department_edit", pk=department.pk),
    )


# --- Projects ---------------------------------------------------------------------------------


@login_required
def project_list(request: HttpRequest) -> HttpResponse:
    projects = selectors.project_list_for_user(request.user).prefetch_related("quotas__node_pool")
    can_create = departments_for_admin(request.user).exists()
    return render(
        request, "portal/project_list.html", {"projects": projects, "can_create": can_create}
    )


def _visible_project(request: HttpRequest, pk: int) -> Project:
    # Projects outside the user's view are "not found", not "forbidden": their names stay private.
    return get_object_or_404(visible_projects(request.user).select_related("department"), pk=pk)


def _admin_project(request: HttpRequest, pk: int) -> Project:
    project = _visible_project(request, pk)
    if not can_admin_project(request.user, project):
        raise PermissionDenied("Only the admins of this project's department may change it.")
    return project


@login_required
def project_detail(request: HttpRequest, pk: int) -> HttpResponse:
    project = _visible_project(request, pk)
    context = {
        "project": project,
        "quota_rows": selectors.quota_table(project),
        "members": project.memberships.select_related("user").order_by("user__username"),
        "can_admin": can_admin_project(request.user, project),
        # The workloads area adds per-pool fair share and allocation here when it exists.
        "usage_partial": optional_template("scheduling/_project_pool_usage.html"),
    }
    return render(request, "portal/project_detail.html", context)


@admin_required
def project_create(request: HttpRequest) -> HttpResponse:
    initial = {
        "department": request.GET.get("department"),
        "manifest_kinds": default_manifest_kinds(),
    }
    form = ProjectForm(posted(request), user=request.user, initial=initial)
    done = form_saved(
        request,
        form,
        lambda: services.project_create(actor=request.user, **form.cleaned_data),
        message=lambda project: f"Project {project.name} created; set its quotas.",
        then=lambda project: redirect("project_quotas", pk=project.pk),
    )
    return done or render(request, "portal/project_form.html", {"form": form})


@login_required
def project_edit(request: HttpRequest, pk: int) -> HttpResponse:
    project = _admin_project(request, pk)
    fields = (
        "department", "name", "namespace", "description", "nonpreemptible_over_quota",
        "enforce_scheduler", "manifest_kinds",
    )  # fmt: skip
    initial = {f: getattr(project, f) for f in fields}
    form = ProjectForm(posted(request), user=request.user, editing=True, initial=initial)
    done = form_saved(
        request,
        form,
        # A project stays in its department: the form shows it but the service never moves it.
        lambda: services.project_update(
            actor=request.user,
            project=project,
            **{k: v for k, v in form.cleaned_data.items() if k != "department"},
        ),
        message=lambda saved: f"Project {saved.name} saved.",
        then=lambda saved: redirect("project_detail", pk=saved.pk),
    )
    return done or render(request, "portal/project_form.html", {"form": form, "project": project})


@login_required
def project_quotas(request: HttpRequest, pk: int) -> HttpResponse:
    project = _admin_project(request, pk)
    quota_form = QuotaTableForm(selectors.quota_table(project), posted(request))
    done = _quotas_saved(request, quota_form, project, redirect("project_detail", pk=project.pk))
    if done:
        return done
    parent = selectors.quota_table(project.department)
    context = {
        "project": project,
        "quota_form": quota_form,
        "department_rows": parent,
        "capacity": selectors.pool_capacity(),
    }
    return render(request, "portal/project_quotas.html", context)


@login_required
def project_delete(request: HttpRequest, pk: int) -> HttpResponse:
    project = _admin_project(request, pk)
    return confirmed(
        request,
        ("portal/confirm_delete.html", {"object": project, "kind": "project"}),
        lambda: services.project_delete(actor=request.user, project=project),
        message=f"Project {project.name} deleted.",
        then=redirect("project_list"),
        back=redirect("project_detail", pk=project.pk),
    )


# --- Node pools -------------------------------------------------------------------------------


@platform_admin_required
def node_pool_list(request: HttpRequest) -> HttpResponse:
    pools = NodePool.objects.select_related("cluster")
    context = {"pools": pools, "can_edit": is_platform_admin(request.user)}
    return render(request, "portal/node_pool_list.html", context)


@platform_admin_required
def node_pool_form(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    pool = get_object_or_404(NodePool, pk=pk) if pk else None
    initial = {f: getattr(pool, f) for f in services.organisation.POOL_FIELDS} if pool else {}
    form = NodePoolForm(posted(request), initial=initial)

    def save() -> NodePool:
        if pool:
            return services.node_pool_update(actor=request.user, pool=pool, **form.cleaned_data)
        return services.node_pool_create(actor=request.user, **form.cleaned_data)

    done = form_saved(
        request,
        form,
        save,
        message=lambda saved: f"Node pool {saved.name} saved.",
        then=lambda _: redirect("node_pool_list"),
    )
    return done or render(request, "portal/node_pool_form.html", {"form": form, "pool": pool})
