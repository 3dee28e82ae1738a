from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class MetricsConfig(AppConfig):
    name = "clusters.metrics"
    label = "metrics"
    verbose_name = "GPU metrics"

    def ready(self) -> None:
        from clusters.metrics import (  # noqa: PLC0415 - models load after apps
            allocations,
            quota_history,
        )
        from portal.models import DepartmentQuota, ProjectQuota  # noqa: PLC0415 - same reason
        from scheduling.models import PodAllocation  # noqa: PLC0415 - same reason
        from scheduling.signals import allocations_releasing  # noqa: PLC0415 - same reason

        # Exact admission and release times for usage history (see allocations.py).
        post_save.connect(
            allocations.on_allocation_saved, sender=PodAllocation, dispatch_uid="metrics-open"
        )
        post_delete.connect(
            allocations.on_allocation_deleted, sender=PodAllocation, dispatch_uid="metrics-close"
        )
        # Allocations released together (scheduling.lifecycle.workloads_pods_released).
        allocations_releasing.connect(
            allocations.on_allocations_releasing, dispatch_uid="metrics-close-many"
        )
        # Quota history, so past periods are judged against the quota then in force.
        for model in (ProjectQuota, DepartmentQuota):
            name = model.__name__.lower()
            post_save.connect(
                quota_history.on_quota_saved, sender=model, dispatch_uid=f"metrics-{name}-saved"
            )
            post_delete.connect(
                quota_history.on_quota_deleted, sender=model, dispatch_uid=f"metrics-{name}-gone"
            )
