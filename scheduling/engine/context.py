"""What every action of one cycle shares: the working state and the questions it asks.

Built once per cycle from the snapshot; the actions read and change it only through the
Statement, so everything they try can be undone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduling.engine.fairshare import EPS, Key
from scheduling.engine.mig import pod_fraction
from scheduling.engine.placement import Placer, ShapeKey
from scheduling.engine.resizes import Book
from scheduling.engine.state import ClusterState, Group, PodSlot, share_units
from scheduling.engine.statement import Ledger, Statement
from scheduling.engine.types import (
    RESOURCES,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)

if TYPE_CHECKING:  # the actions import this module; only the type is needed here
    from scheduling.engine.actions.victims import VictimIndex

UNIT_NAMES = {Resource.GPU: "GPUs", Resource.CPU: "CPU cores", Resource.MEMORY: "MiB of memory"}


@dataclass(slots=True, eq=False)
class Context:
    """The cycle's shared working set. `reasons` holds the latest reason per workload."""

    snapshot: Snapshot
    config: SchedulerConfig
    now: float
    state: ClusterState
    ledger: Ledger
    stmt: Statement
    placer: Placer
    queues: dict[str, Queue]
    workloads: dict[str, Workload]
    pools: list[str]
    fair: dict[Key, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    # pool -> (ledger moves seen, queues above their deserved quota: reclaim.over_quota)
    over_quota_memo: dict[str, tuple[int, dict[str, float]]] = field(default_factory=dict)
    # pool -> (ledger moves seen, what each project below its quota by work borrowed whole
    # and taken this cycle is short of it: reclaim.OverQuotaRule._short)
    short_memo: dict[str, tuple[int, dict[str, float]]] = field(default_factory=dict)
    # pending workload id -> (seconds it may still wait, the victim): a search passed
    # over a victim whose checkpoint is due soon (actions/victims.py), said in its reason
    checkpoint_waits: dict[str, tuple[float, str]] = field(default_factory=dict)
    capacity_failed: set[str] = field(default_factory=set)
    shape_failures: dict[tuple[str, int], str] = field(default_factory=dict)
    shapes: dict[str, int] = field(default_factory=dict)
    shape_ids: dict[ShapeKey, int] = field(default_factory=dict)
    needs: dict[object, tuple[float, float, float]] = field(default_factory=dict)
    # Only quotas with a limit or without borrowing can block an admission; most have
    # neither, so admission checks skip them without a lookup.
    capped: dict[tuple[str, str], list[tuple[Resource, Quota]]] = field(default_factory=dict)
    # (queue, pool) -> the capped quotas of the queue and its ancestors, leaf first
    chain_caps: dict[tuple[str, str], list[tuple[str, Resource, Quota]]] = field(
        default_factory=dict
    )
    donor_memo: dict[str, tuple[int, dict[str, float]]] = field(default_factory=dict)
    # pool -> how many times a queue joined or left donors(pool): what depends only on
    # who the donors are (ReclaimRule.allowed) is kept while this stands still
    donor_turns: dict[str, int] = field(default_factory=dict)
    # pool -> (ledger moves seen, GPUs leaf queues hold above fair share: reclaim)
    over_memo: dict[str, tuple[int, float]] = field(default_factory=dict)
    # (queue, pool) -> what Context.nonpreemptible_block checks (quotas: fixed in a cycle)
    fixed_caps: dict[tuple[str, str], list[tuple[Resource, int, float]]] = field(
        default_factory=dict
    )
    # (pool, reclaimer's queue, its misfits) -> (donor_turns seen, ReclaimRule.allowed())
    allowed_memo: dict[tuple[object, ...], tuple[int, dict[str, bool]]] = field(
        default_factory=dict
    )
    # pool -> (ledger changes seen, queues waiting below their fair share): allocate.py
    starved_memo: dict[str, tuple[int, set[str]]] = field(default_factory=dict)
    # (queue, pool) -> what it may hold before allocate.borrow_block asks about others
    borrow_caps: dict[tuple[str, str], float] = field(default_factory=dict)
    deserved_memo: dict[tuple[str, str], float] = field(default_factory=dict)  # deserved()
    queue_ids: list[str] = field(default_factory=list)
    waiting: list[Workload] = field(default_factory=list)  # pending at the start, in order
    parents: set[str] = field(default_factory=set)
    total_memo: dict[str, list[Standing]] = field(default_factory=dict)
    # Pools where each resource is limited (GPUs always; CPU and memory where every node
    # states its allocatable amount): only those count in the starvation order.
    scarce: dict[Resource, list[str]] = field(default_factory=dict)
    victim_index: VictimIndex | None = None  # actions.victims.preemptible() builds it
    searches_left: int = 0  # eviction-plan searches this cycle may still run
    considered: dict[str, None] = field(default_factory=dict)  # pending ids, in turn
    reclaimed: set[tuple[str, str]] = field(default_factory=set)  # (queue, pool) reclaimers
    book: Book = field(default_factory=Book)  # elastic workloads (actions/elastic.py)
    # incremental.EngineState keeps these between cycles, with queue_ids, waiting,
    # parents and capped above (they depend on the snapshot alone):
    preemptible_running: int = 0  # running workloads that are preemptible
    short_gangs: list[str] = field(default_factory=list)  # running gangs below min_pods
    capacity: dict[tuple[str, Resource], float] = field(default_factory=dict)  # per pool
    pending_demand: dict[Key, float] = field(default_factory=dict)  # what `waiting` asks
    # running workload -> (GPUs per pool, node orders), for actions.victims (read-only)
    victim_parts: dict[str, tuple[dict[str, float], tuple[int, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.searches_left = self.config.max_victim_searches

    # -- workloads ------------------------------------------------------------------

    def pools_for(self, wl: Workload) -> list[str]:
        """The pools a workload may use, in its order of preference."""
        return pools_for(self.state, self.pools, wl)

    def shape_of(self, wl: Workload) -> int:
        """A small id shared by workloads that fit or fail alike (hashing a gang's pods
        once per cycle, not once per attempt)."""
        found = self.shapes.get(wl.id)
        if found is None:
            found = self.shape_ids.setdefault(ShapeKey.of(wl), len(self.shape_ids))
            self.shapes[wl.id] = found
        return found

    def pending(self) -> list[Workload]:
        """Workloads without a placement and not admitted yet, by priority then age."""
        admitted = self.stmt.admitted
        return [wl for wl in self.waiting if wl.id not in admitted]

    def consider(self, wl: Workload) -> None:
        """Note the allocation order: the first time each pending workload gets its turn
        is what the queue page shows (a dict keeps insertion order)."""
        self.considered.setdefault(wl.id, None)

    def gpu_need(self, wl: Workload, pool: str) -> float:
        """GPUs the workload counts against quota in a pool (fractions included)."""
        return self.need(wl, pool)[0]

    def need(self, wl: Workload, pool: str) -> tuple[float, float, float]:
        """GPU, CPU and memory the workload's pods ask for in a pool (cached)."""
        found = self.needs.get(wl.id) or self.needs.get((wl.id, pool))
        if found is None:
            per_pool, found = workload_need(self.state, wl, pool)
            self.needs[(wl.id, pool) if per_pool else wl.id] = found
        return found

    def name(self, queue_id: str) -> str:
        q = self.queues.get(queue_id)
        return (q.name or q.id) if q else queue_id

    def kind(self, queue_id: str) -> str:
        q = self.queues.get(queue_id)
        return "project" if q is not None and q.parent_id is not None else "department"

    # -- quota ----------------------------------------------------------------------

    def quota(self, queue_id: str, pool: str, resource: Resource) -> Quota | None:
        q = self.queues.get(queue_id)
        return None if q is None else q.quotas.get((pool, resource))

    def deserved(self, queue_id: str, pool: str) -> float:
        # asked of each pending workload in every pass (quotas are fixed in a cycle)
        found = self.deserved_memo.get((queue_id, pool))
        if found is None:
            quota = self.quota(queue_id, pool, Resource.GPU)
            found = self.deserved_memo[(queue_id, pool)] = 0.0 if quota is None else quota.deserved
        return found

    def fair_share(self, queue_id: str, pool: str) -> float:
        return self.fair.get((queue_id, pool, Resource.GPU), 0.0)

    def totals(self, queue_id: str) -> list[Standing]:
        """Per resource that counts in the starvation order: the ledger keys to sum, and
        the fair share and reachable deserved quota summed over the pools where the
        resource is limited (fixed for the cycle). GPUs always come first; CPU and memory
        only where the queue has a fair share of them. Reachable: at most the fair
        share, so a quota in a pool without capacity, or beyond what the queue asks for,
        does not make the queue look starved."""
        found = self.total_memo.get(queue_id)
        if found is None:
            found = []
            for resource in Resource:
                pools = self.scarce_pools(resource)
                shares = [self.fair.get((queue_id, pool, resource), 0.0) for pool in pools]
                if resource is not GPU and sum(shares) <= EPS:
                    continue
                deserved = [self.quota_amount(queue_id, pool, resource) for pool in pools]
                reachable = sum(min(d, f) for d, f in zip(deserved, shares, strict=True))
                keys = tuple((queue_id, pool, resource) for pool in pools)
                found.append((resource is GPU, keys, sum(shares), reachable))
            self.total_memo[queue_id] = found
        return found

    def scarce_pools(self, resource: Resource) -> list[str]:
        """The pools where the resource is limited (every pool for GPUs)."""
        return self.scarce.get(resource, self.pools if resource is GPU else [])

    def quota_amount(self, queue_id: str, pool: str, resource: Resource) -> float:
        quota = self.quota(queue_id, pool, resource)
        return 0.0 if quota is None else quota.deserved

    def is_leaf(self, queue_id: str) -> bool:
        return queue_id not in self.parents

    def donors(self, pool: str) -> dict[str, float]:
        """Queues holding more than their fair share of GPUs in the pool, each with what it
        may give up: down to its fair share rounded down to whole GPUs (see reclaim).
        Kept up to date from the ledger's changes (not a pass over every queue)."""
        moved = self.ledger.moved
        memo = self.donor_memo.get(pool)
        if memo is not None and memo[0] == len(moved):
            return memo[1]  # asked of every victim a search walks: the short way first
        seen, found = (-1, {}) if memo is None else memo
        if seen < 0:
            found = {}
            for qid in self.queue_ids:
                self._donor(found, qid, pool)
        else:
            for key in moved[seen:]:
                if key[1] == pool:
                    self._donor(found, key[0], pool)
        self.donor_memo[pool] = (len(moved), found)
        return found

    def _donor(self, found: dict[str, float], qid: str, pool: str) -> None:
        held = self.ledger.alloc.get((qid, pool, GPU), 0.0)
        share = self.fair.get((qid, pool, GPU), 0.0)
        if held > share + EPS:
            if qid not in found:
                self.donor_turns[pool] = self.donor_turns.get(pool, 0) + 1
            found[qid] = held - math.floor(share + EPS)
        elif found.pop(qid, None) is not None:
            self.donor_turns[pool] = self.donor_turns.get(pool, 0) + 1

    def quota_block(self, wl: Workload, pool: str) -> str | None:
        """Why the workload's queue (or an ancestor) may not take more here, or None."""
        key = (wl.queue_id, pool)
        caps = self.chain_caps.get(key)
        if caps is None:
            caps = self.chain_caps[key] = [
                (qid, resource, quota)
                for qid in self.ledger.chain(wl.queue_id)
                for resource, quota in self.capped.get((qid, pool), ())
            ]
        if caps:
            need = self.need(wl, pool)
            for qid, resource, quota in caps:
                amount = need[RESOURCE_INDEX[resource]]
                if amount > 0:
                    held = self.ledger.get(qid, pool, resource)
                    reason = _over(quota, held + amount)
                    if reason is not None:
                        unit = UNIT_NAMES[resource]
                        return f"{self.kind(qid)} {self.name(qid)} {reason} {unit} in pool {pool}"
        if not wl.preemptible:
            return self.nonpreemptible_block(wl, pool)
        return None

    def nonpreemptible_block(self, wl: Workload, pool: str) -> str | None:
        """Why a non-preemptible workload may not start in the pool: with it, its queue's
        non-preemptible work would hold more than the queue's deserved quota of a resource
        (GPUs always; CPU and memory where the queue has a deserved amount of them).
        Nothing evicts non-preemptible work, so borrowing idle GPUs with it would keep
        their owner waiting until it ends. Queue.nonpreemptible_over_quota lifts the rule."""
        key = (wl.queue_id, pool)
        managed = self.fixed_caps.get(key)
        if managed is None:
            managed = self.fixed_caps[key] = self._fixed_caps(wl.queue_id, pool)
        if not managed:
            return None
        need = self.need(wl, pool)
        for resource, index, deserved in managed:
            amount = need[index]
            if amount <= EPS:
                continue
            held = self.ledger.fixed.get((wl.queue_id, pool, resource), 0.0)
            if held + amount > deserved + EPS:
                unit = UNIT_NAMES[resource]
                return (
                    f"non-preemptible work of {self.kind(wl.queue_id)} {self.name(wl.queue_id)}"
                    f" stays within its deserved quota of {deserved:g} {unit} in pool {pool}:"
                    f" {held:g} held by its non-preemptible work, this asks {amount:g} more"
                    " (make it preemptible, or an admin may allow non-preemptible work over"
                    " quota for the project)"
                )
        return None

    def _fixed_caps(self, queue_id: str, pool: str) -> list[tuple[Resource, int, float]]:
        """The resources nonpreemptible_block checks for the queue, each with its index in
        a need and the deserved amount; none where the queue may go over quota."""
        queue = self.queues.get(queue_id)
        if queue is not None and queue.nonpreemptible_over_quota:
            return []
        found = []
        for resource in RESOURCES:
            deserved = self.quota_amount(queue_id, pool, resource)
            if resource is GPU or deserved > EPS:  # CPU or memory without one: not managed
                found.append((resource, RESOURCE_INDEX[resource], deserved))
        return found

    def share_block(self, wl: Workload, pool: str) -> str | None:
        """Why a queue that reclaimed GPUs in this pool this cycle may not take more.

        A reclaimer ends the cycle within its fair share (the reason reclaims cannot
        flip-flop, actions/reclaim.py): GPUs that evictions free beyond what their
        beneficiaries take go to other queues, or stay free for the next cycle."""
        if not self.reclaimed:
            return None
        for qid in self.ledger.chain(wl.queue_id):
            if (qid, pool) in self.reclaimed:
                share = self.fair_share(qid, pool)
                if self.ledger.get(qid, pool) + self.gpu_need(wl, pool) > share + EPS:
                    return (
                        f"{self.kind(qid)} {self.name(qid)} reclaimed GPUs this cycle and stays"
                        f" within its fair share of {share:.3g} GPUs in pool {pool}"
                    )
        return None

    # -- admission ------------------------------------------------------------------

    def admit(self, wl: Workload, pool: str, slots: list[PodSlot]) -> None:
        self.stmt.record_admission(wl, slots)

    def min_runtime_passed(self, wl: Workload) -> bool:
        """Whether a started workload has run long enough to be preempted."""
        least = self.config.min_runtime_s.get(wl.priority_class, 0.0)
        return wl.started_at is None or self.now - wl.started_at >= least


def pools_for(state: ClusterState, pools: list[str], wl: Workload) -> list[str]:
    """The pools a workload may use, in its order of preference (all, by name, if none)."""
    if not wl.pools:
        return pools
    return [p for p in wl.pools if p in state.pool_models or p in pools]


def workload_need(
    state: ClusterState, wl: Workload, pool: str
) -> tuple[bool, tuple[float, float, float]]:
    """GPU, CPU and memory the workload's pods ask for in a pool, and whether that
    depends on the pool (a pod asking GPU memory counts the pool's device size)."""
    pods = wl.pods
    memory = 0
    per_pool = False
    # (a MIG pod's GPU memory picks its profile; its count is the same in every pool)
    if any(pod.gpu_memory_mib and not pod.mig_profile for pod in pods):
        models = state.models_for(pool, wl.gpu_models)
        memory = state.group_memory.get((pool, models[0]), 0) if models else 0
        per_pool = True
    if pods and all(pod is pods[0] for pod in pods):  # (pod,) * n: count it n times
        one = pods[0]
        n = len(pods)
        return per_pool, (n * pod_gpus(one, memory), n * one.cpu, float(n * one.memory_mib))
    return per_pool, (
        sum(pod_gpus(pod, memory) for pod in pods),
        sum(p.cpu for p in pods),
        float(sum(p.memory_mib for p in pods)),
    )


def pending_key(wl: Workload) -> tuple[int, float, str]:
    """Inside a queue: higher priority first, then older, then by id."""
    return (-wl.priority, wl.submit_time, wl.id)


def pod_gpus(pod: PodRequest, gpu_memory_mib: int) -> float:
    """GPUs one pod counts as: whole devices, or its share of one."""
    if pod.mig_profile:
        return pod_fraction(pod)
    if pod.gpu_memory_mib > 0:
        return pod.gpu_memory_mib / gpu_memory_mib if gpu_memory_mib else 0.0
    return pod.gpus + pod.gpu_fraction


def waiting_sizes(state: ClusterState, shared: Iterable[PodRequest]) -> dict[Group, set[int]]:
    """Share units that the waiting fractional pods (`shared`, each request once) need,
    per (pool, model)."""
    return {
        group: {share_units(pod, memory) for pod in shared}
        for group, memory in state.group_memory.items()
    }


RESOURCE_INDEX = {r: i for i, r in enumerate(Resource)}
# One resource's standing of a queue: (is GPU, ledger keys, fair share, reachable deserved).
Standing = tuple[bool, tuple[tuple[str, str, Resource], ...], float, float]
GPU = Resource.GPU


def _over(quota: Quota, total: float) -> str | None:
    if quota.limit is not None and total > quota.limit + EPS:
        return f"is at its limit of {quota.limit:g}"
    if not quota.over_quota_allowed and total > quota.deserved + EPS:
        return f"may not go over its quota of {quota.deserved:g}"
    return None
