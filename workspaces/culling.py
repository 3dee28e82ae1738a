"""Idle culling: warn, then stop, workspaces nobody uses.

A workspace is idle when its GPUs stayed under the policy's utilisation threshold and
Jupyter saw no kernel, terminal or request activity (`/api/status` last_activity) for the
policy's window. A busy or starting kernel (a long training cell, a kernel still coming up)
is never idle, whatever the clock says. A tool that does not answer (never came up, or
hung) with quiet GPUs is idle from the last time it answered, or from its start: it holds
GPUs nobody can use, so it is warned, then stopped, on the same clock. Time comes in as
`now`, so tests and the beat task decide it, not the wall clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from clusters.metrics.models import GpuSample
from portal.audit import audit_log
from portal.errors import ValidationFailed
from portal.tolerant import unreadable_columns
from scheduling.lifecycle import workload_event
from scheduling.models import WorkloadState
from scheduling.services import workload_stop
from workspaces.jupyter import JupyterActivity, tool_activity
from workspaces.models import IdlePolicy, IdleState, Workspace
from workspaces.selectors import idle_policy_for

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CullDecision:
    action: str  # keep | warn | stop | skip
    reason: str
    idle_minutes: float = 0.0


def idle_decision(
    *,
    now: datetime,
    policy: IdlePolicy,
    activity: JupyterActivity | None,
    active_since: datetime,
    gpu_busy: bool,
    warned: bool,
    warned_at: datetime | None = None,
    answered_at: datetime | None = None,
) -> CullDecision:
    """What to do with one running workspace; pure, so each rule is tested alone.

    `active_since` is the latest of: the pod's start, the last "keep running" click, the
    last GPU sample over the threshold (the idle clock starts when its GPUs went quiet).
    `activity` None: the tool did not answer; `answered_at` is when it last did.
    Nothing is stopped without a warning first, and never sooner than the policy's gap
    between warning and stopping after that warning: a workspace found idle for longer
    than the stop time (the culler was down, the policy just shortened) is warned first.
    """
    if activity is not None and activity.busy_kernels:
        return CullDecision("keep", f"{activity.busy_kernels} kernel(s) busy or starting.")
    if gpu_busy:
        return CullDecision("keep", "Its GPUs are in use.")
    seen = answered_at if activity is None else activity.last_activity
    last = max(t for t in (seen, active_since) if t is not None)
    idle_min = max(0.0, (now - last).total_seconds() / 60)
    reason = f"Idle for {idle_min:.0f} minutes."
    if activity is None:
        reason = f"The tool has not answered for {idle_min:.0f} minutes."
    if idle_min < policy.warn_after_min:
        return CullDecision("keep", "In use.", idle_min)
    if not warned:
        return CullDecision("warn", reason, idle_min)
    grace = timedelta(minutes=policy.stop_after_min - policy.warn_after_min)
    due = idle_min >= policy.stop_after_min and (warned_at is None or now - warned_at >= grace)
    return CullDecision("stop" if due else "keep", reason, idle_min)


def gpu_busy(workspace: Workspace, *, now: datetime, policy: IdlePolicy) -> bool:
    """Any sample of its GPUs at or over the threshold within the warning window.

    Without samples (CPU-only, no agent) only Jupyter's activity counts.
    """
    since = now - timedelta(minutes=policy.warn_after_min)
    return GpuSample.objects.filter(
        workload_id=workspace.workload_id,
        ts__gte=since,
        ts__lte=now,
        util_pct__gte=policy.gpu_util_threshold_pct,
    ).exists()


def gpu_last_busy(workspace: Workspace, *, now: datetime, policy: IdlePolicy) -> datetime | None:
    """When its GPUs were last at or over the threshold, looking back as far as the stop
    time (anything older leaves the workspace idle long enough either way)."""
    return (
        GpuSample.objects.filter(
            workload_id=workspace.workload_id,
            ts__gte=now - timedelta(minutes=policy.stop_after_min),
            ts__lte=now,
            util_pct__gte=policy.gpu_util_threshold_pct,
        )
        .order_by("-ts")
        .values_list("ts", flat=True)
        .first()
    )


def workspace_cull_check(workspace: Workspace, *, now: datetime) -> CullDecision:
    """Probe one running workspace and act on the decision."""
    policy = idle_policy_for(workspace.workload.project)
    if policy is None:
        return CullDecision("skip", "No idle policy applies.")
    if unread := unreadable_columns(policy) + unreadable_columns(workspace):
        # Another writer's text in a number or date (portal.tolerant): its stand-in would
        # read as "idle for 56 years" or "stop after -1 minutes". Left alone, said why.
        reason = f"Not checked: {', '.join(unread)} cannot be read in the database."
        log.warning("idle check of workspace %s: %s", workspace.workload_id, reason)
        return CullDecision("skip", reason)
    activity = tool_activity(workspace)
    workload = workspace.workload
    starts = [
        t
        for t in (
            workload.started_at,
            workload.admitted_at,
            workspace.kept_alive_at,
            gpu_last_busy(workspace, now=now, policy=policy),
        )
        if t
    ]
    decision = idle_decision(
        now=now,
        policy=policy,
        activity=activity,
        active_since=max(starts) if starts else now,
        gpu_busy=gpu_busy(workspace, now=now, policy=policy),
        warned=workspace.idle_state == IdleState.WARNED,
        warned_at=workspace.warned_at,
        answered_at=workspace.answered_at,
    )
    _apply(workspace, decision, policy, activity, now)
    return decision


def _apply(
    workspace: Workspace,
    decision: CullDecision,
    policy: IdlePolicy,
    activity: JupyterActivity | None,
    now: datetime,
) -> None:
    with transaction.atomic():
        workspace.checked_at = now
        if activity is not None:
            workspace.answered_at = now
            if activity.last_activity is not None:
                workspace.last_activity_at = activity.last_activity
        if decision.action == "warn":
            _warn(workspace, decision, policy, now)
        elif decision.action == "stop":
            _stop(workspace, decision)
        elif decision.action == "keep" and decision.idle_minutes < policy.warn_after_min:
            # Used again after a warning: the warning no longer holds.
            workspace.idle_state, workspace.warned_at = IdleState.ACTIVE, None
        workspace.save()


def _warn(workspace: Workspace, decision: CullDecision, policy: IdlePolicy, now: datetime) -> None:
    workspace.idle_state, workspace.warned_at = IdleState.WARNED, now
    # The stop comes when it has been idle the stop time, and the policy's gap after this
    # warning, whichever is later.
    stop_at = now + timedelta(
        minutes=max(
            policy.stop_after_min - decision.idle_minutes,
            policy.stop_after_min - policy.warn_after_min,
        )
    )
    workload_event(
        workspace.workload,
        type="warning",
        reason="IdleWarning",
        message=(
            f"{decision.reason} It will be stopped after {policy.stop_after_min} idle minutes "
            f"(not before {stop_at:%H:%M} UTC) unless someone keeps it running."
        ),
    )


def _stop(workspace: Workspace, decision: CullDecision) -> None:
    """Stopped by the system (actor None) through the one stop service, so a cull is like
    any stop: events, audit row with the reason, reconciliation and a cycle on commit."""
    workload = workspace.workload
    try:
        workload_stop(actor=None, workload=workload, reason="IdleCulled", message=decision.reason)
    except ValidationFailed:  # it finished on its own since it was read: nothing to cull
        log.info("workspace %s finished before it could be culled", workload.pk)
        return
    workspace.idle_state = IdleState.CULLED
    audit_log(
        actor=None,
        action="workspace.cull",
        obj=workspace,
        after={"reason": decision.reason},
        department=workload.project.department,
    )


def workspaces_cull(*, now: datetime | None = None) -> dict[str, int]:
    """Check every running workspace once; returns how many got each action."""
    now = now or timezone.now()
    counts: dict[str, int] = {}
    running = Workspace.objects.filter(workload__state=WorkloadState.RUNNING).select_related(
        "workload__project__department"
    )
    for workspace in running:
        try:
            action = workspace_cull_check(workspace, now=now).action
        except Exception:  # one broken workspace must not stop the others being checked
            log.exception("idle check of workspace %s failed", workspace.workload_id)
            action = "error"
        counts[action] = counts.get(action, 0) + 1
    return counts
