"""Quota history: the deserved GPUs in force at any past time, per owner and node pool.

Quota rows hold today's value only. Each change is recorded as a QuotaRecord (post_save and
post_delete on portal's quota models, connected in apps.py); each roll-up first records any
change made without signals. Before an owner's first record its first value is assumed:
history starts when it was first kept, and older periods keep the behaviour they had.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections import defaultdict
from typing import Any

from django.utils import timezone

from clusters.metrics.models import QuotaRecord
from portal.models import DepartmentQuota, ProjectQuota

Key = tuple[str, int, int]  # kind, owner id, pool id
QUOTA_MODELS: dict[str, tuple[type, str]] = {
    QuotaRecord.PROJECT: (ProjectQuota, "project_id"),
    QuotaRecord.DEPARTMENT: (DepartmentQuota, "department_id"),
}


def _key(quota: Any) -> Key:
    if isinstance(quota, ProjectQuota):
        return (QuotaRecord.PROJECT, quota.project_id, quota.node_pool_id)
    return (QuotaRecord.DEPARTMENT, quota.department_id, quota.node_pool_id)


def quota_record(key: Key, gpus: float, at: dt.datetime) -> QuotaRecord | None:
    """Record `gpus` from `at` on, unless that is already the latest value of the key."""
    kind, owner_id, pool_id = key
    latest = (
        QuotaRecord.objects.filter(kind=kind, owner_id=owner_id, pool_id=pool_id)
        .order_by("-valid_from", "-id")
        .first()
    )
    if latest is not None and latest.gpus == gpus:
        return None
    return QuotaRecord.objects.create(
        kind=kind, owner_id=owner_id, pool_id=pool_id, gpus=gpus, valid_from=at
    )


def on_quota_saved(sender: type, instance: Any, **kwargs: Any) -> None:
    quota_record(_key(instance), float(instance.gpus), timezone.now())


def on_quota_deleted(sender: type, instance: Any, **kwargs: Any) -> None:
    # A removed quota deserves nothing from now on; its past stays as it was.
    quota_record(_key(instance), 0.0, timezone.now())


def quota_history_sync(now: dt.datetime) -> int:
    """Record quotas whose value differs from their latest record (changed by bulk writes
    that send no signals); returns how many records were written."""
    latest = _latest_values()
    written = 0
    for kind, (model, owner_field) in QUOTA_MODELS.items():
        for owner_id, pool_id, gpus in model.objects.values_list(
            owner_field, "node_pool_id", "gpus"
        ):
            key = (kind, owner_id, pool_id)
            if latest.get(key) != float(gpus):
                quota_record(key, float(gpus), now)
                written += 1
    return written


def _latest_values() -> dict[Key, float]:
    rows = QuotaRecord.objects.order_by("valid_from", "id").values_list(
        "kind", "owner_id", "pool_id", "gpus"
    )
    return {(kind, owner, pool): gpus for kind, owner, pool, gpus in rows}  # the last one wins


class QuotaTimeline:
    """The records of some keys, asked `at(key, t)`: the value in force at time t."""

    def __init__(self, records: list[QuotaRecord]):
        self.times: dict[Key, list[dt.datetime]] = defaultdict(list)
        self.values: dict[Key, list[float]] = defaultdict(list)
        for r in sorted(records, key=lambda r: (r.valid_from, r.id)):
            key = (r.kind, r.owner_id, r.pool_id)
            self.times[key].append(r.valid_from)
            self.values[key].append(r.gpus)

    def at(self, key: Key, t: dt.datetime) -> float:
        times = self.times.get(key)
        if not times:
            return 0.0
        # Before the first record, the first value (see the module's docstring).
        return self.values[key][max(0, bisect.bisect_right(times, t) - 1)]

    def known(self) -> list[Key]:
        return sorted(self.times)

    def change_times(self, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
        inside = {t for times in self.times.values() for t in times if start < t < end}
        return [start, *sorted(inside)]


def timeline(kind: str, **filters: Any) -> QuotaTimeline:
    """Every record of one kind, optionally for one owner_id and/or pool_id."""
    return QuotaTimeline(list(QuotaRecord.objects.filter(kind=kind, **filters)))


def deserved_steps(
    kind: str, owner_id: int, start: dt.datetime, end: dt.datetime, pool_id: int | None = None
) -> tuple[list[str], list[float]]:
    """The owner's deserved GPUs (summed over pools, or in one) from start to end, as the
    x and y of a step line: a point at start, at each change, and at end."""
    filters: dict[str, Any] = {"owner_id": owner_id}
    if pool_id is not None:
        filters["pool_id"] = pool_id
    history = timeline(kind, **filters)
    times = history.change_times(start, end)
    ys = [round(sum(history.at(key, t) for key in history.known()), 3) for t in times]
    return [t.isoformat() for t in [*times, end]], [*ys, ys[-1]]
