"""Django admin views of scheduling's tables, for operators; the product pages are in views.py."""

from __future__ import annotations

from django.contrib import admin

from portal.admin import AuditedAdmin
from scheduling.models import CycleRun, PodAllocation, Workload, WorkloadEvent, WorkloadPolicy


class PodAllocationInline(admin.TabularInline):
    model = PodAllocation
    extra = 0
    readonly_fields = ["pod_index", "node", "gpu_indices", "shared_gpu_index", "gpu_share"]


class WorkloadEventInline(admin.TabularInline):
    model = WorkloadEvent
    extra = 0
    readonly_fields = ["created_at", "type", "reason", "message"]


@admin.register(Workload)
class WorkloadAdmin(AuditedAdmin):
    list_display = ["name", "project", "kind", "state", "gpus", "pods", "restart_count"]
    list_filter = ["state", "kind", "project"]
    search_fields = ["name"]
    # State changes go through workload_transition; the admin only looks.
    readonly_fields = ["state", "restart_count", "pending_reason"]
    inlines = [PodAllocationInline, WorkloadEventInline]


@admin.register(WorkloadPolicy)
class WorkloadPolicyAdmin(AuditedAdmin):
    list_display = ["__str__", "max_gpus_per_workload", "max_runtime_s", "allowed_kinds"]


@admin.register(CycleRun)
class CycleRunAdmin(AuditedAdmin):
    list_display = ["started_at", "duration_ms", "admitted", "evicted", "pending", "ok"]
    list_filter = ["ok"]
