"""Fair share: deserved first, the rest by over-quota weight, hierarchical."""

from __future__ import annotations

import pytest

from scheduling.engine.fairshare import (
    Claim,
    FairShareInput,
    decayed_usage,
    fair_shares,
    rollup_usage,
    usage_weights,
    water_fill,
)
from scheduling.engine.types import Queue, Quota, Resource, UsageRecord

G = Resource.GPU


def claim(qid: str, deserved: float, demand: float, weight: float = 1.0, **kw: object) -> Claim:
    return Claim(qid, deserved, kw.get("limit"), weight, demand, kw.get("allowed", True))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("capacity", "claims", "expected"),
    [
        pytest.param(
            10,
            [claim("a", 4, 10), claim("b", 4, 10)],
            {"a": 5, "b": 5},
            id="the_spare_two_gpus_split_evenly_between_equal_weights",
        ),
        pytest.param(
            10,
            [claim("a", 2, 10, weight=3), claim("b", 2, 10, weight=1)],
            {"a": 6.5, "b": 3.5},
            id="the_spare_gpus_follow_over_quota_weight_three_to_one",
        ),
        pytest.param(
            10,
            [claim("a", 6, 2), claim("b", 2, 10)],
            {"a": 2, "b": 8},
            id="a_queue_asking_less_than_deserved_gets_only_its_demand",
        ),
        pytest.param(
            10,
            [claim("a", 2, 10, limit=3), claim("b", 2, 10)],
            {"a": 3, "b": 7},
            id="a_limit_caps_the_share_and_the_rest_flows_to_others",
        ),
        pytest.param(
            10,
            [claim("a", 2, 10, allowed=False), claim("b", 2, 10)],
            {"a": 2, "b": 8},
            id="a_queue_that_may_not_borrow_stops_at_deserved",
        ),
        pytest.param(
            6,
            [claim("a", 6, 10), claim("b", 6, 10)],
            {"a": 3, "b": 3},
            id="oversubscribed_deserved_quotas_shrink_pro_rata",
        ),
        pytest.param(
            10,
            [claim("a", 0, 10, weight=0), claim("b", 0, 4)],
            {"a": 0, "b": 4},
            id="weight_zero_gets_nothing_over_quota_even_when_gpus_are_idle",
        ),
    ],
)
def test_water_fill(capacity: float, claims: list[Claim], expected: dict[str, float]) -> None:
    assert water_fill(capacity, claims) == pytest.approx(expected)


def test_water_fill_never_hands_out_more_than_the_capacity() -> None:
    claims = [claim(q, 1, 100, weight=w) for q, w in (("a", 1), ("b", 2), ("c", 3), ("d", 4))]
    shares = water_fill(7, claims)
    assert sum(shares.values()) == pytest.approx(7)


def test_infinite_capacity_gives_every_queue_its_cap() -> None:
    shares = water_fill(float("inf"), [claim("a", 0, 5), claim("b", 1, 3, limit=2)])
    assert shares == {"a": 5, "b": 2}


def _tree() -> tuple[Queue, ...]:
    def q(qid: str, parent: str | None, deserved: float, weight: float = 1.0) -> Queue:
        return Queue(qid, parent, {("a", G): Quota(deserved, over_quota_weight=weight)})

    return (
        q("d1", None, 8),
        q("d2", None, 8),
        q("p1", "d1", 4),
        q("p2", "d1", 4, weight=3),
        q("p3", "d2", 8),
    )


def test_departments_are_split_first_then_their_projects() -> None:
    demand = {("p1", "a", G): 10.0, ("p2", "a", G): 20.0, ("p3", "a", G): 2.0}
    shares = fair_shares(FairShareInput(_tree(), {("a", G): 20.0}, demand, {}))
    # d2 wants only 2, so d1 gets 18 of 20; inside d1 the 10 over deserved go 1:3.
    assert shares[("d1", "a", G)] == pytest.approx(18)
    assert shares[("d2", "a", G)] == pytest.approx(2)
    assert shares[("p1", "a", G)] == pytest.approx(4 + 2.5)
    assert shares[("p2", "a", G)] == pytest.approx(4 + 7.5)
    assert shares[("p3", "a", G)] == pytest.approx(2)


def test_a_project_capped_by_its_demand_leaves_the_rest_to_its_sibling() -> None:
    demand = {("p1", "a", G): 10.0, ("p2", "a", G): 10.0, ("p3", "a", G): 2.0}
    shares = fair_shares(FairShareInput(_tree(), {("a", G): 20.0}, demand, {}))
    # p2's 1:3 part would pass its demand of 10; what it cannot use goes to p1.
    assert shares[("p2", "a", G)] == pytest.approx(10)
    assert shares[("p1", "a", G)] == pytest.approx(8)


def test_decayed_usage_halves_every_half_life() -> None:
    records = [UsageRecord("p1", "a", start=0, end=200, gpu_seconds=800)]
    usage = decayed_usage(records, now=1100, half_life_s=1000)  # middle at 100: one half-life
    assert usage[("p1", "a")] == pytest.approx(400)


def test_usage_rolls_up_to_the_department() -> None:
    usage = rollup_usage(_tree(), {("p1", "a"): 3.0, ("p2", "a"): 1.0})
    assert usage[("d1", "a")] == 4.0
    assert usage[("p1", "a")] == 3.0


def test_heavy_past_users_get_a_smaller_over_quota_weight() -> None:
    claims = [claim("a", 0, 10), claim("b", 0, 10)]
    adjusted = {c.id: c.weight for c in usage_weights(claims, {"a": 90.0, "b": 10.0}, k=1.0)}
    assert adjusted == pytest.approx({"a": 1 / 1.9, "b": 1 / 1.1})


def test_time_based_fairness_moves_the_over_quota_part_toward_the_light_user() -> None:
    queues = (
        Queue("p1", None, {("a", G): Quota(2)}),
        Queue("p2", None, {("a", G): Quota(2)}),
    )
    demand = {("p1", "a", G): 10.0, ("p2", "a", G): 10.0}
    plain = fair_shares(FairShareInput(queues, {("a", G): 10.0}, demand, {}))
    usage = {("p1", "a"): 1000.0}
    weighted = fair_shares(FairShareInput(queues, {("a", G): 10.0}, demand, usage))
    assert plain[("p1", "a", G)] == pytest.approx(5)
    assert weighted[("p1", "a", G)] == pytest.approx(2 + 6 * (1 / 2) / (1 / 2 + 1))
    assert weighted[("p1", "a", G)] + weighted[("p2", "a", G)] == pytest.approx(10)
