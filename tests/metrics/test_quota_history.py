"""Quota history: every change is recorded, and the value in force at a time is read back."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.template import RequestContext, Template
from django.test import RequestFactory
from django.utils import timezone

from clusters.metrics.models import QuotaRecord
from clusters.metrics.quota_history import deserved_steps, quota_history_sync, timeline
from portal import services
from portal.models import DepartmentQuota, ProjectQuota

pytestmark = pytest.mark.django_db
H = dt.timedelta(hours=1)


def history(kind: str, owner_id: int) -> list[float]:
    records = QuotaRecord.objects.filter(kind=kind, owner_id=owner_id)
    return list(records.order_by("valid_from", "id").values_list("gpus", flat=True))


def test_creating_changing_and_removing_a_project_quota_each_leave_a_record(org):
    quota = ProjectQuota.objects.get(project=org.project_a)
    quota.gpus = 6
    quota.save()
    quota.save()  # the same value again: nothing new to record
    quota.delete()
    assert history(QuotaRecord.PROJECT, org.project_a.pk) == [4.0, 6.0, 0.0]


def test_a_quota_set_through_the_service_is_recorded_for_the_department(org):
    table = {org.pool: {"gpus": 10, "over_quota_weight": 1}}
    services.quota_set(actor=org.platform_admin, owner=org.dept_a, table=table)
    assert history(QuotaRecord.DEPARTMENT, org.dept_a.pk) == [8.0, 10.0]


def test_the_sync_records_changes_made_without_signals_once(org):
    DepartmentQuota.objects.filter(department=org.dept_b).update(gpus=12)  # no signal
    now = timezone.now()
    assert quota_history_sync(now) == 1
    assert quota_history_sync(now) == 0
    assert history(QuotaRecord.DEPARTMENT, org.dept_b.pk) == [8.0, 12.0]


def test_the_timeline_gives_the_value_in_force_and_the_first_value_before_history(org):
    key = (QuotaRecord.PROJECT, org.project_a.pk, org.pool.pk)
    first = QuotaRecord.objects.get(kind=key[0], owner_id=key[1]).valid_from
    QuotaRecord.objects.create(
        kind=key[0], owner_id=key[1], pool_id=key[2], gpus=1, valid_from=first + H
    )
    quotas = timeline(QuotaRecord.PROJECT)
    assert quotas.at(key, first - 24 * H) == 4  # before history was kept
    assert quotas.at(key, first) == 4
    assert quotas.at(key, first + H) == 1
    assert quotas.at((QuotaRecord.PROJECT, org.project_a.pk, org.pool.pk + 99), first) == 0


def test_the_deserved_line_steps_where_the_quota_changed(org):
    start = QuotaRecord.objects.get(kind="project", owner_id=org.project_a.pk).valid_from
    QuotaRecord.objects.create(
        kind=QuotaRecord.PROJECT, owner_id=org.project_a.pk, pool_id=org.pool.pk, gpus=1,
        valid_from=start + 2 * H,
    )  # fmt: skip
    x, y = deserved_steps(QuotaRecord.PROJECT, org.project_a.pk, start, start + 5 * H)
    assert x == [(start + h * H).isoformat() for h in (0, 2, 5)]
    assert y == [4, 1, 1]


def test_the_project_chart_draws_the_quota_in_force_not_todays_for_the_whole_range(org):
    quota = ProjectQuota.objects.get(project=org.project_a)
    QuotaRecord.objects.filter(kind="project", owner_id=org.project_a.pk).update(
        valid_from=timezone.now() - 30 * H
    )
    quota.gpus = 7
    quota.save()
    QuotaRecord.objects.filter(kind="project", owner_id=org.project_a.pk, gpus=7).update(
        valid_from=timezone.now() - 3 * H
    )
    request = RequestFactory().get("/somewhere/")
    request.user = org.researcher
    html = Template("{% load metrics_charts %}{% project_usage_chart project %}").render(
        RequestContext(request, {"project": org.project_a})
    )
    figure = json.loads(re.search(r'<script id="[^"]+" type="application/json">(.*?)</script>',
                                  html, re.S).group(1))  # fmt: skip
    line = next(t for t in figure["data"] if t["name"] == "Deserved quota")
    assert line["y"] == [4, 7, 7]
    assert line["line"]["shape"] == "hv"
