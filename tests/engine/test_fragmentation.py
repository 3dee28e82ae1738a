"""Fragmentation (ATC'23 FGD measure), the decayed shape histogram, and packing by it."""

from __future__ import annotations

import random
from dataclasses import replace

from scheduling.engine.cycle import build_context
from scheduling.engine.fragmentation import (
    QUANTUM,
    UNITS,
    Shape,
    ShapeHistogram,
    ShapeTally,
    after_key,
    node_key,
)
from scheduling.engine.types import (
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    SchedulerConfig,
    Workload,
)
from tests.engine.builders import GPU_MEMORY, dept, placed, project, run, snapshot

QUEUES = [dept(), project("p1", deserved=64)]
FGD = SchedulerConfig(fragmentation_half_life_s=3600.0)
BEST_FIT = SchedulerConfig(fragmentation_half_life_s=None)

# A node with 32 cores, 64 GiB free and devices with 1000, 700, 300 and 0 units free.
NODE = node_key(32.0, 65536.0, [1000, 700, 300, 0])


def test_a_pod_that_does_not_fit_makes_every_free_unit_a_fragment() -> None:
    assert Shape(gpus=2).fragment(NODE) == 2000  # one whole device free only
    assert Shape(units=500, cpu=64).fragment(NODE) == 2000  # short of CPU


def test_a_fitting_pod_strands_the_devices_too_small_for_it() -> None:
    assert Shape(units=500).fragment(NODE) == 300
    assert Shape(gpus=1).fragment(NODE) == 1000  # partly used devices: 700 + 300
    assert Shape(units=200).fragment(NODE) == 0


def test_a_cpu_only_pod_can_use_no_gpu_capacity() -> None:
    assert Shape(cpu=4).fragment(NODE) == 2000


def test_the_histogram_scores_as_the_weighted_sum_over_shapes() -> None:
    rng = random.Random(7)
    shapes = {
        Shape(
            gpus=rng.choice([0, 0, 1, 2]),
            cpu=rng.choice([0, 4, 16, 40]),
            memory_mib=rng.choice([0, 8192, 70000]),
        ): rng.random()
        for _ in range(20)
    }
    shapes.update({Shape(units=rng.randint(1, 999), cpu=rng.choice([0, 8])): 1.0 for _ in range(8)})
    hist = ShapeHistogram(shapes, repeat=False)
    total = sum(shapes.values())
    for _ in range(50):
        frees = [rng.choice([0, 1000, rng.randint(0, 1000)]) for _ in range(rng.randint(0, 8))]
        key = node_key(rng.choice([0.0, 8.0, 48.0]), rng.choice([0.0, 9000.0, 1e6]), frees)
        expected = sum(w / total * s.fragment(key) for s, w in shapes.items())
        assert abs(hist.score(key) - expected) < 1e-6


def test_repeated_pods_count_the_gpus_their_cpu_cannot_reach() -> None:
    """8 free devices and 20 cores: two 8-core one-GPU pods fit, six devices stay unused."""
    hist = ShapeHistogram({Shape(gpus=1, cpu=8): 1.0})
    assert hist.score(node_key(20.0, float("inf"), [UNITS] * 8)) == 6000
    assert ShapeHistogram({Shape(gpus=1, cpu=8): 1.0}, repeat=False).score(
        node_key(20.0, float("inf"), [UNITS] * 8)
    ) == 0  # fmt: skip


def test_after_key_takes_units_from_the_named_device() -> None:
    assert after_key(NODE, 4.0, 1024.0, [(700, 500)]) == (28.0, 64512.0, (0, 200, 300, 1000))


def test_recent_shapes_outweigh_the_prior_and_fade_with_half_life() -> None:
    a, b = Shape(gpus=1), Shape(units=500)
    hist = ShapeHistogram({a: 1.0}, half_life=10.0, prior_weight=10.0)
    for t in range(30):
        hist.observe(b, float(t))
    assert hist.distribution()[b] > 0.5
    before = hist.version
    hist.observe(a, 1000.0)  # 97 half-lives later the b's weigh nothing
    assert hist.distribution().get(b, 0.0) < 1e-6
    assert hist.version > before  # the cache of scores was dropped


def _shared_on(node: str, device: int, share: float, wid: str) -> Workload:
    return Workload(
        wid,
        "p1",
        (PodRequest(gpu_fraction=share),),
        placement=(PodPlacement(0, node, shared_gpu=device, share=share),),
    )


def test_a_fraction_keeps_the_leftover_the_typical_pod_can_use() -> None:
    """Typical pods take half a GPU. Best fit puts 0.2 on the fuller device (0.5 free, 0.3
    left: useless); FGD puts it on the one with 0.7 free, where 0.5 still fits."""
    node = Node("n0", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(2)))
    work = [
        _shared_on("n0", 0, 0.3, "x"),
        _shared_on("n0", 1, 0.5, "y"),
        Workload("new", "p1", (PodRequest(gpu_fraction=0.2),), submit_time=999.0),
    ]
    snap = snapshot([node], QUEUES, work)
    plain = run(snap, BEST_FIT).admissions[0].pods[0].shared_gpu
    fgd = run(snap, FGD).admissions[0].pods[0].shared_gpu
    assert (plain, fgd) == (1, 0)


def test_a_whole_gpu_pod_goes_where_its_cpu_strands_no_gpu() -> None:
    """Both nodes have 8 free GPUs; n0 has 16 cores, n1 96. Typical pods take one GPU and
    8 cores. Best fit takes n0 by order and leaves its 7 GPUs without CPU; FGD takes n1."""
    small = Node("n0", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(8)), cpu=16)
    big = Node("n1", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(8)), cpu=96)
    new = Workload("new", "p1", (PodRequest(gpus=1, cpu=12),), submit_time=999.0)
    # Pending on a model the pool lacks: they shape the histogram but are never placed.
    typical = Workload("old", "p1", (PodRequest(gpus=1, cpu=8),), submit_time=990.0,
                       gpu_models=("H100",))  # fmt: skip
    snap = snapshot([small, big], QUEUES, [new, replace(typical, id="o1"), typical])
    assert placed(run(snap, BEST_FIT))["new"][0][0] == "n0"
    assert placed(run(snap, FGD))["new"][0][0] == "n1"


def test_a_cpu_heavy_pod_goes_to_the_node_without_gpus() -> None:
    gpu_node = Node("n0", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(4)), cpu=64)
    cpu_node = Node("n1", "a", (), cpu=64)
    heavy = Workload("heavy", "p1", (PodRequest(cpu=48),), submit_time=999.0)
    typical = Workload(
        "t", "p1", (PodRequest(gpus=1, cpu=16),), submit_time=990.0, gpu_models=("H100",)
    )
    snap = snapshot([gpu_node, cpu_node], QUEUES, [heavy, typical])
    assert placed(run(snap, FGD))["heavy"][0][0] == "n1"


def test_the_default_cycle_packs_by_fragmentation() -> None:
    assert SchedulerConfig().fragmentation_half_life_s
    small = Node("n0", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(8)), cpu=16)
    big = Node("n1", "a", tuple(Gpu(i, "A100", GPU_MEMORY) for i in range(8)), cpu=96)
    new = Workload("new", "p1", (PodRequest(gpus=1, cpu=12),), submit_time=999.0)
    typical = Workload("old", "p1", (PodRequest(gpus=1, cpu=8),), submit_time=990.0,
                       gpu_models=("H100",))  # fmt: skip
    snap = snapshot([small, big], QUEUES, [new, replace(typical, id="o1"), typical])
    assert placed(run(snap))["new"][0][0] == "n1"


def _random_workload(rng: random.Random, i: int) -> Workload:
    kind = rng.random()
    if kind < 0.4:
        pod = PodRequest(gpu_fraction=rng.choice((0.25, 0.5)), cpu=rng.choice((2.0, 4.0)))
    elif kind < 0.6:
        pod = PodRequest(gpu_memory_mib=rng.choice((10240, 20480)))
    else:
        pod = PodRequest(gpus=rng.choice((1, 2)), cpu=8.0, memory_mib=16384)
    return Workload(f"w{i}", "p1", (pod,) * rng.randint(1, 3), submit_time=rng.uniform(0, 7200))


def test_a_kept_tally_gives_the_histogram_a_fresh_one_gives() -> None:
    rng = random.Random(5)
    present: dict[str, Workload] = {}
    tally = ShapeTally((), GPU_MEMORY)
    for i in range(400):
        if present and rng.random() < 0.4:
            wid = rng.choice(sorted(present))
            old = present.pop(wid)
            new = _random_workload(rng, i) if rng.random() < 0.5 else None
            if new is not None:
                new = replace(new, id=wid)
                present[wid] = new
            tally.change(old, new)
        else:
            wl = _random_workload(rng, i)
            present[wl.id] = wl
            tally.change(None, wl)
        if i % 50 == 0:
            fresh = ShapeTally(present.values(), GPU_MEMORY)
            assert tally.counts == fresh.counts
            assert tally.histogram(7200.0, 1800.0) is fresh.histogram(7200.0, 1800.0)
    assert tally.counts, "the sequence left workloads to count"


def test_the_histogram_weighs_recent_minutes_more_and_is_rounded() -> None:
    old = Workload("o", "p1", (PodRequest(gpus=1),), submit_time=0.0)
    new = Workload("n", "p1", (PodRequest(gpu_fraction=0.5),), submit_time=3600.0)
    hist = ShapeTally([old, new], GPU_MEMORY).histogram(3600.0, 1800.0)
    mix = dict(hist.shapes)
    # Two half-lives apart (less half a minute): the new shape weighs about 4 times the old.
    assert mix[Shape(units=500)] > 3.5 * mix[Shape(gpus=1)]
    # Rounded to 1/QUANTUM: a second later the weights barely moved, the histogram (and
    # its cache of node scores) is the same object.
    assert ShapeTally([old, new], GPU_MEMORY).histogram(3601.0, 1800.0) is hist
    assert QUANTUM >= 256


def test_a_pod_is_scored_on_a_bounded_set_of_nodes_and_still_finds_the_one_that_fits() -> None:
    """300 nodes with 8 free GPUs, all but the last 5 without the CPU the pod asks: the
    candidates are the first that fit in each bucket, at most `fragmentation_candidates`
    of them, and the pod lands on the first node that has the CPU."""
    nodes = [
        Node(
            f"n{i:03d}",
            "a",
            tuple(Gpu(j, "A100", GPU_MEMORY) for j in range(8)),
            cpu=64 if i >= 295 else 4,
        )
        for i in range(300)
    ]
    new = Workload("new", "p1", (PodRequest(gpus=1, cpu=16),), submit_time=999.0)
    snap = snapshot(nodes, QUEUES, [new])
    ctx = build_context(snap, SchedulerConfig(), 1000.0)
    pod = new.pods[0]
    found = ctx.placer._candidates(pod, "a", ["A100"])
    assert [n.id for n in found] == ["n295", "n296"]
    assert placed(run(snap))["new"][0][0] == "n295"
