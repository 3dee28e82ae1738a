"""Usage reports: GPU-hours per department, project, user, node pool, cluster or GPU model.

Numbers come from the per-workload roll-ups: whole hours from the hour rows, the part of
the period the hour roll-up has not reached yet from the minute rows. Every column is a
sum; utilisation is used / allocated of the sums, never an average of percentages.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet, Sum

from clusters.metrics.models import USAGE_SUMS, GpuPrice, Resolution, RollupMark, WorkloadUsage
from clusters.models import Cluster, NodePool
from portal.models import Department, Project, User

GROUPS = {
    "department": "department_id",
    "project": "project_id",
    "user": "user_id",
    "pool": "pool_id",
    "cluster": "cluster_id",
    "gpu_model": "gpu_model",
}
# ReportRow's columns that add up across rows (everything but its key and name).
ADDED = ("allocated_h", "used_h", "idle_h", "over_quota_h", "cost", "unpriced_h")


def month_start(day: dt.datetime) -> dt.datetime:
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_for(
    preset: str, now: dt.datetime, start: dt.date | None = None, end: dt.date | None = None
) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC: this month so far, last month, or whole custom days."""
    if preset == "last_month":
        this = month_start(now)
        return month_start(this - dt.timedelta(days=1)), this
    if preset == "custom" and start and end:
        begin = dt.datetime.combine(start, dt.time(), dt.UTC)
        return begin, dt.datetime.combine(end, dt.time(), dt.UTC) + dt.timedelta(days=1)
    return month_start(now), now


@dataclass
class ReportRow:
    key: Any
    name: str
    allocated_h: float = 0.0
    used_h: float = 0.0
    idle_h: float = 0.0
    over_quota_h: float = 0.0
    cost: Decimal = Decimal(0)
    unpriced_h: float = 0.0

    def add(self, other: ReportRow) -> None:
        for name in ADDED:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def utilisation_pct(self) -> float | None:
        return 100.0 * self.used_h / self.allocated_h if self.allocated_h else None


def _split(start: dt.datetime, end: dt.datetime) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """Hour rows where the hour roll-up is done, minute rows after that."""
    mark = RollupMark.objects.filter(name="hour").values_list("done_until", flat=True).first()
    if mark is None:
        return [(Resolution.MINUTE, start, end)]
    middle = min(max(mark, start), end)
    return [(Resolution.HOUR, start, middle), (Resolution.MINUTE, middle, end)]


def _sums(
    projects: QuerySet[Project],
    start: dt.datetime,
    end: dt.datetime,
    field: str,
    cluster: int | None = None,
):
    project_ids = list(projects.values_list("id", flat=True))
    where = {} if cluster is None else {"cluster_id": cluster}
    for resolution, lo, hi in _split(start, end):
        if lo >= hi:
            continue
        yield from (
            WorkloadUsage.objects.filter(
                resolution=resolution,
                bucket__gte=lo,
                bucket__lt=hi,
                project_id__in=project_ids,
                **where,
            )
            .values(field, "gpu_model")
            .annotate(**{name: Sum(name) for name in USAGE_SUMS})
        )


def _names(group: str, keys: set[Any]) -> dict[Any, str]:
    models = {"department": Department, "project": Project, "pool": NodePool, "cluster": Cluster}
    if group == "gpu_model":
        return {k: k or "(unknown)" for k in keys}
    if group == "user":
        return dict(User.objects.filter(pk__in=keys).values_list("pk", "username"))
    return dict(models[group].objects.filter(pk__in=keys).values_list("pk", "name"))


def _priced(sums: dict[str, Any], price: Decimal | None) -> ReportRow:
    """One roll-up sum in GPU-hours, costed at its GPU model's price (or counted unpriced)."""
    hours = {f"{name[:-2]}_h": sums[name] / 3600 for name in USAGE_SUMS}
    row = ReportRow(None, "", **hours)
    if price is None:
        row.unpriced_h = row.allocated_h
    else:
        row.cost = price * Decimal(str(round(row.allocated_h, 6)))
    return row


def usage_report(
    projects: QuerySet[Project],
    start: dt.datetime,
    end: dt.datetime,
    group: str,
    cluster: int | None = None,
) -> list[ReportRow]:
    """Rows of the group over [start, end), the projects' usage only; with `cluster`,
    only what ran on that cluster."""
    field = GROUPS[group]
    prices = {p.gpu_model: p.price_per_hour for p in GpuPrice.objects.all()}
    rows: dict[Any, ReportRow] = defaultdict(lambda: ReportRow(None, ""))
    for r in _sums(projects, start, end, field, cluster):
        rows[r[field]].add(_priced(r, prices.get(r["gpu_model"])))
    names = _names(group, set(rows))
    for key, row in rows.items():
        row.key, row.name = key, names.get(key, f"#{key}" if key is not None else "(none)")
    return sorted(rows.values(), key=lambda r: (-r.allocated_h, r.name))


def report_total(rows: list[ReportRow]) -> ReportRow:
    total = ReportRow(None, "Total")
    for row in rows:
        total.add(row)
    return total


def user_month(user: Any, projects: QuerySet[Project], now: dt.datetime) -> ReportRow:
    """The user's GPU-hours this month so far, in the given projects (zero when none)."""
    start, end = period_for("this_month", now)
    rows = usage_report(projects, start, end, "user")
    mine = next((row for row in rows if row.key == user.pk), None)
    return mine or ReportRow(user.pk, user.username)
