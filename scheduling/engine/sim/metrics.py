"""Time integrals gathered during a replay, and the statistics the summary reports.

GPU allocation and fairness are measured over the trace's submission window [0, last
submit]: after it the load only drains, and every policy eventually hands every team all
the GPU-time it asked for, which would hide who waited. A team's entitlement at a moment is
its weighted max-min fair share of the cluster given what it asks for then (its deserved
quota first, the rest split by over-quota weight, never past its demand or limit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from scheduling.engine.sim.specs import QuotaSpec, TeamQuota

EPSILON = 1e-9


def water_fill(
    capacity: float,
    demand: Mapping[str, float],
    deserved: Mapping[str, float],
    weight: Mapping[str, float],
    limit: Mapping[str, float | None],
) -> dict[str, float]:
    """Deserved quota first (up to demand), then the rest by weight, capped by demand/limit."""
    caps = {}
    for team, wanted in demand.items():
        cap = limit.get(team)
        caps[team] = wanted if cap is None else min(wanted, cap)
    share = {team: min(caps[team], deserved.get(team, 0.0)) for team in demand}
    left = capacity - sum(share.values())
    hungry = {team for team in demand if caps[team] - share[team] > EPSILON}
    while left > EPSILON and hungry:
        total_weight = sum(weight.get(team, 1.0) for team in hungry)
        step = {team: left * weight.get(team, 1.0) / total_weight for team in hungry}
        satisfied = {team for team in hungry if share[team] + step[team] >= caps[team] - EPSILON}
        if not satisfied:
            for team in hungry:
                share[team] += step[team]
            break
        for team in sorted(satisfied):
            left -= caps[team] - share[team]
            share[team] = caps[team]
        hungry -= satisfied
    return share


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when all values are equal, 1/n when one value takes all."""
    if not values:
        return None
    squares = sum(value * value for value in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (fraction 0.95 gives the p95); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    return sum(values) / len(values) if values else None


class Recorder:
    """Integrates allocation and entitlement over virtual time as the replay moves on."""

    def __init__(self, capacity: float, quotas: QuotaSpec, window_end: float) -> None:
        self.capacity = capacity
        self.window_end = window_end
        self.deserved = {team: quotas.deserved(team) for team in quotas.quotas}
        self.weight = {t: sum(q.weight for q in p.values()) for t, p in quotas.quotas.items()}
        self.limit = {t: _limit_sum(p.values()) for t, p in quotas.quotas.items()}
        self.demand: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.received: dict[str, float] = {}  # GPU-seconds inside the window
        self.entitled: dict[str, float] = {}
        self.allocated_window = 0.0  # GPU-seconds inside the window, all teams
        self.allocated_total = 0.0
        self.held_total: dict[str, float] = {}  # GPU-seconds per team over the whole run
        self.last = 0.0
        self._share: dict[str, float] | None = None

    def demand_changed(self, team: str, gpus: float) -> None:
        """A job of the team was submitted (+) or ended (-)."""
        self.demand[team] = self.demand.get(team, 0.0) + gpus
        self._share = None

    def allocation_changed(self, team: str, gpus: float) -> None:
        """A job of the team started (+) or stopped (-)."""
        self.allocated[team] = self.allocated.get(team, 0.0) + gpus

    def advance(self, time: float) -> None:
        """Integrate the current state from the last time up to `time`."""
        if time <= self.last:
            return
        inside = max(0.0, min(time, self.window_end) - self.last)
        if inside > 0:
            share = self._fair_share()
            for team, gpus in self.allocated.items():
                self.received[team] = self.received.get(team, 0.0) + gpus * inside
                self.allocated_window += gpus * inside
            for team, gpus in share.items():
                self.entitled[team] = self.entitled.get(team, 0.0) + gpus * inside
        elapsed = time - self.last
        for team, gpus in self.allocated.items():
            self.held_total[team] = self.held_total.get(team, 0.0) + gpus * elapsed
        self.allocated_total += sum(self.allocated.values()) * elapsed
        self.last = time

    def finish(self, time: float) -> None:
        """Close the integrals at the end of the replay."""
        self.advance(time)

    def _fair_share(self) -> dict[str, float]:
        if self._share is None:
            demand = {team: gpus for team, gpus in self.demand.items() if gpus > EPSILON}
            self._share = water_fill(self.capacity, demand, self.deserved, self.weight, self.limit)
        return self._share


def _limit_sum(quotas: Iterable[TeamQuota]) -> float | None:
    limits = [q.limit for q in quotas]
    if not limits or any(limit is None for limit in limits):
        return None
    return sum(limits)
