"""bench_native makes native pods (bare, Jobs' and gangs') in project namespaces, runs the
beat's passes until all are bound, reports JSON and leaves no rows behind."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from clusters.models import Cluster, Node, NodePool
from portal.models import Department, Project
from scheduling.models import CycleRun, Workload

pytestmark = pytest.mark.timeout(120)


@pytest.mark.django_db(transaction=True)
def test_bench_native_binds_every_pod_reports_json_and_leaves_no_rows():
    out = StringIO()
    call_command(
        "bench_native", "--pods", "40", "--projects", "2", "--workers", "4", "--json", stdout=out
    )
    result = json.loads(out.getvalue())
    # One block of the mix (8 bare pods, 4 Jobs of 2, a gang of 8), then 16 bare pods.
    assert result["mix"] == {"pod": 24, "job": 8, "gang": 8}
    assert (result["pods"], result["bound"]) == (40, 40)
    assert 1 <= result["rounds"] == len(result["passes"])
    assert set(result["phases"]) == {"intake", "cycle", "bind"}
    for phase in result["phases"].values():
        assert set(phase) == {"seconds", "cpu_s", "db_cpu_s", "api_server_cpu_s", "sql"}
        assert phase["api_server_cpu_s"] is not None
        assert phase["sql"] > 0
    assert set(result["passes"][0]) == {
        "api_requests",
        "intake_sql",
        "intake_s",
        "cycle_sql",
        "cycle_s",
        "bind_sql",
        "bind_s",
    }
    # Each pod bound once: a Binding each, and at least the list of pods per pass.
    assert result["api_requests"] >= 40 + 2 * result["rounds"]
    assert result["pods_per_s"] > 0 and result["cpu_s"] > 0
    assert (result["database"], result["api_server"]) == (connection.vendor, "fake")
    for model in (Cluster, Node, NodePool, Department, Project, Workload, CycleRun):
        assert model.objects.count() == 0, model
