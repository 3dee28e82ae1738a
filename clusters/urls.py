from __future__ import annotations

from django.urls import path

from clusters import views

urlpatterns = [
    path("", views.cluster_list, name="cluster_list"),
    path("new/", views.cluster_new, name="cluster_new"),
    path("nodes/", views.node_list, name="node_list"),
    path("<int:pk>/edit/", views.cluster_edit, name="cluster_edit"),
    path("<int:pk>/test/", views.cluster_test, name="cluster_test"),
    path("<int:pk>/sync/", views.cluster_sync, name="cluster_sync"),
]
