"""Past GPU usage per team and pool, for the engine's time-based fairness.

The replay's recorder integrates exactly what each team held; at each cycle the GPU-seconds
added since the last cycle go into hourly buckets, split between pools in proportion to
what the team holds in each pool then (exact on one pool). One record per cycle would make
the history, and the engine's decay over it, grow with every cycle. Buckets older than
`keep_half_lives` half-lives weigh less than 0.1 % and are dropped.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scheduling.engine.types import UsageRecord

if TYPE_CHECKING:
    from scheduling.engine.sim.loop import Simulation


class UsageHistory:
    """GPU-seconds per (team, pool, bucket), added cycle by cycle."""

    def __init__(
        self, half_life_s: float, bucket_s: float = 3600.0, keep_half_lives: int = 10
    ) -> None:
        self.bucket_s = bucket_s
        self.horizon_s = half_life_s * keep_half_lives
        self.buckets: dict[tuple[str, str, int], float] = {}
        self.last = 0.0
        self.seen: dict[str, float] = {}  # recorder's held_total at the last call
        self.pools: dict[str, dict[str, float]] = {}  # team -> pool -> GPUs, last seen

    def advance(self, sim: Simulation, now: float) -> None:
        """Bucket the GPU-seconds each team used since the last call."""
        held = held_by_team_and_pool(sim)
        default_pool = sim.node_specs[0].pool
        for team, total in sim.recorder.held_total.items():
            used = total - self.seen.get(team, 0.0)
            self.seen[team] = total
            if used <= 0:
                continue
            pools = held.get(team) or self.pools.get(team) or {default_pool: 1.0}
            self.pools[team] = pools
            weight = sum(pools.values())
            for pool, gpus in pools.items():
                self._add(team, pool, used * gpus / weight, self.last, now)
        self.last = now

    def _add(self, team: str, pool: str, gpu_seconds: float, start: float, end: float) -> None:
        """Spread the GPU-seconds evenly over the buckets the interval covers."""
        if end <= start:
            end = start + 1e-9
        moment = start
        while moment < end:
            bucket = math.floor(moment / self.bucket_s)
            stop = min(end, (bucket + 1) * self.bucket_s)
            key = (team, pool, bucket)
            part = gpu_seconds * (stop - moment) / (end - start)
            self.buckets[key] = self.buckets.get(key, 0.0) + part
            moment = stop

    def records(self, now: float) -> tuple[UsageRecord, ...]:
        """The history as usage records, buckets beyond the horizon dropped."""
        oldest = math.floor((now - self.horizon_s) / self.bucket_s)
        for key in [key for key in self.buckets if key[2] < oldest]:
            del self.buckets[key]
        return tuple(
            UsageRecord(
                queue_id=team,
                pool=pool,
                start=bucket * self.bucket_s,
                end=(bucket + 1) * self.bucket_s,
                gpu_seconds=seconds,
            )
            for (team, pool, bucket), seconds in sorted(self.buckets.items())
        )


def held_by_team_and_pool(sim: Simulation) -> dict[str, dict[str, float]]:
    """GPUs each team holds in each pool now (fractions count as their share)."""
    held: dict[str, dict[str, float]] = {}
    for run in sim.running.values():
        pools = held.setdefault(run.job.team, {})
        for pod in run.placement or ():
            pool = sim.cluster.by_name[pod.node_id].spec.pool
            gpus = len(pod.gpus) + (pod.share if pod.shared_gpu is not None else 0.0)
            pools[pool] = pools.get(pool, 0.0) + gpus
    return held
