from __future__ import annotations

from django.urls import path

from clusters.metrics import prometheus, report_views, views

urlpatterns = [
    path("dashboard/", views.dashboard, name="dashboard"),
    path("dashboard/fragment/now/", views.dashboard_now, name="dashboard_now"),
    path("dashboard/fragment/chart/", views.dashboard_chart, name="dashboard_chart"),
    path("nodes/heatmap/", views.nodes_heatmap, name="nodes_heatmap"),
    path("nodes/tokens/", report_views.node_tokens, name="node_tokens"),
    path("reports/usage/", report_views.usage_report, name="usage_report"),
    path("reports/usage.csv", report_views.usage_report_csv, name="usage_report_csv"),
    path("reports/prices/", report_views.gpu_prices, name="gpu_prices"),
    path("metrics", prometheus.exposition, name="prometheus"),
]
