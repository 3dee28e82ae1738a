"""Workload pages, under /workloads/."""

from django.urls import path

from scheduling import views

urlpatterns = [
    path("", views.workload_list, name="workload_list"),
    path("new-yaml/", views.workload_from_yaml, name="workload_from_yaml"),
    path("new/<str:kind>/", views.workload_new, name="workload_new"),
    path("queue/", views.queue, name="workload_queue"),
    path("cycles/", views.cycles, name="workload_cycles"),
    path("policies/", views.policies, name="workload_policies"),
    path("policies/<str:scope>/<int:pk>/", views.policy_edit, name="workload_policy_edit"),
    path("<int:pk>/", views.workload_detail, name="workload_detail"),
    path("<int:pk>/status/", views.workload_status, name="workload_status"),
    path("<int:pk>/stop/", views.workload_stop, name="workload_stop"),
    path("<int:pk>/delete/", views.workload_delete, name="workload_delete"),
    path("<int:pk>/clone/", views.workload_clone, name="workload_clone"),
    path("<int:pk>/logs/", views.workload_logs, name="workload_logs"),
    path("<int:pk>/logs/fragment/", views.workload_logs_fragment, name="workload_logs_fragment"),
    path("<int:pk>/logs/download/", views.workload_logs_download, name="workload_logs_download"),
]
