"""The idle rules alone: no database, no Jupyter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workspaces.culling import idle_decision
from workspaces.jupyter import JupyterActivity, activity_from
from workspaces.models import IdlePolicy

NOON = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
POLICY = IdlePolicy(warn_after_min=30, stop_after_min=60)


def decide(*, idle_min: float, busy: int = 0, gpu_busy: bool = False, warned: bool = False,
           active_since: datetime | None = None, answers: bool = True) -> str:  # fmt: skip
    activity = JupyterActivity(NOON - timedelta(minutes=idle_min), kernels=1, busy_kernels=busy)
    return idle_decision(
        now=NOON, policy=POLICY, activity=activity if answers else None,
        active_since=active_since or NOON - timedelta(days=1), gpu_busy=gpu_busy, warned=warned,
    ).action  # fmt: skip


def test_a_recently_used_workspace_is_kept():
    assert decide(idle_min=29) == "keep"


def test_an_idle_workspace_is_warned_once_after_the_warning_window():
    assert decide(idle_min=30) == "warn"
    assert decide(idle_min=45, warned=True) == "keep"


def test_an_idle_workspace_is_stopped_after_the_stop_window():
    assert decide(idle_min=60, warned=True) == "stop"


def test_a_busy_kernel_is_never_culled_however_long_the_silence():
    assert decide(idle_min=10_000, busy=1) == "keep"


def test_busy_gpus_keep_a_workspace_without_jupyter_activity():
    assert decide(idle_min=10_000, gpu_busy=True) == "keep"


def test_the_idle_clock_starts_at_the_latest_keep_running_click():
    assert decide(idle_min=10_000, active_since=NOON - timedelta(minutes=5)) == "keep"


def test_a_tool_that_never_answered_is_idle_from_its_start():
    started = NOON - timedelta(minutes=30)
    decision = idle_decision(
        now=NOON, policy=POLICY, activity=None, active_since=started, gpu_busy=False,
        warned=False,
    )  # fmt: skip
    assert (decision.action, decision.reason) == (
        "warn",
        "The tool has not answered for 30 minutes.",
    )
    assert decide(idle_min=0, answers=False, active_since=NOON - timedelta(minutes=29)) == "keep"


def test_a_tool_that_stopped_answering_is_idle_from_its_last_answer():
    def silent(answered_min_ago: int, **extra) -> str:
        return idle_decision(
            now=NOON, policy=POLICY, activity=None, active_since=NOON - timedelta(days=1),
            gpu_busy=False, answered_at=NOON - timedelta(minutes=answered_min_ago), **extra,
        ).action  # fmt: skip

    assert silent(5, warned=False) == "keep"  # a restart, a slow moment: not yet
    assert silent(30, warned=False) == "warn"
    assert silent(60, warned=True, warned_at=NOON - timedelta(minutes=30)) == "stop"


def test_a_silent_tool_whose_gpus_work_is_kept():
    assert decide(idle_min=10_000, answers=False, gpu_busy=True) == "keep"


def test_a_starting_kernel_counts_as_active_and_is_never_culled():
    activity = activity_from(
        {"last_activity": "2026-11-20T02:00:00.000000Z"},
        [{"execution_state": "idle"}, {"execution_state": "starting"}],
    )
    assert (activity.kernels, activity.busy_kernels) == (2, 1)
    decision = idle_decision(
        now=NOON, policy=POLICY, activity=activity, active_since=NOON - timedelta(days=1),
        gpu_busy=False, warned=True,
    )  # fmt: skip
    assert (decision.action, decision.reason) == ("keep", "1 kernel(s) busy or starting.")


def test_idle_kernels_and_jupyters_last_activity_are_read_as_such():
    activity = activity_from(
        {"last_activity": "2026-11-20T11:20:00Z"}, [{"execution_state": "idle"}]
    )
    assert activity == JupyterActivity(NOON - timedelta(minutes=40), kernels=1, busy_kernels=0)
    assert decide_with(activity) == "warn"


def decide_with(activity: JupyterActivity) -> str:
    return idle_decision(
        now=NOON, policy=POLICY, activity=activity, active_since=NOON - timedelta(days=1),
        gpu_busy=False, warned=False,
    ).action  # fmt: skip


def test_a_workspace_found_idle_past_the_stop_time_is_warned_before_it_is_stopped():
    assert decide(idle_min=10_000, warned=False) == "warn"


def test_a_warned_workspace_is_stopped_no_sooner_than_the_policys_gap_after_its_warning():
    def stop_or_keep(warned_min_ago: int) -> str:
        activity = JupyterActivity(NOON - timedelta(days=1), kernels=1, busy_kernels=0)
        return idle_decision(
            now=NOON, policy=POLICY, activity=activity, active_since=NOON - timedelta(days=1),
            gpu_busy=False, warned=True, warned_at=NOON - timedelta(minutes=warned_min_ago),
        ).action  # fmt: skip

    # Warn at 30 idle minutes, stop at 60: a warning always leaves 30 minutes to react.
    assert stop_or_keep(warned_min_ago=29) == "keep"
    assert stop_or_keep(warned_min_ago=30) == "stop"
