"""The organisation's REST endpoints, under /api/v1/."""

from django.urls import path

from portal import api

urlpatterns = [
    path("auth/token", api.TokenView.as_view(), name="api-token"),
    path("users/me", api.MeView.as_view(), name="api-me"),
    path("users/me/ssh-keys/", api.SshKeyListView.as_view(), name="api-ssh-keys"),
    path("users/me/ssh-keys/<int:pk>/", api.SshKeyDetailView.as_view(), name="api-ssh-key"),
    path("departments/", api.DepartmentListView.as_view(), name="api-departments"),
    path("departments/<int:pk>/", api.DepartmentDetailView.as_view(), name="api-department"),
    path(
        "departments/<int:pk>/quotas/",
        api.DepartmentQuotaView.as_view(),
        name="api-department-quotas",
    ),
    path("projects/", api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<int:pk>/", api.ProjectDetailView.as_view(), name="api-project"),
    path("projects/<int:pk>/quotas/", api.ProjectQuotaView.as_view(), name="api-project-quotas"),
    path("node-pools/", api.NodePoolListView.as_view(), name="api-node-pools"),
    path("node-pools/<int:pk>/", api.NodePoolDetailView.as_view(), name="api-node-pool"),
]
