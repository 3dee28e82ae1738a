"""bench_reconcile reconciles admitted pods into the fake API server and reports a rate."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from clusters.models import Cluster
from scheduling.models import Workload


@pytest.mark.django_db(transaction=True)
def test_bench_reconcile_creates_every_pod_once_reports_json_and_leaves_no_rows():
    out = StringIO()
    call_command("bench_reconcile", "--pods", "40", "--workers", "4", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["created"] == 40 and result["errors"] == 0
    assert result["second_pass_created"] == 0
    assert result["deleted_after"] == 40
    assert result["pods_per_s"] > 0 and result["api_server"] == "fake"
    assert Cluster.objects.count() == 0 and Workload.objects.count() == 0
