"""Workload endpoints under /api/v1/."""

from django.urls import path

from scheduling import api

urlpatterns = [
    path("workloads/", api.WorkloadListView.as_view(), name="api-workloads"),
    path("workloads/<int:pk>/", api.WorkloadDetailView.as_view(), name="api-workload"),
    path("workloads/<int:pk>/stop/", api.WorkloadStopView.as_view(), name="api-workload-stop"),
    path(
        "workloads/<int:pk>/checkpoint/",
        api.WorkloadCheckpointView.as_view(),
        name="api-workload-checkpoint",
    ),
    path(
        "workloads/<int:pk>/events/", api.WorkloadEventsView.as_view(), name="api-workload-events"
    ),
    path("workloads/<int:pk>/logs/", api.WorkloadLogsView.as_view(), name="api-workload-logs"),
    path("queue/", api.QueueView.as_view(), name="api-queue"),
    path("policies/", api.PolicyListView.as_view(), name="api-policies"),
    path("policies/<str:scope>/<int:pk>/", api.PolicyDetailView.as_view(), name="api-policy"),
    path("cycles/", api.CycleListView.as_view(), name="api-cycles"),
]
