from __future__ import annotations

from django.contrib import admin

from clusters.metrics.models import GpuPrice, NodeToken
from portal.admin import AuditedAdmin


@admin.register(GpuPrice)
class GpuPriceAdmin(AuditedAdmin):
    list_display = ("gpu_model", "price_per_hour", "currency", "updated_at")


@admin.register(NodeToken)
class NodeTokenAdmin(AuditedAdmin):
    # Tokens are issued on /nodes/tokens/ (shown once); here they can only be looked at.
    list_display = ("prefix", "node", "created_by", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("node", "token_hash", "prefix", "created_by", "created_at", "last_used_at")

    def has_add_permission(self, request) -> bool:
        return False
