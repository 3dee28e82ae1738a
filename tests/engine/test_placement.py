"""Placement: bin packing, spread, fractions, gangs and topology."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.placement import fill_table
from scheduling.engine.state import UNITS
from scheduling.engine.types import (
    Gpu,
    GpuShare,
    Node,
    PlacementStrategy,
    PodPlacement,
    PodRequest,
    SchedulerConfig,
    TopologyConstraint,
    TopologyMode,
    Workload,
)
from tests.engine.builders import dept, frac, job, nodes, placed, project, run, running, snapshot

QUEUES = [dept(), project("p1", deserved=64)]


def _half_full() -> list[Workload]:
    return [running(job("old", "p1", gpus=6), "n0", range(6))]


def test_bin_packing_fills_the_partly_used_node_first() -> None:
    snap = snapshot(nodes(2), QUEUES, [*_half_full(), job("new", "p1", gpus=2)])
    assert placed(run(snap)) == {"new": [("n0", (6, 7))]}


def test_spread_puts_the_pod_on_the_emptiest_node() -> None:
    snap = snapshot(nodes(2), QUEUES, [*_half_full(), job("new", "p1", gpus=2)])
    config = SchedulerConfig(placement={"a": PlacementStrategy.SPREAD})
    assert placed(run(snap, config)) == {"new": [("n1", (0, 1))]}


def _shared(*shares: tuple[str, float]) -> list[Workload]:
    """Running fractional workloads on n0, one per (id, share) on devices 0, 1, ..."""
    return [
        Workload(
            wid,
            "p1",
            (PodRequest(gpu_fraction=share),),
            placement=(PodPlacement(0, "n0", shared_gpu=i, share=share, gpu_memory_mib=0),),
        )
        for i, (wid, share) in enumerate(shares)
    ]


def test_a_fraction_packs_onto_an_already_shared_gpu_before_opening_a_new_one() -> None:
    snap = snapshot(nodes(1, gpus=4), QUEUES, [*_shared(("x", 0.5)), frac("new", "p1", 0.25)])
    result = run(snap)
    (admission,) = result.admissions
    assert (admission.pods[0].node_id, admission.pods[0].shared_gpu) == ("n0", 0)
    assert admission.pods[0].share == 0.25


def test_a_fraction_goes_where_its_leftover_still_fits_the_sizes_waiting() -> None:
    # Device 0 has 0.9 free and device 1 has 0.5. Best fit would put 0.4 on device 1 and
    # strand 0.1 there; fragmentation-aware placement puts it on device 0, leaving 0.5 free
    # on each, both useful to the 0.5 waiting behind it.
    workloads = [
        *_shared(("x", 0.1), ("y", 0.5)),
        frac("a", "p1", 0.4, priority=10),
        frac("b", "p1", 0.5, t=1),
    ]
    snap = snapshot(nodes(1, gpus=2), QUEUES, workloads)
    # Plain bin packing (fragmentation off) reads the sizes waiting to fill the devices.
    plain = run(snap, SchedulerConfig(fragmentation_half_life_s=None))
    assert {a.workload_id: a.pods[0].shared_gpu for a in plain.admissions} == {"a": 0, "b": 1}
    # The default packs against the shapes' histogram: the same choice for a; b then fits
    # either device (0.5 free on each) and takes the first.
    result = run(snap)
    where = {a.workload_id: a.pods[0].shared_gpu for a in result.admissions}
    assert where == {"a": 0, "b": 0}


def test_the_fill_table_knows_what_waiting_sizes_can_use() -> None:
    fill = fill_table([400, 500])
    assert (fill[100], fill[500], fill[850], fill[UNITS]) == (0, 500, 800, UNITS)


def test_whole_and_shared_use_never_mix_on_one_device() -> None:
    # One device is shared at 0.5, the other is free: the whole-GPU pod takes the free one
    # and a second whole-GPU pod cannot use the half-empty shared device.
    workloads = [*_shared(("x", 0.5)), job("w1", "p1"), job("w2", "p1", t=1)]
    snap = snapshot(nodes(1, gpus=2), QUEUES, workloads)
    result = run(snap)
    assert placed(result) == {"w1": [("n0", (1,))]}
    assert result.pending_reasons["w2"] == "needs 1 GPU in pool a; 0 are free"


def test_a_fraction_never_lands_on_a_device_held_whole() -> None:
    snap = snapshot(
        nodes(1, gpus=1), QUEUES, [running(job("w", "p1"), "n0", [0]), frac("f", "p1", 0.1)]
    )
    result = run(snap)
    assert result.admissions == ()
    assert result.pending_reasons["f"].startswith("needs 0.1 of a GPU in pool a")


def test_a_gpu_memory_request_is_converted_to_a_share_of_the_device() -> None:
    wl = Workload("m", "p1", (PodRequest(gpu_memory_mib=10240),))
    snap = snapshot(nodes(1, gpus=1), QUEUES, [wl])
    (admission,) = run(snap).admissions
    assert admission.pods[0].share == 0.25
    assert admission.pods[0].gpu_memory_mib == 10240


def test_a_gang_is_placed_whole_across_nodes() -> None:
    snap = snapshot(nodes(3, gpus=4), QUEUES, [job("g", "p1", gpus=4, pods=3)])
    assert placed(run(snap)) == {
        "g": [("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3))]
    }


def test_a_gang_that_does_not_fit_whole_takes_nothing() -> None:
    snap = snapshot(nodes(2, gpus=4), QUEUES, [job("g", "p1", gpus=4, pods=3)])
    result = run(snap)
    assert result.admissions == ()
    assert result.pending_reasons["g"] == "needs 12 GPUs in pool a; 8 are free"


def test_a_gang_with_a_minimum_starts_with_the_pods_that_fit() -> None:
    snap = snapshot(nodes(2, gpus=4), QUEUES, [job("g", "p1", gpus=4, pods=3, min_pods=2)])
    (admission,) = run(snap).admissions
    assert [p.pod for p in admission.pods] == [0, 1]


def _two_racks() -> tuple[Node, ...]:
    # Racks stripe by node number: n0, n2 in r0; n1, n3 in r1.
    return nodes(4, gpus=8, racks=2)


def test_a_required_rack_keeps_the_whole_gang_inside_one_rack() -> None:
    # r0 has 4 + 4 free, r1 has 8 + 8: only r1 can hold two 8-GPU pods.
    busy = [
        running(job("b0", "p1", gpus=4), "n0", range(4)),
        running(job("b2", "p1", gpus=4), "n2", range(4)),
    ]
    gang = job("g", "p1", gpus=8, pods=2, topology=TopologyConstraint("rack"))
    snap = snapshot(_two_racks(), QUEUES, [*busy, gang])
    assert {node for node, _ in placed(run(snap))["g"]} == {"n1", "n3"}


def test_a_required_rack_that_no_rack_can_hold_makes_the_gang_wait() -> None:
    # The busy jobs cannot move, or consolidation would move one to make room.
    busy = [
        running(job(f"b{i}", "p1", gpus=8, preemptible=False), f"n{i}", range(8)) for i in (0, 1)
    ]
    gang = job("g", "p1", gpus=8, pods=2, topology=TopologyConstraint("rack"))
    snap = snapshot(_two_racks(), QUEUES, [*busy, gang])
    result = run(snap)
    assert result.admissions == ()
    assert result.pending_reasons["g"] == (
        "needs 16 GPUs inside one rack; the most free in one rack of pool a is 8"
    )


def test_a_preferred_rack_packs_the_gang_into_as_few_racks_as_possible() -> None:
    # Bin packing alone would pick the two half-full nodes, one in each rack.
    busy = [
        running(job("b0", "p1", gpus=4), "n1", range(4)),
        running(job("b2", "p1", gpus=4), "n2", range(4)),
    ]
    preferred = TopologyConstraint("rack", TopologyMode.PREFERRED)
    gang = job("g", "p1", gpus=4, pods=2, topology=preferred)
    plain = job("g", "p1", gpus=4, pods=2)
    with_pref = placed(run(snapshot(_two_racks(), QUEUES, [*busy, gang])))["g"]
    without = placed(run(snapshot(_two_racks(), QUEUES, [*busy, plain])))["g"]
    racks = {"n0": "r0", "n1": "r1", "n2": "r0", "n3": "r1"}
    assert len({racks[n] for n, _ in with_pref}) == 1
    assert len({racks[n] for n, _ in without}) == 2


def test_cpu_and_memory_on_the_node_are_respected() -> None:
    cluster = tuple(replace(n, cpu=8.0, memory_mib=65536) for n in nodes(2, gpus=2))
    pods = (PodRequest(gpus=1, cpu=6.0),)
    snap = snapshot(
        cluster, QUEUES, [Workload("a", "p1", pods), Workload("b", "p1", pods, submit_time=1)]
    )
    assert {w: p[0][0] for w, p in placed(run(snap)).items()} == {"a": "n0", "b": "n1"}


def test_devices_held_by_pods_outside_the_snapshot_count_as_taken() -> None:
    cluster = nodes(1, gpus=2)
    foreign = replace(
        cluster[0],
        gpus=(
            replace(cluster[0].gpus[0], whole_by="other"),
            Gpu(1, "A100", 40960, shares=(GpuShare("z", 0.5),)),
        ),
    )
    snap = snapshot((foreign,), QUEUES, [job("j", "p1")])
    assert run(snap).admissions == ()
