"""Elastic workloads: rules that mutation testing found unguarded (docs/engine.md,
"Mutation testing", the fourth run)."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import PodPlacement, Resource, Workload
from tests.engine.builders import dept, job, nodes, project, run, snapshot


def _elastic_on_n0(wid: str, low: int, high: int, devices: list[int]) -> Workload:
    """e's elastic job of `low` to `high` one-GPU pods, running one on each device of n0."""
    wl = job(wid, "e", pods=high, min_pods=low, elastic=True, pools=("a", "b"))
    pods = tuple(PodPlacement(i, "n0", gpus=(gpu,)) for i, gpu in enumerate(devices))
    return replace(wl, placement=pods, started_at=0.0)


def test_the_fair_share_counts_what_elastic_work_could_still_grow_by() -> None:
    # Pools a (16 GPUs) and b (8), more than e asks for: e's fair share is its demand.
    # In pool a, where its running jobs are: d at its maximum (2), g holding 2 of 4:
    # 2 + 2 + the 2 pods g lacks. In pool b: the pending job p, a gang of its minimum 2,
    # and the one pod it could grow by; none for g, which grows only where it runs.
    work = [
        _elastic_on_n0("d", 1, 2, [0, 1]),
        _elastic_on_n0("g", 1, 4, [2, 3]),
        job("p", "e", pods=3, min_pods=2, elastic=True, pools=("b",)),
    ]
    cluster = (*nodes(1, 16), *nodes(1, 8, pool="b", prefix="m"))
    result = run(snapshot(cluster, [dept(), project("e")], work))
    shares = {
        k[1]: v for k, v in result.fair_shares.items() if k[0] == "e" and k[2] is Resource.GPU
    }
    assert shares == {"a": 6.0, "b": 3.0}


def test_idle_gpus_grow_a_projects_elastic_jobs_by_priority() -> None:
    # One idle GPU: y (priority 5, newer) grows before x (priority 0).
    x = replace(_elastic_on_n0("x", 1, 2, [0]), priority=0, submit_time=0.0)
    y = replace(_elastic_on_n0("y", 1, 2, [1]), priority=5, submit_time=1.0)
    result = run(snapshot(nodes(1, 3), [dept(), project("e")], [x, y]))
    assert [(r.workload_id, [p.gpus for p in r.added]) for r in result.resizes] == [("y", [(2,)])]
