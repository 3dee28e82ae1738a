"""summary.json and workloads.csv from a finished replay (formats in docs/simulator.md)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scheduling.engine.mig_profiles import COMPUTE_SLICES
from scheduling.engine.sim.baseline import PrivateResult
from scheduling.engine.sim.loop import JobRun, Simulation
from scheduling.engine.sim.metrics import jain_index, mean, percentile

HOUR = 3600.0
WORKLOAD_COLUMNS = [
    "id",
    "team",
    "submit",
    "start",
    "end",
    "pods",
    "gpus",
    "nodes",
    "preemptions",
    "queued_s",
    "lost_gpu_hours",
]


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def delay_stats(runs: Iterable[JobRun], end: float) -> dict[str, Any]:
    """Mean and p95 of queueing delay (all pending time) and completion time (JCT).

    A job that never started counts its wait up to the end of the replay, so a policy
    cannot look good by never starting the jobs it cannot serve; JCT covers finished jobs.
    """
    runs = list(runs)
    waits = [run.waited(end) for run in runs]
    jcts = [run.end - run.job.submit for run in runs if run.end is not None]
    return {
        "jobs": len(runs),
        "never_started": sum(1 for run in runs if run.first_start is None),
        "finished": len(jcts),
        "queueing_delay_s": {
            "mean": _rounded(mean(waits)),
            "p95": _rounded(percentile(waits, 0.95)),
        },
        "jct_s": {"mean": _rounded(mean(jcts)), "p95": _rounded(percentile(jcts, 0.95))},
        "preemptions": sum(run.preemptions for run in runs),
        "gpu_hours_lost_to_preemption": round(sum(run.lost_gpu_s for run in runs) / HOUR, 2),
    }


def _team_entry(
    sim: Simulation, team: str, runs: list[JobRun], private: PrivateResult | None
) -> dict[str, Any]:
    rec = sim.recorder
    entry = delay_stats(runs, sim.now)
    received, entitled = rec.received.get(team, 0.0), rec.entitled.get(team, 0.0)
    entry.update(
        quota_gpus=sim.quotas.deserved(team),
        received_gpu_hours=round(received / HOUR, 2),
        entitled_gpu_hours=round(entitled / HOUR, 2),
        received_over_entitled=round(received / entitled, 4) if entitled > 0 else None,
    )
    if private is not None:
        own = private.mean_queueing_s
        shared = entry["queueing_delay_s"]["mean"]
        extra = shared - own if shared is not None and own is not None else None
        entry["private_cluster"] = {
            "gpus": private.gpus,
            "grown_to_fit_largest_job": private.grown,
            "queueing_delay_s_mean": _rounded(own),
        }
        entry["extra_queueing_s"] = _rounded(extra)
        compared = [run.waited(sim.now) for run in runs if run.job.id in private.quota_waits]
        alone = mean(list(private.quota_waits.values()))
        together = mean(compared)
        entry["private_cluster"]["within_quota"] = {
            "gpus": private.quota_gpus,
            "jobs_compared": len(compared),
            "jobs_larger_than_quota": private.larger_than_quota,
            "queueing_delay_s_mean": _rounded(alone),
            "shared_queueing_delay_s_mean": _rounded(together),
        }
        within = together - alone if together is not None and alone is not None else None
        entry["extra_queueing_within_quota_s"] = _rounded(within)
    return entry


def summarize(
    sim: Simulation, private: Mapping[str, PrivateResult], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The whole summary: overall figures, per-team figures and the fairness measures."""
    by_team: dict[str, list[JobRun]] = {}
    for run in sim.runs.values():
        by_team.setdefault(run.job.team, []).append(run)
    teams = {t: _team_entry(sim, t, runs, private.get(t)) for t, runs in sorted(by_team.items())}
    ratios = [e["received_over_entitled"] for e in teams.values()]
    worst, worst_extra = _worst(teams, "extra_queueing_s")
    worst_within, worst_within_extra = _worst(teams, "extra_queueing_within_quota_s")
    rec = sim.recorder
    window = rec.window_end
    summary: dict[str, Any] = dict(extra)
    summary.update(
        nodes=len(sim.cluster.nodes),
        gpus=sim.cluster.capacity,
        window_s=window,
        end_s=sim.now,
        cycles=sim.cycles,
        gpu_allocation=_ratio(rec.allocated_window, sim.cluster.capacity * window),
        gpu_allocation_whole_run=_ratio(rec.allocated_total, sim.cluster.capacity * sim.now),
        evictions_by_reason=dict(sorted(sim.eviction_counts.items())),
        elastic_jobs=sum(1 for run in sim.runs.values() if run.job.elastic),
        resizes=sum(run.resizes for run in sim.runs.values()),
        gpu_hours_lost_by_reason={
            reason: round(seconds / HOUR, 2)
            for reason, seconds in sorted(sim.lost_gpu_s_by_reason.items())
        },
        fairness_jain=_rounded(jain_index([r for r in ratios if r is not None]), 4),
        worst_team=worst,
        worst_team_extra_queueing_s=worst_extra,
        worst_team_within_quota=worst_within,
        worst_team_extra_queueing_within_quota_s=worst_within_extra,
    )
    summary.update(delay_stats(sim.runs.values(), sim.now))
    if sim.cluster.mig.gpus:
        summary["mig"] = mig_summary(sim)
    summary["teams"] = teams
    return summary


def mig_summary(sim: Simulation) -> dict[str, Any]:
    """MIG devices over the replay: the share of their compute slices held, and what
    happened to instances (cut, reused, destroyed; placements that repartitioned)."""
    mig = sim.cluster.mig
    return {
        "layout": sim.config.mig_layout,
        "gpus": mig.gpus,
        "slice_utilization": _ratio(
            mig.window_slice_seconds, mig.gpus * COMPUTE_SLICES * sim.recorder.window_end
        ),
        "slice_utilization_whole_run": _ratio(
            mig.slice_seconds, mig.gpus * COMPUTE_SLICES * sim.now
        ),
        "instances_created": mig.created,
        "instances_reused": mig.reused,
        "instances_destroyed": mig.destroyed,
        "repartitions": mig.repartitions,
        "jobs": sum(1 for run in sim.runs.values() if run.job.mig_profile),
        "jobs_never_started": sum(
            1 for run in sim.runs.values() if run.job.mig_profile and run.first_start is None
        ),
    }


def _worst(teams: Mapping[str, Mapping[str, Any]], key: str) -> tuple[str | None, Any]:
    """The team with the largest value of `key` (ties: the last id), and that value."""
    values = {team: entry[key] for team, entry in teams.items() if entry.get(key) is not None}
    worst = max(values, key=lambda team: (values[team], team), default=None)
    return worst, values.get(worst) if worst else None


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def write_outputs(sim: Simulation, summary: Mapping[str, Any], out: Path) -> None:
    """summary.json and workloads.csv into `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with (out / "workloads.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(WORKLOAD_COLUMNS)
        for run in sorted(sim.runs.values(), key=lambda r: (r.job.submit, r.job.id)):
            writer.writerow(_workload_row(run, sim.now))


def _workload_row(run: JobRun, end: float) -> list[Any]:
    job = run.job
    return [
        job.id,
        job.team,
        round(job.submit, 3),
        "" if run.first_start is None else round(run.first_start, 3),
        "" if run.end is None else round(run.end, 3),
        job.pods,
        job.gpus,
        "|".join(run.nodes),
        run.preemptions,
        round(run.waited(end), 3),
        round(run.lost_gpu_s / HOUR, 4),
    ]
