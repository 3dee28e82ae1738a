"""Workspace pages under /workspaces/. `/workspaces/<id>/lab/...` never reaches Django: the
ASGI proxy (workspaces.proxy) serves it."""

from __future__ import annotations

from django.urls import path

from workspaces import views

app_name = "workspaces"
urlpatterns = [
    path("", views.workspace_list, name="list"),
    path("new/", views.workspace_launch, name="launch"),
    path("<int:workspace_id>/", views.workspace_detail, name="detail"),
    path("<int:workspace_id>/status/", views.workspace_status, name="status"),
    path("<int:workspace_id>/keep-running/", views.workspace_keep_alive, name="keep_alive"),
    path("<int:workspace_id>/share/", views.workspace_share, name="share"),
    path("<int:workspace_id>/stop/", views.workspace_stop, name="stop"),
]
