"""The guaranteed quota means now (issue 24): in a pool whose guarantees fit its
capacity, work within its project's deserved quota that is blocked only by preemptible
work over its own project's quota is admitted within two cycles, whatever the victims'
checkpoints, costs or order. Waiting for a checkpoint applies only between over-quota
claims, and never for longer than one checkpoint interval.

Each property here fails on a deliberate break of the rule it guards: set
`ReclaimRule.wait_for_checkpoints = True` (the bug of issue 24) and the first fails;
drop the bound `waited < interval` in victims._cheapest_batch and the last one does.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st

from scheduling.engine.apply import apply_result
from scheduling.engine.types import EvictionReason, Queue, Snapshot, Workload
from tests.engine.builders import cycles, dept, job, nodes, project, run, running, snapshot
from tests.engine.test_properties import FAST, assert_reclaim_floor

NOW = 100_000.0
GPUS_PER_NODE = 8
INTERVALS = (None, 300.0, 600.0, 1800.0, 3600.0)


def _victim_history(rng: random.Random, wl: Workload) -> Workload:
    """A random past: when it started, how often it saves, when it last saved, how
    often it restarted; so costs, their order and the checkpoints due all vary."""
    started = NOW - rng.uniform(700, 20_000)
    interval = rng.choice(INTERVALS)
    saved = None if interval is None else rng.uniform(started, NOW)
    return replace(
        wl,
        started_at=started,
        checkpoint_interval_s=interval,
        last_checkpoint_time=saved,
        restarts=rng.randint(0, 3),
    )


def owner_blocked_by_borrowers(seed: int) -> tuple[Snapshot, str, dict[str, int]]:
    """A full pool of 1-GPU jobs whose guarantees fit its capacity. Project `owner` runs
    below its deserved quota and submits an n-pod gang that fits in what it is still
    owed; the only room for it is GPUs that other projects hold over their own quotas.
    Returns the snapshot, the gang's id and each project's deserved quota."""
    rng = random.Random(seed)
    node_count = rng.randint(1, 4)
    capacity = node_count * GPUS_PER_NODE
    others = [f"p{i}" for i in range(rng.randint(1, 4))]
    # Deserved quotas summing to at most the capacity, the owner's at least 1.
    deserved = {"owner": rng.randint(1, capacity // 2)}
    left = capacity - deserved["owner"]
    for qid in others:
        deserved[qid] = rng.randint(0, left)
        left -= deserved[qid]
    held = {"owner": rng.randint(0, deserved["owner"] - 1)}
    need = rng.randint(1, deserved["owner"] - held["owner"])
    # The others fill the rest of the pool (some GPUs may stay free): within their quotas
    # first, the remainder borrowed, so the over-quota work covers what the owner needs.
    free = rng.randint(0, need - 1)
    rest = capacity - held["owner"] - free
    for qid in others:
        held[qid] = min(deserved[qid], rest)
        rest -= held[qid]
    for _ in range(rest):
        held[rng.choice(others)] += 1
    workloads = _running_jobs(rng, held, node_count)
    gang = job("gang", "owner", gpus=1, pods=need, t=NOW - 30)
    workloads.append(gang)
    rng.shuffle(workloads)
    queues = [dept(), project("owner", deserved=deserved["owner"])]
    queues += [project(qid, deserved=deserved[qid]) for qid in others]
    rng.shuffle(queues)
    return snapshot(nodes(node_count), queues, workloads), gang.id, deserved


def _running_jobs(rng: random.Random, held: dict[str, int], node_count: int) -> list[Workload]:
    devices = [(f"n{n}", d) for n in range(node_count) for d in range(GPUS_PER_NODE)]
    rng.shuffle(devices)
    found = []
    for qid, count in sorted(held.items()):
        for i in range(count):
            node, device = devices.pop()
            wl = running(job(f"{qid}-{i}", qid, t=NOW - 30_000 + i), node, [device])
            found.append(_victim_history(rng, wl))
    return found


def owner_blocked_by_large_borrowed_jobs(
    seed: int, partly_deserved: bool = False, departments: bool = False
) -> tuple[Snapshot, str, dict[str, int]]:
    """Like owner_blocked_by_borrowers, but what the other projects hold over their
    quotas is jobs of 2, 4 or 8 GPUs (each on one node), their in-quota work one-GPU
    jobs: taking a large job may leave its project below its fair share, never without
    its one-GPU jobs. The owner's gang of one-GPU pods fits in the free GPUs plus those
    large jobs, within what its quota still owes it. `partly_deserved`: a project's
    quota may also cover part of one of its large jobs (a 4-GPU job of a project owed 1
    more GPU), which no split of the quota holds, so the job is borrowed whole. The
    third value is what each project keeps: its one-GPU jobs (the owner's quota).
    `departments`: the owner has a department of its own and the others are spread over
    one or two more, each department deserving what its projects deserve."""
    rng = random.Random(seed)
    while True:  # until some GPUs are free or borrowed: else nothing could make room
        node_count, small, workloads, free, over = _large_borrowed_jobs(rng)
        extras = _partly_deserved(rng, workloads) if partly_deserved else {}
        if over + free - sum(extras.values()) > 0:
            break
    need = rng.randint(1, min(over + free - sum(extras.values()), 16))
    kept = {qid: count for qid, count in small.items() if qid != "owner"}
    deserved = {qid: count + extras.get(qid, 0) for qid, count in kept.items()}
    deserved["owner"] = kept["owner"] = small["owner"] + need
    gang = job("gang", "owner", gpus=1, pods=need, t=NOW - 30)
    queues, parent = _departments(rng, deserved) if departments else ([dept()], {})
    queues += [project(q, parent.get(q, "dept"), deserved=d) for q, d in sorted(deserved.items())]
    workloads.append(gang)
    rng.shuffle(workloads)
    return snapshot(nodes(node_count), queues, workloads), gang.id, kept


def _departments(rng: random.Random, deserved: dict[str, int]) -> tuple[list[Queue], dict]:
    """The owner's department and one or two for the other projects, each deserving the
    sum of its projects' quotas; and each project's department."""
    count = rng.randint(1, 2)
    parent = {q: "d-own" if q == "owner" else f"d{rng.randrange(count)}" for q in sorted(deserved)}
    found = []
    for did in sorted(set(parent.values())):
        found.append(dept(did, deserved=sum(d for q, d in deserved.items() if parent[q] == did)))
    return found, parent


def _partly_deserved(rng: random.Random, workloads: list[Workload]) -> dict[str, int]:
    """For some projects, a deserved quota above their one-GPU jobs by less than one of
    their large jobs: project -> the GPUs added."""
    extras: dict[str, int] = {}
    for wl in workloads:
        size = wl.pods[0].gpus
        if size > 1 and wl.queue_id not in extras and rng.random() < 0.5:
            extras[wl.queue_id] = rng.randint(1, int(size) - 1)
    return extras


def _large_borrowed_jobs(rng: random.Random) -> tuple:
    """Nodes cut into blocks: free, or one job of the block's size; other projects' jobs of
    2-8 GPUs are over their quotas (`over` GPUs), every one-GPU job within its project's."""
    node_count = rng.randint(1, 4)
    others = [f"p{i}" for i in range(rng.randint(1, 3))]
    small: dict[str, int] = dict.fromkeys(["owner", *others], 0)
    workloads: list[Workload] = []
    free = 0
    for n in range(node_count):
        for start, size in _blocks(rng):
            devices = range(start, start + size)
            roll = rng.random()
            if roll < 0.1:
                free += size
                continue
            qid = rng.choice(others) if size > 1 or roll < 0.8 else "owner"
            name = f"{qid}-{n}-{start}"
            big = size > 1
            wl = running(job(name, qid, gpus=size, t=NOW - 30_000), f"n{n}", devices)
            workloads.append(_victim_history(rng, wl))
            if not big:
                small[qid] += 1
    over = sum(wl.pods[0].gpus for wl in workloads if wl.pods[0].gpus > 1)
    return node_count, small, workloads, free, over


def _blocks(rng: random.Random) -> list[tuple[int, int]]:
    """A node's 8 devices cut into aligned blocks of 1, 2, 4 or 8."""
    blocks: list[tuple[int, int]] = []
    start = 0
    while start < GPUS_PER_NODE:
        sizes = [s for s in (8, 4, 2, 1) if start % s == 0 and start + s <= GPUS_PER_NODE]
        size = rng.choice(sizes)
        blocks.append((start, size))
        start += size
    return blocks


@FAST
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_in_quota_work_blocked_by_borrowed_work_is_admitted_within_two_cycles(seed: int) -> None:
    assert_owner_served(seed, *owner_blocked_by_borrowers(seed))


@FAST
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_in_quota_work_takes_back_large_borrowed_jobs_within_two_cycles(seed: int) -> None:
    assert_owner_served(seed, *owner_blocked_by_large_borrowed_jobs(seed))


@FAST
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_in_quota_work_takes_back_jobs_larger_than_their_projects_quota(seed: int) -> None:
    assert_owner_served(seed, *owner_blocked_by_large_borrowed_jobs(seed, partly_deserved=True))


@FAST
@given(st.integers(min_value=0, max_value=2**32 - 1))
@example(30)  # d0's jobs of two projects (1 and 2 short after): the room of both counts
@example(107)  # a project left below its quota still holds work: its room is what it lacks
def test_in_quota_work_takes_back_jobs_borrowed_whole_in_other_departments(seed: int) -> None:
    # A department deserving what its projects deserve holds above its quota only what
    # they borrow; a job borrowed whole may leave it below its quota by its project's room.
    snap, gang, kept = owner_blocked_by_large_borrowed_jobs(
        seed, partly_deserved=True, departments=True
    )
    assert_owner_served(seed, snap, gang, kept)
    assert_reclaim_floor(snap, run(snap, None, NOW))


@FAST
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_gang_reclaim_takes_no_victim_it_does_not_need(seed: int) -> None:
    """Take the least work that frees what is needed: with any one of a gang's victims
    left running (the others evicted), the gang would not fit. Before, one gang reclaim in
    seven took a job it did not need (room was made one pod's worth at a time, cheapest
    first, and a later, larger victim freed what an earlier one had been taken for)."""
    for scenario in (owner_blocked_by_large_borrowed_jobs, owner_blocked_by_borrowers):
        snap, gang, _ = scenario(seed)
        result = run(snap, None, NOW)
        taken = [e for e in result.evictions if e.beneficiary == gang]
        if gang not in {a.workload_id for a in result.admissions} or len(taken) < 2:
            continue
        for spared in taken:
            others = tuple(e for e in taken if e is not spared)
            without = apply_result(snap, replace(result, admissions=(), evictions=others), NOW)
            again = run(without, None, NOW)
            fits = gang in {a.workload_id for a in again.admissions}
            assert not (fits and not any(e.beneficiary == gang for e in again.evictions)), (
                f"seed {seed}: {spared.workload_id} was not needed for {scenario.__name__}"
            )


def test_a_reclaim_for_one_pod_takes_only_the_job_it_needs() -> None:
    # One 8-GPU node that b borrows whole but for c's GPU: three 1-GPU jobs started a
    # minute ago (cheap to evict, so walked first) and a 4-GPU job. The owner's 4-GPU pod
    # needs the 4-GPU job whatever else goes; the three small ones were taken beside it.
    small = [running(job(f"s{i}", "b", t=i), "n0", [i], started=NOW - 60) for i in range(3)]
    big = running(job("big", "b", gpus=4, t=5), "n0", [3, 4, 5, 6], started=NOW - 600)
    held = running(job("c0", "c", t=6), "n0", [7], started=NOW - 60)
    queues = [dept(), project("owner", deserved=4), project("b", deserved=0),
              project("c", deserved=4)]  # fmt: skip
    snap = snapshot(nodes(1), queues, [*small, big, held, job("want", "owner", gpus=4, t=NOW)])
    result = run(snap, None, NOW)
    assert [a.workload_id for a in result.admissions] == ["want"]
    assert [e.workload_id for e in result.evictions] == ["big"]


def assert_owner_served(seed: int, snap: Snapshot, gang: str, kept: dict[str, int]) -> None:
    """The owner's gang starts within two cycles, and only other projects' work is
    taken, never their work within their quotas (`kept`: what each project's quota holds
    of its running work; a job larger than what the quota leaves is borrowed whole and
    may go, leaving the project below its deserved quota). (A victim project's own job within its
    guarantee may then take back a job of that project that runs over the quota: its
    business, at the same priority, named `borrowed`.)"""
    steps = cycles(snap, 2, start=NOW)
    admitted = [any(a.workload_id == gang for a in r.admissions) for _, r in steps]
    assert any(admitted), f"seed {seed}: the owner's gang still waits after two cycles"
    for before, result in steps:
        held = _held_gpus(before)
        after = dict(held)  # what each project holds once the cycle's decisions apply
        by_id = {w.id: w for w in before.workloads}
        reclaimed = set()
        for eviction in result.evictions:
            victim = by_id[eviction.workload_id]
            assert victim.queue_id != "owner"
            after[victim.queue_id] -= sum(p.gpus for p in victim.pods)
            if eviction.reason == EvictionReason.BORROWED:
                assert by_id[eviction.beneficiary or ""].queue_id == victim.queue_id
                continue
            assert eviction.reason == EvictionReason.RECLAIM
            reclaimed.add(victim.queue_id)
        for admission in result.admissions:
            wl = by_id[admission.workload_id]
            after[wl.queue_id] = after.get(wl.queue_id, 0) + sum(p.gpus for p in wl.pods)
        for qid in reclaimed:  # a reclaim never takes its victims' guaranteed work
            assert after[qid] >= min(kept[qid], held[qid]), (seed, qid, held, after)


def _held_gpus(snap: Snapshot) -> dict[str, int]:
    held: dict[str, int] = {}
    for wl in snap.workloads:
        if wl.placement is not None:
            held[wl.queue_id] = held.get(wl.queue_id, 0) + sum(len(p.gpus) for p in wl.placement)
    return held


def test_the_owner_does_not_wait_for_a_victims_checkpoint_due_soon() -> None:
    # Issue 24's case: b (quota 8) submits 4 one-GPU jobs while a runs 16 on a 16-GPU
    # pool, 8 of them on b's quota, every one 20 minutes past a half-hourly checkpoint.
    borrowed = [
        replace(
            running(job(f"a{i}", "a", t=i), f"n{i // 8}", [i % 8], started=NOW - 7200),
            checkpoint_interval_s=1800.0,
            last_checkpoint_time=NOW - 1200,
        )
        for i in range(16)
    ]
    mine = [job(f"b{i}", "b", t=NOW - 10) for i in range(4)]
    queues = [dept(), project("a", deserved=8), project("b", deserved=8)]
    (_, result), *_ = cycles(snapshot(nodes(2), queues, [*borrowed, *mine]), 1, start=NOW)
    assert sorted(a.workload_id for a in result.admissions) == ["b0", "b1", "b2", "b3"]
    assert {str(e.reason) for e in result.evictions} == {str(EvictionReason.RECLAIM)}


@FAST
@given(st.sampled_from([300.0, 600.0, 1800.0]), st.floats(min_value=0.5, max_value=0.99))
def test_an_over_quota_claim_waits_for_a_checkpoint_at_most_one_interval(
    interval: float, into: float
) -> None:
    # Inside a project over its quota, urgent work preempts a low-priority job whose
    # checkpoint is due: it waits for that checkpoint, but no longer than one interval
    # after it was submitted, even when every cycle lands just before the victim saves.
    urgent = job("urgent", "p", gpus=8, priority=10, t=NOW)
    queues = [dept(), project("p", deserved=0)]
    now, first_eviction = NOW, None
    while first_eviction is None and now <= NOW + 2 * interval:
        victim = replace(
            running(job("low", "p", gpus=8), "n0", range(8), started=NOW - 9000),
            checkpoint_interval_s=interval,
            last_checkpoint_time=now - into * interval,  # always due, never saved yet
        )
        result = cycles(snapshot(nodes(1), queues, [victim, urgent]), 1, start=now)[0][1]
        if result.evictions:
            first_eviction = now
        now += 60
    assert first_eviction is not None, "the wait for a checkpoint must be bounded"
    assert NOW < first_eviction <= NOW + interval + 60
