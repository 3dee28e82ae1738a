"""Invariants over random snapshots (hypothesis).

Each snapshot comes from a random cluster and random queues; its running work is placed
by the engine itself from a random first batch (so it is a state the engine could have
reached), then more random work arrives.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduling.engine import schedule
from scheduling.engine.apply import apply_result
from scheduling.engine.state import UNITS
from scheduling.engine.types import (
    CycleResult,
    Eviction,
    EvictionReason,
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    TopologyConstraint,
    TopologyMode,
    Workload,
)
from tests.engine.test_evictions import department_gap

G = Resource.GPU
NOW = 10_000.0
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _nodes(rng: random.Random, mig: bool = False) -> tuple[Node, ...]:
    """1-6 nodes; with `mig`, half of them have their last half of devices MIG-enabled (an
    A100 of 40 GB and an H100 of 80 GB have different profile tables), a fifth of those in
    a pool that does not let the engine repartition."""
    found = []
    for i in range(rng.randint(1, 6)):
        pool = rng.choice(("a", "b"))
        gpus = tuple(
            Gpu(j, rng.choice(("A100", "H100")), 40960) for j in range(rng.choice((1, 2, 4, 8)))
        )
        node = Node(
            f"n{i}",
            pool,
            gpus,
            topology={"rack": f"r{i % 3}"},
            cpu=rng.choice((None, 64.0)),
            memory_mib=None,
        )
        if mig and rng.random() < 0.5:
            node = _with_mig(node, rng.random() < 0.8)
        found.append(node)
    return tuple(found)


def _with_mig(node: Node, repartition: bool) -> Node:
    half = len(node.gpus) // 2
    gpus = tuple(replace(g, mig=True) if g.index >= half else g for g in node.gpus)
    return replace(node, gpus=gpus, mig_repartition=repartition)


# Profiles of the A100 40 GB table, of the H100 80 GB table, of both; "auto" asks by memory.
MIG_PROFILES = ("1g.5gb", "3g.20gb", "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "auto")


def _queues(rng: random.Random, whole_gpus_only: bool) -> tuple[Queue, ...]:
    queues = []
    departments = 1 if whole_gpus_only else rng.randint(1, 2)
    for d in range(departments):
        dept_id = None if whole_gpus_only else f"d{d}"
        if dept_id:
            queues.append(Queue(dept_id, None, {}))
        for p in range(rng.randint(1, 3)):
            quotas = {}
            for pool in ("a", "b"):
                limit = None if whole_gpus_only or rng.random() < 0.7 else rng.randint(1, 12)
                allowed = whole_gpus_only or rng.random() < 0.8
                quotas[(pool, G)] = Quota(rng.randint(0, 4), limit, rng.choice((1.0, 2.0)), allowed)
            queues.append(Queue(f"q{d}{p}", dept_id, quotas))
    return tuple(queues)


def _pods(rng: random.Random, whole_gpus_only: bool, mig: bool = False) -> tuple[PodRequest, ...]:
    if whole_gpus_only:
        return (PodRequest(gpus=1),)
    if mig and rng.random() < 0.35:
        profile = rng.choice(MIG_PROFILES)
        memory = rng.choice((4000, 9000, 15000, 30000)) if profile == "auto" else 0
        pod = PodRequest(mig_profile=profile, gpu_memory_mib=memory, cpu=rng.choice((0.0, 8.0)))
        return (pod,) * rng.choice((1, 1, 1, 2))
    kind = rng.random()
    if kind < 0.25:
        return (PodRequest(gpu_fraction=rng.choice((0.25, 0.5, 0.3))),)
    if kind < 0.35:
        return (PodRequest(gpu_memory_mib=rng.choice((8192, 20480))),)
    return (PodRequest(gpus=rng.choice((1, 1, 2, 4)), cpu=rng.choice((0.0, 8.0))),) * rng.choice(
        (1, 1, 2, 3)
    )


def _workload(
    rng: random.Random, i: int, queues: list[str], whole_gpus_only: bool, mig: bool = False
) -> Workload:
    pods = _pods(rng, whole_gpus_only, mig)
    topology = None
    if len(pods) > 1 and rng.random() < 0.3:
        topology = TopologyConstraint("rack", rng.choice(tuple(TopologyMode)))
    return Workload(
        id=f"w{i:03d}",
        queue_id=rng.choice(queues),
        pods=pods,
        priority=rng.choice((0, 5, 10)),
        preemptible=whole_gpus_only or rng.random() < 0.7,
        submit_time=rng.uniform(0, NOW),
        pools=() if whole_gpus_only else rng.choice(((), ("a",), ("b", "a"))),
        gpu_models=() if whole_gpus_only or rng.random() < 0.8 else ("H100",),
        topology=topology,
        last_checkpoint_time=rng.choice((None, NOW - 100)),
    )


def random_snapshot(seed: int, whole_gpus_only: bool = False, mig: bool = False) -> Snapshot:
    """With `mig`: MIG-enabled devices, and MIG pods (by profile or by memory) among the work."""
    rng = random.Random(seed)
    nodes = _nodes(rng, mig)
    if whole_gpus_only:
        nodes = tuple(replace(n, pool="a", cpu=None) for n in nodes)
    queues = _queues(rng, whole_gpus_only)
    leaves = [q.id for q in queues if q.parent_id is not None or whole_gpus_only]
    first = [_workload(rng, i, leaves, whole_gpus_only, mig) for i in range(rng.randint(0, 15))]
    seed_snap = Snapshot(("a", "b"), nodes, queues, tuple(first))
    placed = apply_result(seed_snap, schedule(seed_snap, SchedulerConfig(), NOW - 600), NOW - 600)
    running = [w for w in placed.workloads if w.placement is not None]
    more = [
        _workload(rng, 100 + i, leaves, whole_gpus_only, mig) for i in range(rng.randint(0, 20))
    ]
    return replace(placed, workloads=tuple(running + more))


seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _check_no_overcommit(snap: Snapshot) -> None:
    whole: dict[tuple[str, int], list[str]] = defaultdict(list)
    shares: dict[tuple[str, int], float] = defaultdict(float)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, float] = defaultdict(float)
    for wl in snap.workloads:
        for p in wl.placement or ():
            cpu[p.node_id] += wl.pods[p.pod].cpu
            for index in p.gpus:
                whole[(p.node_id, index)].append(wl.id)
            if p.shared_gpu is not None:
                shares[(p.node_id, p.shared_gpu)] += p.share
                memory[(p.node_id, p.shared_gpu)] += p.gpu_memory_mib
    devices = {(n.id, g.index): g for n in snap.nodes for g in n.gpus}
    for key, owners in whole.items():
        assert key in devices and len(owners) == 1, (key, owners)
        assert key not in shares, f"{key} is held whole and shared"
    for key, total in shares.items():
        assert total <= 1 + 1 / UNITS, (key, total)
        assert memory[key] <= devices[key].memory_mib, (key, memory[key])
    for node in snap.nodes:
        if node.cpu is not None:
            assert cpu[node.id] <= node.cpu + 1e-9


@FAST
@given(seeds)
def test_no_gpu_is_ever_over_committed(seed: int) -> None:
    snap = random_snapshot(seed)
    after = apply_result(snap, schedule(snap, SchedulerConfig(), NOW), NOW)
    _check_no_overcommit(after)


@FAST
@given(seeds)
def test_gangs_start_whole_and_only_pending_work_is_admitted(seed: int) -> None:
    snap = random_snapshot(seed)
    result = schedule(snap, SchedulerConfig(), NOW)
    by_id = {wl.id: wl for wl in snap.workloads}
    moved = {e.workload_id for e in result.evictions if e.reason is EvictionReason.CONSOLIDATE}
    for admission in result.admissions:
        wl = by_id[admission.workload_id]
        assert wl.placement is None or wl.id in moved
        pods = [p.pod for p in admission.pods]
        assert len(set(pods)) == len(pods) >= wl.gang_min
        assert {a.node_id for a in admission.pods} <= {n.id for n in snap.nodes}
    waiting = {wl.id for wl in snap.workloads if wl.placement is None}
    admitted = {a.workload_id for a in result.admissions}
    assert set(result.pending_reasons) == (waiting - admitted) | (
        {e.workload_id for e in result.evictions} - admitted
    )


@FAST
@given(seeds)
def test_non_preemptible_work_is_never_evicted(seed: int) -> None:
    snap = random_snapshot(seed)
    result = schedule(snap, SchedulerConfig(), NOW)
    by_id = {wl.id: wl for wl in snap.workloads}
    for eviction in result.evictions:
        if eviction.reason is not EvictionReason.STALE_GANG:
            assert by_id[eviction.workload_id].preemptible


@FAST
@given(seeds)
def test_the_same_input_in_any_order_gives_the_same_decisions(seed: int) -> None:
    snap = random_snapshot(seed)
    shuffled = list(snap.workloads), list(snap.nodes), list(snap.queues)
    rng = random.Random(seed)
    for items in shuffled:
        rng.shuffle(items)
    other = replace(
        snap, workloads=tuple(shuffled[0]), nodes=tuple(shuffled[1]), queues=tuple(shuffled[2])
    )
    first = schedule(snap, SchedulerConfig(), NOW)
    assert schedule(snap, SchedulerConfig(), NOW) == first
    assert schedule(other, SchedulerConfig(), NOW) == first


@FAST
@given(seeds)
def test_deserved_quota_is_honoured_when_demand_and_capacity_exist(seed: int) -> None:
    # One pool, one-GPU jobs, everything preemptible, deserved quotas within capacity:
    # after one cycle every queue that still waits holds at least its deserved GPUs.
    snap = random_snapshot(seed, whole_gpus_only=True)
    capacity = sum(len(n.gpus) for n in snap.nodes)
    if sum(q.quotas[("a", G)].deserved for q in snap.queues) > capacity:
        snap = replace(
            snap, queues=tuple(replace(q, quotas={("a", G): Quota(0)}) for q in snap.queues)
        )
    after = apply_result(snap, schedule(snap, SchedulerConfig(), NOW), NOW)
    held = Counter(wl.queue_id for wl in after.workloads if wl.placement)
    waiting = {wl.queue_id for wl in after.workloads if wl.placement is None}
    for q in snap.queues:
        if q.id in waiting:
            assert held[q.id] >= q.quotas[("a", G)].deserved, (q.id, held, q.quotas)


def reclaim_floor(share: float) -> int:
    """What a victim's queue keeps after reclaim: its fair share when that is a whole
    number of GPUs, else the share rounded down (docs/engine.md, "The reclaim floor")."""
    return math.floor(share + 1e-9)


@FAST
@given(seeds)
@example(12395)  # q01 (deserved 1) lost its 1-GPU job to a cheap search, then its 4-GPU one
@example(5962)  # q00 (deserved 2): a 0.3-GPU job, then a 3-GPU one; the first is owed back
def test_reclaim_leaves_every_victim_queue_at_least_its_fair_share_rounded_down(
    seed: int,
) -> None:
    # Checked at both levels in the pool of each victim, for the queues on the victim's
    # side of the tree (a department that holds both victim and beneficiary gives
    # nothing up). Queues that also lost work to preemption or a stale gang are left
    # out: those evictions answer to other rules. One allowance: when projects of one
    # department reclaim from each other, whole victims may free more than the
    # beneficiary takes; that surplus is free GPUs (the department, then below its
    # share, is first in line for them), so a department that was also a victim of
    # another department may sit below its floor by at most that surplus.
    snap = random_snapshot(seed)
    result = schedule(snap, SchedulerConfig(), NOW)
    assert_reclaim_floor(snap, result)


def assert_reclaim_floor(snap: Snapshot, result: CycleResult) -> None:
    by_id = {wl.id: wl for wl in snap.workloads}
    parent = {q.id: q.parent_id for q in snap.queues}
    pool_of = {n.id: n.pool for n in snap.nodes}
    victims: set[tuple[str, str]] = set()
    other: set[str] = set()
    surplus: dict[tuple[str, str], float] = defaultdict(float)
    taken: dict[str, float] = {
        a.workload_id: sum(_gpus(p) for p in a.pods) for a in result.admissions
    }
    counted: set[tuple[str, str]] = set()
    reclaimed: dict[tuple[str, str], list[float]] = defaultdict(list)  # GPUs of each victim
    for e in result.evictions:
        wl = by_id[e.workload_id]
        chain = _chain(parent, wl.queue_id)
        if e.reason is EvictionReason.RECLAIM:
            pool = pool_of[(wl.placement or ())[0].node_id]
            reclaimed[(wl.queue_id, pool)].append(sum(_gpus(p) for p in wl.placement or ()))
            theirs = _chain(parent, by_id[e.beneficiary or ""].queue_id)
            victims |= {(q, pool) for q in set(chain) - set(theirs)}
            for q in set(chain) & set(theirs):
                surplus[(q, pool)] += sum(_gpus(p) for p in wl.placement or ())
                if (q, e.beneficiary or "") not in counted:
                    counted.add((q, e.beneficiary or ""))
                    surplus[(q, pool)] -= taken.get(e.beneficiary or "", 0.0)
        elif e.reason is not EvictionReason.CONSOLIDATE:
            other |= set(chain)
    quotas = {q.id: q.quotas for q in snap.queues}

    def deserved(qid: str, pool: str) -> float:
        quota = quotas[qid].get((pool, G))
        return quota.deserved if quota else 0.0

    # A project may lose work borrowed whole: a job larger than the room its deserved
    # quota leaves it (a 2-GPU job of a project that deserves 1); its department then
    # goes below its own floor by no more than that room (docs/engine.md).
    short: dict[tuple[str, str], float] = defaultdict(float)  # each department's allowance
    for (qid, pool), gone in reclaimed.items():
        room = deserved(qid, pool) - result.allocations.get((qid, pool, G), 0.0)
        if room > 1e-9 and all(gpus > room + 1e-9 for gpus in gone):
            for up in _chain(parent, qid)[1:]:
                short[(up, pool)] += room
    for qid, pool in victims - {(q, p) for q in other for p in pool_of.values()}:
        share = result.fair_shares.get((qid, pool, G), 0.0)
        held = result.allocations.get((qid, pool, G), 0.0)
        slack = max(surplus[(qid, pool)], 0.0)
        # Reclaim's last search takes borrowed work down to the deserved quota where no
        # plan exists above the floors (docs/engine.md, "The reclaim floor").
        floor = min(reclaim_floor(share), deserved(qid, pool))
        if held < floor - slack - 1e-9 and qid not in parent.values():
            gone = reclaimed.get((qid, pool), [])
            room = deserved(qid, pool) - held
            assert gone and all(gpus > room + 1e-9 for gpus in gone), (
                qid,
                pool,
                held,
                share,
                deserved(qid, pool),
                gone,
            )
            continue
        allowed = short[(qid, pool)]
        assert held >= floor - slack - allowed - 1e-9, (qid, pool, held, share, slack, allowed)


def _gpus(placement: PodPlacement) -> float:
    return len(placement.gpus) + placement.share


def test_the_floor_allowance_is_only_the_surplus_of_a_reclaim_inside_a_department() -> None:
    # Seed 8174 (found by a long run): q10 (department d1) reclaims half GPUs from q01
    # (d0), leaving d0 at its floor of 1 GPU in pool a; then q00 reclaims q01's whole
    # GPU for a half share inside d0. d0 ends at 0.75: below its floor by the surplus.
    snap = random_snapshot(8174)
    result = schedule(snap, SchedulerConfig(), NOW)
    assert result.allocations[("d0", "a", G)] == 0.75
    assert_reclaim_floor(snap, result)


def test_a_department_goes_below_its_floor_only_by_its_projects_room() -> None:
    # d2 (deserved 5) gives up v's 4-GPU job (v deserves 1): d2 ends at 4, below its floor
    # by v's room of 1, and no further (test_evictions.py has the example's cycles).
    snap = department_gap(u_jobs=4, now=NOW)
    result = schedule(snap, SchedulerConfig(), NOW)
    assert result.allocations[("d2", "a", G)] == 4
    assert_reclaim_floor(snap, result)
    # u's jobs taken as well would leave d2 below it by more than v's room.
    u_gone = tuple(Eviction(f"u{i}", EvictionReason.RECLAIM, beneficiary="o0") for i in range(2))
    worse = replace(
        result,
        evictions=result.evictions + u_gone,
        allocations={**result.allocations, ("d2", "a", G): 2.0, ("u", "a", G): 2.0},
    )
    with pytest.raises(AssertionError):
        assert_reclaim_floor(snap, worse)


def _chain(parent: dict[str, str | None], queue_id: str) -> list[str]:
    found = [queue_id]
    while (up := parent.get(found[-1])) is not None:
        found.append(up)
    return found


def test_the_reclaim_floor_keeps_whole_shares_and_rounds_down_the_rest() -> None:
    assert [reclaim_floor(s) for s in (2.0, 2 - 1e-12, 4 / 3, 0.5, 0.0)] == [2, 2, 1, 0, 0]


def test_some_random_snapshots_reclaim_so_the_floor_property_is_exercised() -> None:
    reclaims = [
        e
        for s in range(40)
        for e in schedule(random_snapshot(s), SchedulerConfig(), NOW).evictions
        if e.reason is EvictionReason.RECLAIM
    ]
    assert len(reclaims) > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds)
def test_reclaim_settles_and_never_cycles_over_fifty_cycles(seed: int) -> None:
    # A pair may reclaim from each other in different pools (each is under its deserved
    # quota in one of them); in one pool, GPUs must never go back and forth while the
    # fair shares there stay the same. Shares move with demand (a pending workload that
    # may use two pools counts in both until it starts in one of them), and a queue
    # whose share grew may then rightly take back what it lost: seed 2014 below. So may a
    # queue take back from one that, since it reclaimed, borrowed idle GPUs beyond its
    # share by allocation (seed 45247: q00 reclaims a fraction from q01, q01 then frees
    # two GPUs by preempting its own work, q00 borrows one of them, and q01, now below
    # its share, reclaims that one): what is taken back then is what was borrowed.
    snap = random_snapshot(seed)
    pool_of = {n.id: n.pool for n in snap.nodes}
    reclaimed: list[tuple[int, str, str, str, tuple[float, ...]]] = []
    borrowed: dict[tuple[str, str], set[int]] = defaultdict(set)  # cycles it was admitted to
    reclaims_per_cycle = []
    now = NOW
    for cycle in range(50):
        result = schedule(snap, SchedulerConfig(), now)
        by_id = {wl.id: wl for wl in snap.workloads}
        reclaims = [e for e in result.evictions if e.reason is EvictionReason.RECLAIM]
        reclaims_per_cycle.append(len(reclaims))
        for e in reclaims:
            victim = by_id[e.workload_id]
            pool = pool_of[(victim.placement or ())[0].node_id]
            taker = by_id[e.beneficiary or ""].queue_id
            reclaimed.append((cycle, victim.queue_id, taker, pool, _shares_in(result, pool)))
        made_room_for = {e.beneficiary for e in result.evictions}
        for admission in result.admissions:
            if admission.workload_id not in made_room_for:
                queue = by_id[admission.workload_id].queue_id
                for pod in admission.pods:
                    borrowed[(queue, pool_of[pod.node_id])].add(cycle)
        snap = apply_result(snap, result, now)
        _check_no_overcommit(snap)
        now += 60
    back_and_forth = {
        (a, b, pool)
        for first, a, b, pool, shares in reclaimed
        for then, a2, b2, pool2, shares2 in reclaimed
        if (a2, b2, pool2, shares2) == (b, a, pool, shares)
        and then >= first
        and not any(first < c <= then for c in borrowed[(b, pool)])
    }
    assert not back_and_forth, back_and_forth
    assert sum(reclaims_per_cycle[25:]) == 0, reclaims_per_cycle


def _shares_in(result: CycleResult, pool: str) -> tuple[float, ...]:
    """The GPU fair shares of every queue in the pool, rounded against float noise."""
    return tuple(
        round(share, 6)
        for (_, p, r), share in sorted(result.fair_shares.items())
        if p == pool and r is G
    )


def test_the_random_snapshots_are_not_trivial() -> None:
    # Guard against a generator that stops exercising the engine.
    results = [schedule(random_snapshot(s), SchedulerConfig(), NOW) for s in range(30)]
    assert sum(len(r.admissions) for r in results) > 30
    assert sum(len(r.evictions) for r in results) > 0
    assert isinstance(results[0], CycleResult)


def test_reclaimers_stay_within_their_fair_share_so_these_seeds_no_longer_flip_flop() -> None:
    # Found by a 3,000-seed run: an eviction freed more than its beneficiary took, the
    # second allocation pass gave the surplus to a queue that had just reclaimed (taking
    # it past its fair share), and the queue it reclaimed from took GPUs back next cycle.
    # A reclaimer now stays within its fair share for the rest of the cycle.
    for seed in (2317, 2955):
        test_reclaim_settles_and_never_cycles_over_fifty_cycles.hypothesis.inner_test(seed)  # type: ignore[attr-defined]


def test_a_queue_whose_fair_share_grew_may_take_back_what_it_lost() -> None:
    # Seed 2014, pool a (one GPU): q02 reclaims half a GPU from q00 while a 1-GPU job of
    # q02 that may run in either pool counts as its demand in both. The job starts in
    # pool b, q02's share in pool a falls from 0.46 to 0.22 and q00's rises to 0.67, so
    # q00 reclaims from q02 next cycle. Not a flip-flop: the shares moved, then settle.
    snap = random_snapshot(2014)
    first = schedule(snap, SchedulerConfig(), NOW)
    second = schedule(apply_result(snap, first, NOW), SchedulerConfig(), NOW + 60)
    assert _shares_in(first, "a") != _shares_in(second, "a")
    test_reclaim_settles_and_never_cycles_over_fifty_cycles.hypothesis.inner_test(2014)  # type: ignore[attr-defined]
