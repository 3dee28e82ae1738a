"""The clusters app's REST endpoints, under /api/v1/."""

from __future__ import annotations

from django.urls import path

from clusters import api

urlpatterns = [
    path("clusters/", api.ClusterListView.as_view(), name="api-clusters"),
    path("clusters/<int:pk>/", api.ClusterDetailView.as_view(), name="api-cluster"),
    path("clusters/<int:pk>/test/", api.ClusterTestView.as_view(), name="api-cluster-test"),
    path("manifests/", api.ManifestSubmitView.as_view(), name="api-manifests"),
    path("nodes/", api.NodeListView.as_view(), name="api-nodes"),
    path("nodes/mig-report", api.NodeMigReportView.as_view(), name="api-node-mig-report"),
    path("nodes/mps-report", api.NodeMpsReportView.as_view(), name="api-node-mps-report"),
]
