from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class MetricsConfig(AppConfig):
    name = "clusters.metrics"
    label = "metrics"
    verbose_name = "GPU metrics"

    def ready(self) -> None:
        from clusters.metrics import allocations  # noqa: PLC0415 - models load after apps
        from scheduling.models import PodAllocation  # noqa: PLC0415 - same reason

        # Exact admission and release times for usage history (see allocations.py).
        post_save.connect(
            allocations.on_allocation_saved, sender=PodAllocation, dispatch_uid="metrics-open"
        )
        post_delete.connect(
            allocations.on_allocation_deleted, sender=PodAllocation, dispatch_uid="metrics-close"
        )
