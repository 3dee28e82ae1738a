"""bench_controlplane at its tiny scale: every comparable key, with figures of the right
kind, and counts that agree with the state it built and the cycles it ran.

No figure is held to a budget here: speed is measured by running the bench (docs/
controlplane.md), never asserted in a test.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from clusters.models import Gpu, Node
from scheduling.bench_controlplane.state import SCALES
from scheduling.engine import evictions_replay
from scheduling.engine.evictions_replay import replay
from scheduling.models import CycleRun, Workload, WorkloadEvent

pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="measures PostgreSQL: run under `python -m tests.services -- pytest ...`",
    ),
    pytest.mark.django_db(transaction=True),
]
FIGURES = (
    "cycle_cold_cpu_s",
    "cycle_steady_cpu_s",
    "arrival_cpu_s",
    "reconcile_idle_cpu_s",
    "reconcile_quiet_cpu_s",
    "reconcile_after_cycle_cpu_s",
    "inventory_idle_cpu_s",
    "cycle_idle_after_reconcile_cpu_s",
    "max_lock_wait_s",
    "evictions_idle_cycles",
    "sql_per_cycle",
    "peak_rss_mb",
)
LATENCIES = ("submit_admitted_p95_s", "admitted_pod_p95_s", "stamped_pod_p95_s")


def run_bench() -> dict:
    out = io.StringIO()
    call_command("bench_controlplane", "--scale=tiny", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_the_tiny_bench_reports_every_figure_and_counts_what_it_built(tmp_path, monkeypatch):
    tiny = SCALES["tiny"]
    monkeypatch.setenv("GPUPOOL_BENCH_SNAPSHOT_DIR", str(tmp_path))
    result = run_bench()
    scenario = tiny.scenario
    for key in FIGURES:
        assert isinstance(result[key], int | float) and result[key] >= 0, key
    for key in LATENCIES:  # null only when a sample never got there, and then said so
        assert (result[key] is None and result["notes"]) or result[key] >= 0, key
    # Admitted is when the timeline says so: never after the pod, never before the stamp
    # of the cycle that decided it (admitted_at, the engine's start time for the work).
    if result["submit_pod_p95_s"] is not None:
        assert result["submit_admitted_p95_s"] <= result["submit_pod_p95_s"]
        assert result["admitted_pod_p95_s"] <= result["stamped_pod_p95_s"]
    assert result["nodes"] == scenario.nodes == Node.objects.count()
    assert result["gpus"] == scenario.nodes * scenario.gpus_per_node == Gpu.objects.count()
    assert result["workloads"] == scenario.running + scenario.pending
    arrivals = 1 + tiny.arrivals + tiny.samples + 2  # + the two into the settled state
    assert result["workloads_after"] == result["workloads"] + arrivals == Workload.objects.count()
    # Every row built is one a cycle can schedule: none was quarantined as unrunnable (the
    # scenario's GPU-memory requests were, for their 0 MiB of host memory).
    assert not CycleRun.objects.filter(quarantined__gt=0).exists()
    assert not WorkloadEvent.objects.filter(reason="InvalidRequest").exists()
    steps = result["steps"]
    # Every running workload got its pods in the first reconcile; the idle pass made none.
    assert steps["reconcile_initial"]["created"] >= result["running_built"] > 0
    assert steps["reconcile_idle"]["created"] == steps["reconcile_idle"]["deleted"] == 0
    assert steps["reconcile_quiet"]["created"] == steps["reconcile_quiet"]["deleted"] == 0
    # Evictions per idle cycle: the mean of the ten cycles' own counts.
    each = [row["evicted"] for row in steps["idle_cycles"]]
    assert result["evictions_idle_each"] == each and len(each) == 10
    assert result["evictions_idle_cycles"] == pytest.approx(sum(each) / 10, abs=1e-3)
    # Every eviction the cycles counted is a Preempted event on a workload.
    evicted = sum(CycleRun.objects.values_list("evicted", flat=True))
    assert WorkloadEvent.objects.filter(reason__startswith="Preempted:").count() == evicted
    idle = steps["idle_evictions"]
    assert sum(idle["reasons"].values()) == sum(each) >= idle["workloads"]
    assert result["evicted_twice_idle"] == idle["evicted_twice"] <= idle["workloads"]
    # Settling: cycles until a quiet one (nothing admitted, evicted or releasing), its
    # evictions counted as the idle ones are; the steady cycles come after it.
    settle = steps["settle"]
    rows = settle["cycles"]
    assert result["settle_cycles"] == len(rows) >= 1 and result["settled"] is True
    last = rows[-1]
    assert last["admitted"] == last["evicted"] == last["releasing_before"] == 0
    assert not any(r["evicted"] == r["admitted"] == r["releasing_before"] == 0 for r in rows[:-1])
    assert result["settle_evictions"] == sum(r["evicted"] for r in rows)
    assert sum(settle["evictions"]["reasons"].values()) == result["settle_evictions"]
    twice = settle["evictions"]["twice_examples"]
    assert result["settle_evicted_twice"] == settle["evictions"]["evicted_twice"] >= len(twice)
    assert all(sum(e.startswith("Preempted:") for e in w["events"]) >= 2 for w in twice)
    # The cycles' engine inputs were kept (the cold cycle's child first, then this
    # process's first cycle, then the settling ones): replayed, they decide as the cycles did.
    replayed = [c["evictions"] for c in replay(tmp_path)["cycles"]]
    # The engine alone from this process's first cycle: its first cycle decides as that one
    # did, and it settles (its own replay of what the portal does, issue 25).
    alone = evictions_replay.settle(tmp_path / "cycle-0002.pickle")
    assert alone["settled"] and alone["cycles"][0]["evictions"] == replayed[1]
    assert alone["cycles"][-1]["evictions"] == alone["cycles"][-1]["admissions"] == 0
    assert replayed[2 : 2 + len(rows)] == [r["evicted"] for r in rows]
    assert replayed[:2] == [
        steps["cycle_cold"]["evicted"],
        steps["cycle_first_in_process"]["evicted"],
    ]
    assert result["sql_per_cycle"] == steps["cycle_steady"]["sql"] > 0
    assert steps["cycle_cold"]["db_cpu_s"] is not None  # the server runs on this machine
    assert len(steps["lock_wait"]) == 2 and result["database"] == "postgresql"
    # The settled arrivals: every round's reconcile the kind of pass asked for, their CPU
    # the sum of their steps'.
    for key, full in (("arrival_settled", False), ("arrival_settled_full_pass", True)):
        arrival = steps[key]
        passes = [step["full"] for step in arrival["steps"] if step["step"] == "reconcile"]
        assert passes == [full] * arrival["rounds"] and arrival["rounds"] >= 1, key
        assert arrival["total_cpu_s"] == pytest.approx(
            sum(step["total_cpu_s"] for step in arrival["steps"]), abs=1e-3
        )
    assert result["arrival_cpu_s"] == steps["arrival_settled"]["total_cpu_s"]
