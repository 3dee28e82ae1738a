"""The allocation order is hierarchical (department, then project, then priority and
age), and the cycle reports the order in which it considered pending workloads."""

from __future__ import annotations

from scheduling.engine.types import Workload
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
