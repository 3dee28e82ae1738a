"""Per-team extra queueing as a PNG: one bar per team and policy (matplotlib, no screen).

Two panels: against a private cluster of exactly the team's quota over the jobs that fit
on it (the sharing incentive a guaranteed quota can keep), and against the historical
private cluster grown to fit the team's largest job. Bars below zero: the team waited
less than it would have alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

PANELS = (
    ("extra_queueing_within_quota_s", "vs. a private cluster of its quota (jobs that fit)"),
    ("extra_queueing_s", "vs. a private cluster grown to fit its largest job"),
)


def plot_extra_queueing(runs: Mapping[str, Mapping[str, Any]], path: Path, title: str) -> None:
    """Write the PNG for `runs` (label -> summary.json contents) to `path`."""
    import matplotlib  # noqa: PLC0415 - heavy, and only this command draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    teams = sorted({team for summary in runs.values() for team in summary.get("teams", {})})
    if not teams:
        raise ValueError("no per-team figures to plot (run with the private baselines)")
    figure, axes = plt.subplots(len(PANELS), 1, figsize=(11, 7.5), sharex=True)
    width = 0.8 / max(len(runs), 1)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        for i, (name, summary) in enumerate(runs.items()):
            values = [_hours(summary["teams"].get(team, {}).get(key)) for team in teams]
            xs = [t + (i - (len(runs) - 1) / 2) * width for t in range(len(teams))]
            ax.bar(xs, values, width, label=name)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel("extra queueing (h)")
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    axes[-1].set_xticks(range(len(teams)), teams, rotation=45, ha="right")
    axes[-1].set_xlabel("team")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _hours(seconds: float | None) -> float:
    return 0.0 if seconds is None else seconds / 3600.0
