from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.permissions import visible_projects


@login_required
def home(request: HttpRequest) -> HttpResponse:
    projects = visible_projects(request.user).select_related("department")
    return render(request, "portal/home.html", {"projects": projects})
