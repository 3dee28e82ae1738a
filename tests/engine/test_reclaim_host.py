"""Reclaim where the GPUs are free but the host is not (issue 24, found last round).

A node can have free GPUs while borrowed work holds its CPU or memory: the owner's pod
fits the GPUs but not the host. The victim search counted only devices, so it saw
"room already there" and never evicted on such a node: the owner, within its deserved
quota, waited for ever. The search now counts the host CPU and memory a victim frees on
the node too.

Breaks checked: with `_NodePlan` ignoring the host (the old `start` returning None when
the devices alone had room) both tests fail: nothing is evicted.
"""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import EvictionReason, PodPlacement, PodRequest, Workload
from tests.engine.builders import cycles, dept, nodes, project, snapshot


def _borrower(i: int, cpu: float, memory_mib: int) -> Workload:
    """A running one-GPU job of project `b` (deserved 0: all of it borrowed)."""
    pod = PodRequest(gpus=1, cpu=cpu, memory_mib=memory_mib)
    return Workload(
        f"b{i}",
        "b",
        (pod,),
        submit_time=0.0,
        placement=(PodPlacement(0, "n0", gpus=(i,)),),
        started_at=100.0 + i,
    )


def _run(cpu_each: float, mem_each: int, owner_pod: PodRequest):
    node = replace(nodes(1)[0], cpu=32.0, memory_mib=64 * 1024)
    borrowers = [_borrower(i, cpu_each, mem_each) for i in range(4)]
    owner = Workload("own", "o", (owner_pod,), submit_time=900.0)
    queues = [dept(), project("o", deserved=4), project("b", deserved=0)]
    snap = snapshot([node], queues, [*borrowers, owner])
    return cycles(snap, 2)


def _outcome(steps) -> tuple[set[str], list[EvictionReason]]:
    admitted = {a.workload_id for _, r in steps for a in r.admissions}
    reasons = [e.reason for _, r in steps for e in r.evictions]
    return admitted, reasons


def test_owner_gets_room_when_borrowers_hold_the_cpu() -> None:
    """4 GPUs free, all 32 cores held by borrowed work: one borrower goes, the owner runs."""
    steps = _run(8.0, 1024, PodRequest(gpus=1, cpu=4.0, memory_mib=1024))
    admitted, reasons = _outcome(steps)
    assert "own" in admitted
    assert reasons == [EvictionReason.RECLAIM]


def test_owner_gets_room_when_borrowers_hold_the_memory() -> None:
    """Memory likewise: each borrower holds 16 GiB of the node's 64; the owner needs 20."""
    steps = _run(1.0, 16 * 1024, PodRequest(gpus=1, cpu=1.0, memory_mib=20 * 1024))
    admitted, reasons = _outcome(steps)
    assert "own" in admitted
    assert reasons == [EvictionReason.RECLAIM, EvictionReason.RECLAIM]
