"""Dynamic MIG in the engine: the profile table, placement rules and their invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.apply import apply_result, remove_workloads
from scheduling.engine.mig import (
    AUTO,
    canonical_model,
    pod_fraction,
    profile_for,
    profiles_for,
    table,
)
from scheduling.engine.mig_profiles import MEMORY_SLICES, PROFILES
from scheduling.engine.types import (
    Gpu,
    MigInstance,
    Node,
    PodRequest,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)
from tests.engine.builders import dept, project, run, snapshot

H100 = "H100-80GB"
MEM = 81920


def mig_node(nid: str = "n0", gpus: int = 1, repartition: bool = True, **kw: object) -> Node:
    instances: tuple[MigInstance, ...] = kw.pop("instances", ())  # type: ignore[assignment]
    return Node(
        nid,
        "a",
        tuple(Gpu(i, H100, MEM, mig=True, mig_instances=instances) for i in range(gpus)),
        mig_repartition=repartition,
    )


def mig_job(wid: str, profile: str, queue: str = "p", t: float = 0.0, mib: int = 0) -> Workload:
    return Workload(
        wid, queue, (PodRequest(mig_profile=profile, gpu_memory_mib=mib),), submit_time=t
    )


def queues(deserved: float = 8) -> list:
    return [dept(), project("p", deserved=deserved)]


def mig_of(result) -> dict[str, tuple[str, int, str, int]]:
    """workload -> (node, device, profile, start) of its single pod."""
    out = {}
    for a in result.admissions:
        p = a.pods[0]
        out[a.workload_id] = (p.node_id, p.mig_gpu, p.mig_profile, p.mig_start)
    return out


# -- the table ----------------------------------------------------------------------


def test_the_table_covers_the_four_models_and_every_start_fits_the_device():
    assert set(PROFILES) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}
    for model in PROFILES:
        for p in table(model).values():
            assert all(s + p.size <= MEMORY_SLICES for s in p.starts), (model, p)
            assert all(s % p.size == 0 or p.size == 1 for s in p.starts)


def test_device_names_map_to_their_table_by_family_and_memory():
    assert canonical_model("NVIDIA H100 80GB HBM3") == "H100-80GB"
    assert canonical_model("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert canonical_model("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert canonical_model("NVIDIA A100", 40960) == "A100-40GB"
    assert canonical_model("NVIDIA H200", 143771) == "H200-141GB"
    assert canonical_model("Tesla T4", 15360) is None


def test_a_memory_request_maps_to_the_smallest_profile_that_holds_it():
    h100 = profiles_for(H100)
    assert profile_for(PodRequest(mig_profile=AUTO, gpu_memory_mib=9000), h100).name == "1g.10gb"
    assert profile_for(PodRequest(mig_profile=AUTO, gpu_memory_mib=15000), h100).name == "1g.20gb"
    assert profile_for(PodRequest(mig_profile=AUTO, gpu_memory_mib=30000), h100).name == "3g.40gb"
    assert profile_for(PodRequest(mig_profile=AUTO, gpu_memory_mib=90000), h100) is None
    a40 = profiles_for("A100-40GB")
    assert profile_for(PodRequest(mig_profile=AUTO, gpu_memory_mib=15000), a40).name == "3g.20gb"


def test_a_mig_slice_counts_as_its_part_of_the_gpu():
    assert pod_fraction(PodRequest(mig_profile="3g.40gb")) == pytest.approx(3 / 7)
    assert pod_fraction(PodRequest(mig_profile="7g.80gb")) == 1.0


# -- the cycle ----------------------------------------------------------------------


def test_an_empty_mig_gpu_gets_the_instance_cut_at_a_legal_start():
    snap = snapshot([mig_node()], queues(), [mig_job("w", "3g.40gb")])
    result = run(snap)
    # start 4, not 0: the other half stays open for a 4g.40gb (at 0 it would block it)
    assert mig_of(result) == {"w": ("n0", 0, "3g.40gb", 4)}
    assert result.allocations[("p", "a", Resource.GPU)] == pytest.approx(3 / 7, abs=1e-3)


def test_an_idle_instance_of_the_same_profile_is_reused_before_free_space():
    idle = (MigInstance("1g.10gb", 6),)
    snap = snapshot([mig_node(instances=idle)], queues(), [mig_job("w", "1g.10gb")])
    assert mig_of(run(snap)) == {"w": ("n0", 0, "1g.10gb", 6)}


def test_an_idle_instance_is_destroyed_only_when_the_workload_fits_nowhere_else():
    idle = (MigInstance("4g.40gb", 0),)
    free_elsewhere = snapshot(
        [mig_node("n0", instances=idle), mig_node("n1")], queues(), [mig_job("w", "4g.40gb")]
    )
    assert mig_of(run(free_elsewhere))["w"][:2] == ("n0", 0)  # reuse
    seven = snapshot([mig_node("n0", instances=idle)], queues(), [mig_job("w", "7g.80gb")])
    assert mig_of(run(seven)) == {"w": ("n0", 0, "7g.80gb", 0)}  # repartitioned
    no = snapshot(
        [mig_node("n0", instances=idle, repartition=False)], queues(), [mig_job("w", "7g.80gb")]
    )
    assert mig_of(run(no)) == {}


def test_an_instance_in_use_is_never_destroyed():
    busy = (MigInstance("1g.10gb", 3, "x"),)
    wl = replace(
        mig_job("x", "1g.10gb"),
        placement=(replace_placement("n0", 0, "1g.10gb", 3),),
    )
    snap = snapshot([mig_node(instances=busy)], queues(), [wl, mig_job("w", "7g.80gb")])
    result = run(snap)
    assert "w" not in mig_of(result) and "w" in result.pending_reasons


def replace_placement(node: str, gpu: int, profile: str, start: int):
    from scheduling.engine.types import PodPlacement

    return PodPlacement(0, node, mig_gpu=gpu, mig_profile=profile, mig_start=start)


def test_a_finished_workload_leaves_its_instance_for_the_next_of_the_same_shape():
    snap = snapshot([mig_node()], queues(), [mig_job("w1", "2g.20gb")])
    snap = apply_result(snap, run(snap), 1000.0)
    snap = remove_workloads(snap, {"w1"})
    (left,) = snap.nodes[0].gpus[0].mig_instances
    assert (left.profile, left.workload_id) == ("2g.20gb", None)
    snap = replace(snap, workloads=(mig_job("w2", "2g.20gb", t=5),))
    assert mig_of(run(snap)) == {"w2": ("n0", 0, "2g.20gb", left.start)}


def test_seven_small_instances_fill_a_gpu_and_the_eighth_waits():
    jobs = [mig_job(f"w{i}", "1g.10gb", t=i) for i in range(8)]
    result = run(snapshot([mig_node()], queues(), jobs))
    starts = sorted(v[3] for v in mig_of(result).values())
    assert starts == [0, 1, 2, 3, 4, 5, 6]
    assert "w7" in result.pending_reasons


def test_mig_and_whole_gpu_work_never_share_a_device():
    node = Node("n0", "a", (Gpu(0, H100, MEM, mig=True), Gpu(1, H100, MEM)))
    whole = Workload("whole", "p", (PodRequest(gpus=2),))
    result = run(snapshot([node], queues(), [whole, mig_job("m", "1g.10gb")]))
    assert "whole" in result.pending_reasons
    assert mig_of(result)["m"][:2] == ("n0", 0)


def test_a_profile_the_model_lacks_waits():
    result = run(snapshot([mig_node()], queues(), [mig_job("w", "3g.20gb")]))
    assert result.pending_reasons["w"] == (
        "no MIG-enabled GPU in pool a offers 3g.20gb (H100-80GB)"
    )


def test_a_full_mig_pool_says_why_the_pod_waits():
    jobs = [mig_job("a", "7g.80gb"), mig_job("b", "1g.10gb", t=1)]
    result = run(snapshot([mig_node()], queues(), jobs))
    assert result.pending_reasons["b"] == (
        "needs a 1g.10gb MIG instance in pool a; no MIG-enabled GPU has room for it beside"
        " the instances in use"
    )
    plain = Node("n0", "a", (Gpu(0, H100, MEM),))
    result = run(snapshot([plain], queues(), [mig_job("c", "1g.10gb")]))
    assert result.pending_reasons["c"] == "pool a has no MIG-enabled GPU"


# -- invariants (hypothesis) --------------------------------------------------------

H100_PROFILES = list(table(H100))
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _legal(inst: MigInstance) -> bool:
    p = table(H100).get(inst.profile)
    return p is not None and inst.start in p.starts


def _masks(instances: tuple[MigInstance, ...]) -> list[int]:
    return [table(H100)[i.profile].mask(i.start) for i in instances]


@st.composite
def mig_histories(draw):
    """A few cycles of MIG work arriving and finishing on two MIG GPUs."""
    steps = draw(
        st.lists(
            st.tuples(
                st.lists(st.sampled_from([*H100_PROFILES, AUTO]), max_size=6),
                st.integers(min_value=0, max_value=4),  # how many running finish
                st.booleans(),
            ),
            min_size=1,
            max_size=5,
        )
    )
    return steps, draw(st.booleans())


@FAST
@given(mig_histories())
def test_mig_placement_invariants_hold_over_random_histories(history):
    steps, repartition = history
    snap = snapshot([mig_node("n0", 2, repartition)], queues(16), [])
    n = 0
    for now, (arrivals, finish, _) in enumerate(steps, start=1):
        new = [
            mig_job(f"w{n + i}", prof, t=now, mib=20000 if prof == AUTO else 0)
            for i, prof in enumerate(arrivals)
        ]
        n += len(new)
        snap = replace(snap, workloads=snap.workloads + tuple(new))
        before = {g.index: g.mig_instances for g in snap.nodes[0].gpus}
        result = run(snap, SchedulerConfig(), now * 100.0)
        after = apply_result(snap, result, now * 100.0)
        for gpu in after.nodes[0].gpus:
            instances = gpu.mig_instances
            # only legal starts, nothing overlaps
            assert all(_legal(i) for i in instances)
            masks = _masks(instances)
            combined = 0
            for m in masks:
                assert not combined & m
                combined |= m
            # an instance in use before the cycle is still there, with its holder
            for inst in before[gpu.index]:
                if inst.workload_id is not None:
                    assert inst in instances
            if not repartition:
                for inst in before[gpu.index]:
                    kept = {(i.profile, i.start) for i in instances}
                    assert (inst.profile, inst.start) in kept
        # reuse before a new cut: a profile cut anew this cycle left no instance of it that
        # was idle before the cycle still idle after it, on any device
        old = {(g.index, i.profile, i.start) for g in snap.nodes[0].gpus for i in g.mig_instances}
        idle_before = {
            (g.index, i.profile, i.start)
            for g in snap.nodes[0].gpus
            for i in g.mig_instances
            if i.workload_id is None
        }
        now_all = [(g.index, i) for g in after.nodes[0].gpus for i in g.mig_instances]
        cut = {i.profile for d, i in now_all if (d, i.profile, i.start) not in old}
        still_idle = {(d, i.profile, i.start) for d, i in now_all if i.workload_id is None}
        assert not {k for k in idle_before & still_idle if k[1] in cut}
        running = [w for w in after.workloads if w.placement]
        snap = remove_workloads(after, {w.id for w in running[:finish]})


def test_reuse_comes_before_a_new_cut_anywhere_in_the_pool():
    idle = (MigInstance("2g.20gb", 4),)
    nodes = [mig_node("n0"), mig_node("n1", instances=idle)]
    result = run(snapshot(nodes, queues(), [mig_job("w", "2g.20gb")]))
    assert mig_of(result) == {"w": ("n1", 0, "2g.20gb", 4)}


def test_snapshot_with_no_mig_keeps_its_old_decisions():
    # A MIG-free cluster takes none of the new paths.
    node = Node("n0", "a", (Gpu(0, H100, MEM), Gpu(1, H100, MEM)))
    snap = Snapshot(("a",), (node,), tuple(queues()), (Workload("w", "p", (PodRequest(gpus=1),)),))
    assert [a.pods[0].gpus for a in run(snap).admissions] == [(0,)]
