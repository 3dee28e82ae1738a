"""An HPO sweep's own state follows its trials: running while any trial runs, finished
when all are, succeeded if any trial succeeded (a sweep looks for the best trial)."""

from __future__ import annotations

from django.db.models import Count, Q

from scheduling.lifecycle import workload_transition
from scheduling.models import (
    ACTIVE_STATES,
    FINISHED_STATES,
    Workload,
    WorkloadKind,
    WorkloadState,
)

S = WorkloadState


def sweeps_update() -> int:
    """Move unfinished sweeps along with their trials; how many changed."""
    sweeps = (
        Workload.objects.filter(kind=WorkloadKind.HPO)
        .exclude(state__in=FINISHED_STATES)
        .annotate(
            total=Count("children"),
            active=Count("children", filter=Q(children__state__in=ACTIVE_STATES)),
            finished=Count("children", filter=Q(children__state__in=FINISHED_STATES)),
            succeeded=Count("children", filter=Q(children__state=S.SUCCEEDED)),
        )
    )
    return sum(_sweep_update(sweep) for sweep in sweeps)


def _sweep_update(sweep: Workload) -> bool:
    started = sweep.active or sweep.finished
    if sweep.state == S.PENDING and started:
        workload_transition(sweep, S.ADMITTED, reason="TrialsStarted", pending_reason="")
    if sweep.state == S.ADMITTED and started:
        workload_transition(sweep, S.RUNNING, reason="TrialsRunning", message="")
    if sweep.total and sweep.finished == sweep.total and sweep.state == S.RUNNING:
        outcome = S.SUCCEEDED if sweep.succeeded else S.FAILED
        workload_transition(
            sweep,
            outcome,
            reason="TrialsFinished",
            message=f"{sweep.succeeded} of {sweep.total} trials succeeded.",
        )
    return bool(started)
