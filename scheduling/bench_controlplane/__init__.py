"""Benchmark of the whole control plane at scale: `manage.py bench_controlplane --json`.

It builds the engine bench's mix (scheduling/engine/bench.py, scaled) in the database
(state.py), then measures, first in a fresh process and then in steady state, what each
step costs (probe.py): CPU of this process and of its PostgreSQL backend, SQL statements,
wall time and peak RSS. The steps (steps.py), in order:

1. reconcile the built state (the running workloads' pods created);
2. a cold cycle, in a child process that keeps no engine state;
3. reconcile after that cycle, then with nothing to do;
4. the first cycle of this process (it rebuilds the kept state); then cycles, each
   reconciled, until one decides nothing (the built state is random, not one the scheduler
   would have reached: its higher-priority pending work owes preemptions, served a few
   searches a cycle); then cycles with nothing new;
5. inventory syncs with nothing changed and with 1 % of the nodes changed;
6. one arrival through the API (submit, cycle, reconcile), then 100;
7. submit -> admitted and submit -> pod created, through the API with eager Celery;
8. a cycle while an inventory sync holds the node rows: how long it waits for them;
9. ten cycles (each reconciled) with no arrivals, counting evictions;
10. one arrival into that settled state, from submit to its pod running (the targeted
    reconcile a long-running worker makes), then one more with full reconcile passes.

docs/controlplane.md describes the figures and holds the measured baseline.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from clusters.models import Cluster
from scheduling.bench_controlplane import probe, state, steps
from scheduling.engine.bench import load
from scheduling.models import ACTIVE_STATES, PodAllocation, Workload, WorkloadEvent

STEADY_CYCLES = 3
IDLE_CYCLES = 10
SETTLE_CYCLES = 40
EXAMPLES = 5  # workloads evicted twice whose events the record shows
LATENCY_PATH = (
    "Django test client POST /api/v1/workloads/ with Celery eager in this process: the "
    "submit's commit runs scheduling.tasks.run_cycle, whose commit runs "
    "clusters.tasks.reconcile_cluster into the simulated cluster; a workload not admitted "
    "by that chain gets further cycle+reconcile rounds at once (no beat period waited)."
)


class Record(dict[str, Any]):
    """The steps' figures; each also printed on stderr as soon as it is measured, so that
    a run stopped before its end still says what it found."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        print(f"{key}: {json.dumps(value)}", file=sys.stderr, flush=True)


def bench_run(scale_name: str) -> dict[str, Any]:
    """Build the state at this scale, measure every step, return the figures."""
    scale = state.SCALES[scale_name]
    notes: list[str] = []
    record = Record()
    load_before = load()
    with steps.tasks_muted():
        build_cost, built = probe.measure(lambda: state.state_build(scale))
        record["build"] = build_cost.as_dict()
        record["reconcile_initial"] = _reconcile_row(built.cluster)
        record["cycle_cold"] = cold_cycle_in_child()
        record["reconcile_after_cycle"] = _reconcile_row(built.cluster)
        record["reconcile_idle"] = _reconcile_row(built.cluster)
        # and once more: the pass before changed nothing either (a pass driven by changes
        # reads again, once, what the pass before it wrote)
        record["reconcile_quiet"] = _reconcile_row(built.cluster)
        record["cycle_first_in_process"] = steps.cycle().as_dict()
        record["reconcile_after_first_cycle"] = _reconcile_row(built.cluster)
        settled = _settle(record, built.cluster)
        _steady(record, built.cluster)
        _inventory(record, built.cluster)
        submitter = steps.Submitter(built.user, [p.name for p in built.projects])
        _arrivals(record, built.cluster, submitter, scale.arrivals)
    latency = _latencies(built.cluster, submitter, scale.samples, notes)
    record["latency"] = latency
    with steps.tasks_muted():
        record["lock_wait"] = [
            steps.lock_wait(built.cluster, share, f"lock-{share}") for share in (0, 0.01)
        ]
        evictions = _idle_cycles(record, built.cluster)
        # to a project the last cycle left below its fair share, first in it (as the
        # latency samples): work the cycle owes GPUs, whose pod can start
        submitter.projects = steps.projects_with_room() or submitter.projects
        for key, full in (("arrival_settled", False), ("arrival_settled_full_pass", True)):
            record[key] = steps.arrival(submitter, built.cluster, full=full).as_dict()
    return (
        _summary(scale_name, built, record, latency, evictions, notes)
        | settled
        | {
            "load_before": load_before,
            "load_after": load(),
        }
    )


def _reconcile_row(cluster: Cluster) -> dict[str, Any]:
    cost, result = steps.reconcile(cluster)
    return cost.as_dict() | {key: result.get(key) for key in steps.RECONCILE_KEYS}


def _steady(record: dict[str, Any], cluster: Cluster) -> None:
    """Cycles with nothing new, one after another (nothing reconciled between them, no
    submissions); the median one by total CPU stands for them."""
    rows = [steps.cycle().as_dict() for _ in range(STEADY_CYCLES)]
    rows.sort(key=lambda row: row["total_cpu_s"] or row["cpu_s"])
    record["cycle_steady"] = rows[len(rows) // 2] | {"runs": len(rows)}
    record["reconcile_after_steady"] = _reconcile_row(cluster)


def _inventory(record: dict[str, Any], cluster: Cluster) -> None:
    record["inventory_idle"] = steps.inventory_idle(cluster).as_dict()
    record["inventory_1pct"] = steps.inventory_changed(cluster, 0.01, "one-percent").as_dict()


def _arrivals(
    record: dict[str, Any], cluster: Cluster, submitter: steps.Submitter, many: int
) -> None:
    for count, key in ((1, "arrival_1"), (many, f"arrival_{many}")):
        submit_cost, _ = steps.submissions(submitter, count)
        cycle = steps.cycle()
        reconcile_cost, result = steps.reconcile(cluster)
        total = [submit_cost.total_cpu_s, cycle.cost.total_cpu_s, reconcile_cost.total_cpu_s]
        record[key] = {
            "arrivals": count,
            "submit": submit_cost.as_dict(),
            "cycle": cycle.as_dict(),
            "reconcile": reconcile_cost.as_dict() | {"created": result.get("created")},
            "total_cpu_s": None if None in total else round(sum(total), 4),  # type: ignore[arg-type]
        }


def _latencies(
    cluster: Cluster, submitter: steps.Submitter, samples: int, notes: list[str]
) -> dict[str, Any]:
    """Samples submitted to projects below their fair share, whose work the cycle owes
    GPUs (within two cycles, by the product's promise)."""
    roomy = steps.projects_with_room()
    if not roomy:
        notes.append("no project below its fair share: latency samples go to every project")
    submitter.projects, submitter.urgent = roomy or submitter.projects, True
    rows = [steps.latency_sample(submitter, cluster) for _ in range(samples)]
    admitted = [r.admitted_s for r in rows]
    pods = [r.pod_s for r in rows]
    between = [r.pod_s - r.admitted_s for r in rows if r.pod_s is not None and r.admitted_s]
    stamped = [r.pod_s - r.stamped_s for r in rows if r.pod_s is not None and r.stamped_s]
    missing = sum(1 for r in rows if r.pod_s is None)
    if missing:
        notes.append(
            f"{missing} of {samples} latency samples got no pod within 6 extra rounds: a "
            "percentile that falls on them is null"
        )
    return {
        "samples": samples,
        "path": LATENCY_PATH,
        "projects_below_fair_share": len(roomy),
        "extra_rounds": [r.rounds for r in rows],
        "submit_admitted_p50_s": _percentile(admitted, 50),
        "submit_admitted_p95_s": _percentile(admitted, 95),
        "submit_pod_p50_s": _percentile(pods, 50),
        "submit_pod_p95_s": _percentile(pods, 95),
        "admitted_to_pod_p95_s": _percentile(between, 95),
        "stamped_to_pod_p95_s": _percentile(stamped, 95),
    }


def _percentile(values: list[float | None], pct: int) -> float | None:
    """Nearest rank, a missing value (never reached) counting as longer than any; None
    when the rank falls on one, or without values."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    found = ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]
    return None if found is None else round(found, 4)


def _idle_cycles(record: dict[str, Any], cluster: Cluster) -> list[int]:
    """Cycles with no arrivals, each followed by a reconcile: evictions of each. Also how
    many workloads they evicted more than once, and why they evicted (the events' reasons):
    evictions that go on serving work that arrived before them (a reclaim for each of a
    burst's jobs, a few searches a cycle) differ from work evicted back and forth."""
    rows, evicted = _reconciled_cycles(cluster, IDLE_CYCLES, "idle cycle")
    record["idle_cycles"], record["idle_evictions"] = rows, evicted
    return [row["evicted"] for row in rows]


def _settle(record: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """Cycles, each reconciled, until one admits and evicts nothing with nothing releasing
    before it (at most SETTLE_CYCLES): the built state's owed preemptions served, so that
    the steps after it measure a state the scheduler could have reached. No arrivals come
    in meanwhile: a workload evicted twice here is evicted back and forth."""
    rows, evicted = _reconciled_cycles(cluster, SETTLE_CYCLES, "settling cycle", quiet=True)
    record["settle"] = {"cycles": rows, "evictions": evicted}
    return {
        "settle_cycles": len(rows),
        "settled": _quiet(rows[-1]),
        "settle_evictions": sum(row["evicted"] for row in rows),
        "settle_evicted_twice": evicted["evicted_twice"],
        "settle_cpu_s": round(sum(row["total_cpu_s"] or 0 for row in rows), 3),
    }


def _quiet(row: dict[str, Any]) -> bool:
    return row["admitted"] == row["evicted"] == row["releasing_before"] == 0


def _reconciled_cycles(
    cluster: Cluster, limit: int, label: str, *, quiet: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Up to `limit` cycles, each followed by a reconcile (with `quiet`, until a quiet one),
    and what the cycles evicted: workloads, those evicted twice, the events' reasons."""
    first_event = WorkloadEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    rows: list[dict[str, Any]] = []
    while len(rows) < limit and not (quiet and rows and _quiet(rows[-1])):
        # Workloads whose pods are still going: while any is, a cycle evicts nothing
        # (scheduling.cycle._config), so a row with some is no evidence of settling.
        releasing = _releasing()
        rows.append(steps.cycle().as_dict() | {"releasing_before": releasing})
        print(f"{label} {len(rows)}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
        steps.reconcile(cluster)
    events = WorkloadEvent.objects.filter(
        pk__gt=first_event or 0, reason__startswith="Preempted:"
    ).values_list("workload_id", "reason")
    per_workload = Counter(wid for wid, _ in events)
    twice = sorted(wid for wid, n in per_workload.items() if n > 1)
    return rows, {
        "workloads": len(per_workload),
        "evicted_twice": len(twice),
        "reasons": dict(Counter(reason for _, reason in events)),
        "twice_examples": _histories(twice[:EXAMPLES], first_event or 0),
    }


def _histories(wids: list[int], after: int) -> list[dict[str, Any]]:
    """What happened to each workload since event `after`: for a reader to tell work
    evicted back and forth from work evicted again for a new reason."""
    found = []
    for workload in Workload.objects.filter(pk__in=wids).select_related("project"):
        events = workload.events.filter(pk__gt=after).order_by("pk")
        found.append(
            {
                "workload": f"{workload.project.name}/{workload.name}",
                "priority": workload.priority,
                "gpus": float(workload.gpus),
                "events": [f"{e.reason}: {e.message}" for e in events],
            }
        )
    return found


def _releasing() -> int:
    return (
        PodAllocation.objects.exclude(workload__state__in=ACTIVE_STATES)
        .values("workload_id")
        .distinct()
        .count()
    )


def _median_total(rows: list[dict[str, Any]]) -> float | None:
    totals = [row["total_cpu_s"] for row in rows]
    return None if None in totals else round(statistics.median(totals), 4)


def cold_cycle_in_child() -> dict[str, Any]:
    """`manage.py bench_controlplane --child-cold-cycle` against this database: a process
    that has run no cycle, so it keeps no engine state and no warm caches."""
    env = {**os.environ, "DATABASE_URL": database_url()}
    manage = Path(settings.BASE_DIR) / "manage.py"
    done = subprocess.run(
        [sys.executable, str(manage), "bench_controlplane", "--child-cold-cycle"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the cold cycle's process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_cold_cycle() -> dict[str, Any]:
    """In the child: one cycle, measured."""
    with steps.tasks_muted():
        return steps.cycle().as_dict()


def database_url() -> str:
    """The database this process uses (the test database too), as a DATABASE_URL."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _summary(
    scale_name: str,
    built: state.Built,
    record: dict[str, Any],
    latency: dict[str, Any],
    evictions: list[int],
    notes: list[str],
) -> dict[str, Any]:
    """The comparable keys first, then every step's figures."""
    steady, cold = record["cycle_steady"], record["cycle_cold"]
    if steady["db_cpu_s"] is None:
        notes.append("PostgreSQL backend CPU unreadable (server not on this machine?)")
    return {
        "scale": scale_name,
        "nodes": built.nodes,
        "gpus": sum(g["count"] * g["gpus"] for g in built.cluster.config["groups"]),
        "workloads": built.workloads,
        "running_built": built.running,
        "workloads_after": Workload.objects.count(),
        "cycle_cold_cpu_s": cold["total_cpu_s"],
        "cycle_steady_cpu_s": steady["total_cpu_s"],
        "arrival_cpu_s": record["arrival_settled"]["total_cpu_s"],
        "arrival_full_pass_cpu_s": record["arrival_settled_full_pass"]["total_cpu_s"],
        "arrival_unsettled_cpu_s": record["arrival_1"]["total_cpu_s"],
        "reconcile_idle_cpu_s": record["reconcile_idle"]["total_cpu_s"],
        "reconcile_quiet_cpu_s": record["reconcile_quiet"]["total_cpu_s"],
        "reconcile_after_cycle_cpu_s": record["reconcile_after_cycle"]["total_cpu_s"],
        "inventory_idle_cpu_s": record["inventory_idle"]["total_cpu_s"],
        "max_lock_wait_s": max(w["lock_wait_s"] for w in record["lock_wait"]),
        "submit_admitted_p95_s": latency["submit_admitted_p95_s"],
        "admitted_pod_p95_s": latency["admitted_to_pod_p95_s"],
        "stamped_pod_p95_s": latency["stamped_to_pod_p95_s"],
        "submit_pod_p95_s": latency["submit_pod_p95_s"],
        "cycle_idle_after_reconcile_cpu_s": _median_total(record["idle_cycles"]),
        "evictions_idle_cycles": round(statistics.mean(evictions), 3),
        "evictions_idle_each": evictions,
        "evicted_twice_idle": record["idle_evictions"]["evicted_twice"],
        "sql_per_cycle": steady["sql"],
        "peak_rss_mb": round(max(probe.peak_rss_mb(), cold["peak_rss_mb"]), 1),
        "submit_admitted_p50_s": latency["submit_admitted_p50_s"],
        "submit_pod_p50_s": latency["submit_pod_p50_s"],
        "latency": latency,
        "steps": {key: value for key, value in record.items() if key != "latency"},
        "database": connection.vendor,
        "notes": notes,
    }
