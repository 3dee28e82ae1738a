"""Workspace pages under /workspaces/. `/workspaces/<id>/lab/...` never reaches Django: the
ASGI proxy (workspaces.proxy) serves it."""

from __future__ import annotations

from django.urls import path

from workspaces import admin_views, views

app_name = "workspaces"
urlpatterns = [
    path("", views.workspace_list, name="list"),
    path("new/", views.workspace_launch, name="launch"),
    path("<int:workspace_id>/", views.workspace_detail, name="detail"),
    path("<int:workspace_id>/status/", views.workspace_status, name="status"),
    path("<int:workspace_id>/keep-running/", views.workspace_keep_alive, name="keep_alive"),
    path("<int:workspace_id>/share/", views.workspace_share, name="share"),
    path("<int:workspace_id>/stop/", views.workspace_stop, name="stop"),
    path("environments/", admin_views.environment_list, name="environments"),
    path("environments/new/", admin_views.environment_edit, name="environment_new"),
    path(
        "environments/<int:environment_id>/",
        admin_views.environment_edit,
        name="environment_edit",
    ),
    path("templates/", admin_views.template_list, name="templates"),
    path("idle-policies/", admin_views.idle_policy_list, name="idle_policies"),
]
