"""The overview: a researcher's own work, projects and launch buttons; an admin's
organisation on top of that."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from clusters.metrics.reports import user_month
from clusters.models import NodePool
from portal import selectors
from portal.permissions import is_admin, submittable_projects, visible_projects
from scheduling import selectors as work
from scheduling.forms import FORM_KINDS, kind_noun


def _live(user: Any) -> dict[str, Any]:
    """What changes while the page is open: my work and my projects' standing."""
    return {"work": work.my_work(user), "my_projects": work.my_projects(user)}


@login_required
def home(request: HttpRequest) -> HttpResponse:
    user = request.user
    context: dict[str, Any] = {
        **_live(user),
        "launch": [(k, kind_noun(k)) for k in FORM_KINDS],
        "can_launch": submittable_projects(user).exists(),
        "month": user_month(user, visible_projects(user), timezone.now()),
    }
    if is_admin(user):
        projects = selectors.project_list_for_user(user)
        capacity = selectors.pool_capacity()
        context.update(
            projects=projects,
            rows=selectors.quota_overview(projects),
            departments=selectors.department_list_for_user(user),
            pools=NodePool.objects.all(),
            users=selectors.user_list_for_admin(user).count(),
            recent=selectors.audit_log_for_user(user)[:8],
            over_committed=[c for c in capacity if c.over_committed],
        )
    return render(request, "portal/home.html", context)


@login_required
def home_live(request: HttpRequest) -> HttpResponse:
    """The overview's changing part, polled by static/js/home.js."""
    return render(request, "portal/_home_live.html", _live(request.user))
