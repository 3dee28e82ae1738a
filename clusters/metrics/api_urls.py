from __future__ import annotations

from django.urls import path

from clusters.metrics import api

urlpatterns = [
    path("metrics", api.MetricsIngestView.as_view(), name="metrics-ingest"),
    path("metrics/pods", api.AgentPodsView.as_view(), name="metrics-agent-pods"),
]
