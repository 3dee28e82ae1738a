"""Workspaces REST API under /api/v1/."""

from __future__ import annotations

from django.urls import path

from workspaces import api

urlpatterns = [
    path("environments/", api.EnvironmentListApi.as_view(), name="api-environments"),
    path("workspaces/", api.WorkspaceListApi.as_view(), name="api-workspaces"),
    path(
        "workspaces/<int:workspace_id>/",
        api.WorkspaceDetailApi.as_view(),
        name="api-workspace",
    ),
    path(
        "workspaces/<int:workspace_id>/keep-running/",
        api.WorkspaceKeepAliveApi.as_view(),
        name="api-workspace-keep-running",
    ),
]
