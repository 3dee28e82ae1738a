"""Small builders that keep engine scenarios readable: a cluster in one line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from scheduling.engine import schedule
from scheduling.engine.apply import apply_result
from scheduling.engine.types import (
    CycleResult,
    Gpu,
    Node,
    PodPlacement,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    Workload,
)

GPU_MEMORY = 40960


def nodes(
    count: int,
    gpus: int = 8,
    pool: str = "a",
    model: str = "A100",
    prefix: str = "n",
    racks: int = 1,
    start: int = 0,
) -> tuple[Node, ...]:
    """`count` nodes of `gpus` devices each, striped over `racks` racks."""
    return tuple(
        Node(
            id=f"{prefix}{i}",
            pool=pool,
            gpus=tuple(Gpu(j, model, GPU_MEMORY) for j in range(gpus)),
            topology={"rack": f"r{i % racks}"},
        )
        for i in range(start, start + count)
    )


def quota(
    deserved: float = 0, limit: float | None = None, weight: float = 1.0, **kw: bool
) -> Quota:
    return Quota(deserved=deserved, limit=limit, over_quota_weight=weight, **kw)


def project(qid: str, dept: str | None = "dept", pool: str = "a", **kw: object) -> Queue:
    """A project with a GPU quota in one pool: project("p", deserved=4, limit=8)."""
    return Queue(qid, dept, {(pool, Resource.GPU): quota(**kw)})  # type: ignore[arg-type]


def in_pools_a_b(qid: str, a: float, b: float) -> Queue:
    """A project of the department "dept" deserving `a` GPUs in pool a and `b` in pool b."""
    return Queue(qid, "dept", {("a", Resource.GPU): quota(a), ("b", Resource.GPU): quota(b)})


def dept(qid: str = "dept", pool: str = "a", **kw: object) -> Queue:
    return Queue(qid, None, {(pool, Resource.GPU): quota(**kw)} if kw else {})  # type: ignore[arg-type]


def job(
    wid: str,
    queue: str,
    gpus: int = 1,
    pods: int = 1,
    t: float = 0.0,
    **kw: object,
) -> Workload:
    """A pending job of `pods` pods with `gpus` whole GPUs each, submitted at t."""
    return Workload(wid, queue, (PodRequest(gpus=gpus),) * pods, submit_time=t, **kw)  # type: ignore[arg-type]


def frac(wid: str, queue: str, fraction: float, t: float = 0.0, **kw: object) -> Workload:
    return Workload(wid, queue, (PodRequest(gpu_fraction=fraction),), submit_time=t, **kw)  # type: ignore[arg-type]


def running(wl: Workload, node: str, gpus: Iterable[int], started: float = 0.0) -> Workload:
    """The workload running with its single pod on `node`, holding device indices."""
    placement = (PodPlacement(0, node, gpus=tuple(gpus)),)
    return replace(wl, placement=placement, started_at=started)


def sharing(wid: str, queue: str, share: float, gpu: int, started: float) -> Workload:
    """A fraction `share` of device `gpu` on n0, running since `started`."""
    placement = (PodPlacement(0, "n0", shared_gpu=gpu, share=share),)
    return replace(frac(wid, queue, share), placement=placement, started_at=started)


def snapshot(
    node_list: Iterable[Node], queues: Iterable[Queue], workloads: Iterable[Workload]
) -> Snapshot:
    """A snapshot whose device allocations agree with the running workloads."""
    node_list = tuple(node_list)
    base = Snapshot(
        tuple(sorted({n.pool for n in node_list})), node_list, tuple(queues), tuple(workloads)
    )
    return apply_result(base, CycleResult(), 0.0)


def run(snap: Snapshot, config: SchedulerConfig | None = None, now: float = 1000.0) -> CycleResult:
    return schedule(snap, config or SchedulerConfig(), now)


def placed(result: CycleResult) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """workload id -> [(node, whole device indices)] for each admission."""
    return {a.workload_id: [(p.node_id, p.gpus) for p in a.pods] for a in result.admissions}


def evicted(result: CycleResult) -> dict[str, str]:
    return {e.workload_id: str(e.reason) for e in result.evictions}


def cycles(
    snap: Snapshot, count: int, config: SchedulerConfig | None = None, start: float = 1000.0
) -> list[tuple[Snapshot, CycleResult]]:
    """Run `count` cycles 60 s apart, applying each result; returns every step."""
    steps = []
    now = start
    for _ in range(count):
        result = run(snap, config, now)
        steps.append((snap, result))
        snap = apply_result(snap, result, now)
        now += 60
    return steps
