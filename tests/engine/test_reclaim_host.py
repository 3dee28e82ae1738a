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


def _sharer(i: int, gpu: int, cpu: float, started: float, share: float = 0.5) -> Workload:
    """A running job of borrower `b` holding `share` of device `gpu` of n0 and `cpu` cores."""
    pod = PodRequest(gpu_fraction=share, cpu=cpu)
    placement = (PodPlacement(0, "n0", shared_gpu=gpu, share=share),)
    return Workload(f"s{i}", "b", (pod,), submit_time=0.0, placement=placement, started_at=started)


def test_host_room_is_made_with_the_fewest_victims_even_when_none_frees_a_device() -> None:
    """Four half-GPU borrowers share devices 0 and 1 of three and hold all 32 cores;
    device 2 is free (room for exactly one pod by devices). The owner needs 12 cores: the
    two cheapest borrowers (the latest started, one on each device) free 16, and no
    device. Two evictions; a search that waited for a freed
    device too (`devices_done` dropped or forgotten between victims) takes a third, and
    one that kept only the last victim's cores (`=` for `+=`) never finds room; one that
    counted room by devices only above one pod (`> 1`) waited for a freed device too."""
    node = replace(nodes(1, gpus=3)[0], cpu=32.0)
    sharers = [_sharer(i, i % 2, 8.0, 100.0 + i) for i in range(4)]
    owner = Workload("own", "o", (PodRequest(gpus=1, cpu=12.0),), submit_time=900.0)
    queues = [dept(), project("o", deserved=4), project("b", deserved=0)]
    steps = cycles(snapshot([node], queues, [*sharers, owner]), 2)
    admitted, reasons = _outcome(steps)
    assert "own" in admitted
    assert sorted(e.workload_id for _, r in steps for e in r.evictions) == ["s2", "s3"]


def test_a_gang_asks_host_room_for_whole_pods_only() -> None:
    """A 2-pod gang of 2 GPUs and 8 cores a pod; the node has 3 free devices (room for one
    pod by devices, not 1.5) and 8 free cores; five 1-GPU borrowers hold 4 cores each. Room
    for one pod more is 4 devices and 16 cores: two evictions (counting 1.5 pods by devices,
    `/` for `//`, asked 20 cores and took a third)."""
    node = replace(nodes(1)[0], cpu=28.0)
    borrowers = [_borrower(i, 4.0, 1024) for i in range(5)]
    gang = Workload("gang", "o", (PodRequest(gpus=2, cpu=8.0),) * 2, submit_time=900.0)
    queues = [dept(), project("o", deserved=4), project("b", deserved=0)]
    steps = cycles(snapshot([node], queues, [*borrowers, gang]), 2)
    admitted, reasons = _outcome(steps)
    assert "gang" in admitted
    assert reasons == [EvictionReason.RECLAIM] * 2


def test_a_fraction_with_device_room_frees_only_host_room() -> None:
    """Two quarter-GPU borrowers hold device 0 (half of it free) and all 32 cores. The
    owner's half-GPU pod fits the device; it needs 8 cores: one borrower goes. (A plan
    that did not count the shared room as room took both, to free a whole device.)"""
    node = replace(nodes(1, gpus=1)[0], cpu=32.0)
    sharers = [_sharer(i, 0, 16.0, 100.0 + i, share=0.25) for i in range(2)]
    owner = Workload("own", "o", (PodRequest(gpu_fraction=0.5, cpu=8.0),), submit_time=900.0)
    queues = [dept(), project("o", deserved=1), project("b", deserved=0)]
    steps = cycles(snapshot([node], queues, [*sharers, owner]), 2)
    admitted, reasons = _outcome(steps)
    assert "own" in admitted
    assert reasons == [EvictionReason.RECLAIM]


def test_a_gang_whose_devices_are_free_frees_host_room_for_its_pods_only() -> None:
    """Exactly 2 devices free for a gang of two 1-GPU pods of 8 cores; six borrowers hold 5
    cores each of 32 (2 free). Host room for the two pods (16 cores) takes three
    evictions. (A plan that asked room for a pod more than the devices hold, as when they
    have none, asked 24 cores and took five.)"""
    node = replace(nodes(1)[0], cpu=32.0)
    borrowers = [_borrower(i, 5.0, 1024) for i in range(6)]
    gang = Workload("gang", "o", (PodRequest(gpus=1, cpu=8.0),) * 2, submit_time=900.0)
    queues = [dept(), project("o", deserved=4), project("b", deserved=0)]
    steps = cycles(snapshot([node], queues, [*borrowers, gang]), 2)
    admitted, reasons = _outcome(steps)
    assert "gang" in admitted
    assert reasons == [EvictionReason.RECLAIM] * 3
