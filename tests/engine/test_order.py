"""The allocation order is hierarchical (department, then project, then priority and
age), and the cycle reports the order in which it considered pending workloads."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine.types import PodRequest, Quota, Resource, Workload
from tests.engine.builders import dept, job, nodes, placed, project, run, running, snapshot


def _held(queue: str, count: int, start: int = 0) -> list[Workload]:
    """`count` one-GPU jobs of `queue` running on n0 from device `start` on."""
    return [running(job(f"{queue}-r{i}", queue), "n0", [start + i]) for i in range(count)]


def test_the_most_starved_department_goes_first_even_if_another_has_a_hungrier_project():
    # d1 holds 1 of its fair share of 2; d2 holds 3 of 4. Flat, q1 (nothing held) would
    # go first; by department, d1's p1 does, although p1 is at its own share.
    queues = [
        dept("d1", deserved=4),
        dept("d2", deserved=4),
        project("p1", "d1", deserved=4),
        project("q1", "d2", deserved=2),
        project("q2", "d2", deserved=2),
    ]
    work = [*_held("p1", 1), *_held("q2", 3, start=1), job("q1-next", "q1"), job("p1-next", "p1")]
    result = run(snapshot(nodes(1, gpus=8), queues, work))
    assert result.pending_order == ("p1-next", "q1-next")
    assert sorted(placed(result)) == ["p1-next", "q1-next"]


def test_a_department_under_its_deserved_quota_goes_before_one_above_it():
    # d1 deserves 2 and holds 3 (its share is 4: it borrows); d2 deserves 4 and holds 3.
    # d1's ratio (0.75) equals d2's, but d2 is under its quota, so d2 goes first, though
    # d1's p1b holds nothing at all.
    queues = [
        dept("d1", deserved=2),
        dept("d2", deserved=4),
        project("p1", "d1", deserved=1),
        project("p1b", "d1", deserved=1),
        project("q1", "d2", deserved=4),
    ]
    work = [*_held("p1", 3), *_held("q1", 3, start=3), job("p1b-a", "p1b"), job("q1-a", "q1")]
    result = run(snapshot(nodes(1, gpus=10), queues, work))
    assert result.pending_order == ("q1-a", "p1b-a")


def test_inside_a_department_a_project_under_its_deserved_quota_goes_first():
    # p1 is at its deserved GPU; p2 holds nothing of its deserved one and goes first,
    # though its job is newer.
    queues = [
        dept("d1", deserved=2),
        project("p1", "d1", deserved=1),
        project("p2", "d1", deserved=1),
    ]
    work = [*_held("p1", 1), job("p1-a", "p1", t=0), job("p2-a", "p2", t=5)]
    result = run(snapshot(nodes(1, gpus=2), queues, work))
    assert result.pending_order == ("p2-a", "p1-a")
    assert list(placed(result)) == ["p2-a"]


def test_departments_take_turns_as_their_projects_are_served():
    # Two departments with equal quotas and no work running alternate, and inside each
    # the projects alternate too; within a project, priority then age.
    queues = [
        dept("d1", deserved=4),
        dept("d2", deserved=4),
        project("a1", "d1", deserved=2),
        project("a2", "d1", deserved=2),
        project("b1", "d2", deserved=4),
    ]
    work = [
        job("a1-old", "a1", t=0),
        job("a1-urgent", "a1", t=9, priority=10),
        job("a2-x", "a2", t=1),
        job("b1-x", "b1", t=2),
        job("b1-y", "b1", t=3),
    ]
    result = run(snapshot(nodes(1, gpus=8), queues, work))
    assert result.pending_order == ("a1-urgent", "b1-x", "a2-x", "b1-y", "a1-old")


def test_the_pending_order_names_each_pending_workload_once_and_nothing_else():
    queues = [dept(), project("p1", deserved=1), project("p2", deserved=1)]
    work = [*_held("p1", 1), job("big", "p2", gpus=4), job("small", "p2", t=1)]
    result = run(snapshot(nodes(1, gpus=2), queues, work))
    assert result.pending_order == ("big", "small")
    assert list(placed(result)) == ["small"]
    assert set(result.pending_reasons) == {"big"}


def _cpu_job(wid: str, queue: str, gpus: int, cpu: float, t: float = 0.0) -> Workload:
    return Workload(wid, queue, (PodRequest(gpus=gpus, cpu=cpu),), submit_time=t)


def _cpu_scenario(cpu: float | None, p1_cpu_quota: float = 0) -> list:
    # One node of 8 GPUs. p1 holds 2 GPUs and 40 cores, p2 3 GPUs and 6 cores; each
    # waits with a 1-GPU, 10-core job, and the 18 free cores fit only one of them.
    node = replace(nodes(1, gpus=8)[0], cpu=cpu)
    p1 = project("p1", deserved=2)
    p1 = replace(p1, quotas={**p1.quotas, ("a", Resource.CPU): Quota(deserved=p1_cpu_quota)})
    queues = [dept(), p1, project("p2", deserved=2)]
    work = [
        running(_cpu_job("p1-r", "p1", 2, 40), "n0", [0, 1]),
        running(_cpu_job("p2-r", "p2", 3, 6), "n0", [2, 3, 4]),
        _cpu_job("p1-next", "p1", 1, 10),
        _cpu_job("p2-next", "p2", 1, 10, t=1),
    ]
    return [run(snapshot([node], queues, work))]


def test_with_cpu_limited_the_queue_with_the_lowest_dominant_share_goes_first():
    # GPUs alone: p1 holds 2 of its share of 3 (0.67), p2 3 of 4 (0.75), so p1 would go
    # first. But p1 also holds 40 of its 48 fair cores (0.83): its dominant share is
    # higher than p2's, so p2 goes first and p1 waits for cores.
    (result,) = _cpu_scenario(cpu=64)
    assert result.pending_order == ("p2-next", "p1-next")
    assert list(placed(result)) == ["p2-next"]
    assert "CPU" in result.pending_reasons["p1-next"]


def test_with_cpu_not_limited_only_gpus_decide_the_order():
    (result,) = _cpu_scenario(cpu=None)
    assert result.pending_order == ("p1-next", "p2-next")
    assert sorted(placed(result)) == ["p1-next", "p2-next"]


def test_a_queue_under_its_deserved_cpu_quota_goes_first():
    # p1 deserves 48 cores and holds 40: under its quota, it goes before p2, whose
    # dominant share is lower but who has no CPU quota to fall short of.
    # p1-next takes the free cores. p2-next then fits p2's GPU guarantee (2) only by
    # taking back the 3 GPUs p2-r holds over it, and the cores p2-r frees let it run:
    # the project's own borrowed work, taken back for its guaranteed work (issue 24;
    # before the victim search counted host CPU, it never looked at this node).
    (result,) = _cpu_scenario(cpu=64, p1_cpu_quota=48)
    assert result.pending_order == ("p1-next", "p2-next")
    assert list(placed(result)) == ["p1-next", "p2-next"]
    assert [(e.workload_id, e.reason.value) for e in result.evictions] == [("p2-r", "borrowed")]
