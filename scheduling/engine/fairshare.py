"""Fair share: deserved quota first, the rest by over-quota weight (water-filling).

Small pure functions, each tested alone: water_fill splits one capacity among sibling
queues; decayed_usage and usage_weights implement time-based fairness; fair_shares
walks the queue tree (departments first, then their projects) per pool and resource.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.engine.types import Queue, Quota, Resource, UsageRecord

EPS = 1e-9
DEFAULT_QUOTA = Quota()

Key = tuple[str, str, Resource]  # (queue id, pool, resource)


@dataclass(frozen=True, slots=True)
class Claim:
    """One queue's standing in a split: what it deserves, may reach, and wants."""

    id: str
    deserved: float
    limit: float | None
    weight: float
    demand: float
    over_quota_allowed: bool = True

    @property
    def cap(self) -> float:
        """The most this queue can get: its demand, never past its limit or, when it may
        not borrow, past its deserved quota."""
        cap = self.demand
        if self.limit is not None:
            cap = min(cap, self.limit)
        if not self.over_quota_allowed:
            cap = min(cap, self.deserved)
        return max(cap, 0.0)


def deserved_part(capacity: float, claims: list[Claim]) -> dict[str, float]:
    """Each queue's deserved quota up to its cap; scaled down pro rata to deserved when
    the quotas promised add up to more than the capacity."""
    wanted = {c.id: float(min(c.deserved, c.cap)) for c in claims}
    total = sum(wanted.values())
    if total <= capacity + EPS or total <= 0:
        return wanted
    scale = capacity / total
    return {qid: amount * scale for qid, amount in wanted.items()}


def over_quota_part(remaining: float, claims: list[Claim], given: dict[str, float]) -> None:
    """Divide `remaining` among queues below their cap in proportion to weight, never past
    a cap (water-filling): cap the queues that would overflow, then share again."""
    active = sorted(
        (c for c in claims if c.cap > given[c.id] + EPS and c.weight > 0), key=lambda c: c.id
    )
    while active and remaining > EPS:
        if math.isinf(remaining):
            for c in active:
                given[c.id] = c.cap
            return
        total_weight = sum(c.weight for c in active)
        capped = [
            c for c in active if given[c.id] + remaining * c.weight / total_weight >= c.cap - EPS
        ]
        if not capped:
            for c in active:
                given[c.id] += remaining * c.weight / total_weight
            return
        for c in capped:
            remaining -= c.cap - given[c.id]
            given[c.id] = c.cap
        active = [c for c in active if c not in capped]


def water_fill(capacity: float, claims: list[Claim]) -> dict[str, float]:
    """Split `capacity` among sibling queues: deserved first, the rest by weight."""
    given = deserved_part(capacity, claims)
    over_quota_part(max(capacity - sum(given.values()), 0.0), claims, given)
    return given


def decayed_usage(
    records: Iterable[UsageRecord], now: float, half_life_s: float
) -> dict[tuple[str, str], float]:
    """GPU-seconds per (queue, pool), each record halved every half-life since its middle."""
    usage: dict[tuple[str, str], float] = {}
    for r in records:
        age = max(now - (r.start + r.end) / 2, 0.0)
        key = (r.queue_id, r.pool)
        usage[key] = usage.get(key, 0.0) + r.gpu_seconds * 0.5 ** (age / half_life_s)
    return usage


def usage_weights(claims: list[Claim], usage: Mapping[str, float], k: float) -> list[Claim]:
    """Shrink the over-quota weight of siblings that used more of the past: a queue that
    had all of the siblings' decayed usage gets weight w / (1 + k), one that had none
    keeps w."""
    total = sum(usage.get(c.id, 0.0) for c in claims)
    if total <= 0:
        return claims
    return [
        Claim(
            c.id,
            c.deserved,
            c.limit,
            c.weight / (1 + k * usage.get(c.id, 0.0) / total),
            c.demand,
            c.over_quota_allowed,
        )
        for c in claims
    ]


@dataclass(frozen=True, slots=True)
class FairShareInput:
    """Everything fair_shares reads, per pool and resource."""

    queues: tuple[Queue, ...]
    capacity: Mapping[tuple[str, Resource], float]  # (pool, resource) -> total
    demand: Mapping[Key, float]  # leaf demand: running allocation + pending requests
    usage: Mapping[tuple[str, str], float]  # decayed (queue, pool) usage, may be empty
    usage_weight: float = 1.0


def fair_shares(inp: FairShareInput) -> dict[Key, float]:
    """Fair share of every queue per pool and resource, parents before their children."""
    children: dict[str | None, list[Queue]] = {}
    ids = {q.id for q in inp.queues}
    for q in sorted(inp.queues, key=lambda q: q.id):
        parent = q.parent_id if q.parent_id in ids else None
        children.setdefault(parent, []).append(q)
    demand = _tree_demand(inp, children)
    result: dict[Key, float] = {}
    for pool, resource in sorted(inp.capacity):
        _split(inp, children, demand, None, pool, resource, inp.capacity[(pool, resource)], result)
    return result


def _tree_demand(inp: FairShareInput, children: dict[str | None, list[Queue]]) -> dict[Key, float]:
    """Demand of every queue: its own for a leaf, its children's (each capped) for a parent."""
    demand: dict[Key, float] = {}
    for pool, resource in sorted(inp.capacity):
        for root in children.get(None, []):
            _visit(inp, children, demand, root, pool, resource)
    return demand


def _visit(
    inp: FairShareInput,
    children: dict[str | None, list[Queue]],
    demand: dict[Key, float],
    q: Queue,
    pool: str,
    resource: Resource,
) -> float:
    """A queue's demand into `demand`, its subtree's first (a module function: a nested
    one calling itself is a reference cycle, garbage for the collector each cycle)."""
    kids = children.get(q.id, [])
    if not kids:
        value = inp.demand.get((q.id, pool, resource), 0.0)
    else:
        value = sum(
            _claim(q2, pool, resource, _visit(inp, children, demand, q2, pool, resource)).cap
            for q2 in kids
        )
    demand[(q.id, pool, resource)] = value
    return value


def _claim(q: Queue, pool: str, resource: Resource, demand: float) -> Claim:
    quota = q.quotas.get((pool, resource), DEFAULT_QUOTA)
    return Claim(
        q.id, quota.deserved, quota.limit, quota.over_quota_weight, demand, quota.over_quota_allowed
    )


def _split(
    inp: FairShareInput,
    children: dict[str | None, list[Queue]],
    demand: dict[Key, float],
    parent: str | None,
    pool: str,
    resource: Resource,
    capacity: float,
    result: dict[Key, float],
) -> None:
    kids = children.get(parent, [])
    if not kids:
        return
    claims = [_claim(q, pool, resource, demand[(q.id, pool, resource)]) for q in kids]
    if inp.usage:
        usage = {q.id: inp.usage.get((q.id, pool), 0.0) for q in kids}
        claims = usage_weights(claims, usage, inp.usage_weight)
    shares = water_fill(capacity, claims)
    for q in kids:
        result[(q.id, pool, resource)] = shares[q.id]
        _split(inp, children, demand, q.id, pool, resource, shares[q.id], result)


def rollup_usage(
    queues: Iterable[Queue], usage: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    """Add each queue's usage to all its ancestors, so departments compare by their total."""
    parents = {q.id: q.parent_id for q in queues}
    total: dict[tuple[str, str], float] = {}
    for (qid, pool), amount in sorted(usage.items()):
        seen: set[str] = set()
        current: str | None = qid
        while current is not None and current not in seen:
            seen.add(current)
            total[(current, pool)] = total.get((current, pool), 0.0) + amount
            current = parents.get(current)
    return total
