"""Fair share rules that mutation testing found unguarded (docs/engine.md, "Mutation testing").

Each test pins one rule of fairshare.py with whole results, so that a change to the rule
fails it: past usage and its decay, the weight it shrinks, and the roll-up to departments.
"""

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


def test_usage_recorded_up_to_now_counts_whole_without_decay() -> None:
    # The record's middle is now (and one ends in the future): age 0, nothing decays.
    records = [
        UsageRecord("p1", "a", start=90, end=110, gpu_seconds=80),
        UsageRecord("p2", "a", start=100, end=300, gpu_seconds=40),
    ]
    assert decayed_usage(records, now=100, half_life_s=1) == {("p1", "a"): 80, ("p2", "a"): 40}


def test_decayed_usage_adds_up_every_record_of_a_queue_in_a_pool() -> None:
    records = [
        UsageRecord("p1", "a", start=0, end=0, gpu_seconds=100),
        UsageRecord("p1", "a", start=0, end=0, gpu_seconds=60),
        UsageRecord("p1", "b", start=0, end=0, gpu_seconds=7),
    ]
    assert decayed_usage(records, now=0, half_life_s=10) == {("p1", "a"): 160, ("p1", "b"): 7}


def test_decayed_usage_halves_again_each_further_half_life() -> None:
    records = [UsageRecord("p1", "a", start=0, end=0, gpu_seconds=800)]
    usage = decayed_usage(records, now=3000, half_life_s=1000)  # three half-lives
    assert usage == {("p1", "a"): pytest.approx(100)}


def test_a_sibling_without_recorded_usage_keeps_its_whole_weight() -> None:
    claims = [Claim("a", 1, None, 2.0, 10), Claim("b", 1, None, 2.0, 10)]
    adjusted = usage_weights(claims, {"a": 30.0}, k=1.0)
    assert adjusted == [Claim("a", 1, None, 1.0, 10), Claim("b", 1, None, 2.0, 10)]


def test_siblings_that_used_nothing_keep_their_claims_unchanged() -> None:
    claims = [Claim("a", 1, None, 2.0, 10), Claim("b", 1, None, 3.0, 10)]
    assert usage_weights(claims, {"a": 0.0, "b": 0.0}, k=1.0) == claims


def test_a_small_past_usage_still_shrinks_the_heavier_users_weight() -> None:
    # Decayed usage is often below one GPU-second: it still counts.
    claims = [Claim("a", 0, None, 1.0, 10), Claim("b", 0, None, 1.0, 10)]
    adjusted = usage_weights(claims, {"a": 0.3, "b": 0.1}, k=1.0)
    assert [c.weight for c in adjusted] == pytest.approx([1 / 1.75, 1 / 1.25])


def test_usage_weights_change_only_the_weight_of_a_claim() -> None:
    claims = [
        Claim("a", 2, 5.0, 1.0, 10, over_quota_allowed=False),
        Claim("b", 3, None, 1.0, 4, over_quota_allowed=True),
    ]
    adjusted = usage_weights(claims, {"a": 1.0, "b": 1.0}, k=2.0)
    assert adjusted == [
        Claim("a", 2, 5.0, 0.5, 10, over_quota_allowed=False),
        Claim("b", 3, None, 0.5, 4, over_quota_allowed=True),
    ]


def test_usage_rolls_up_to_ancestors_only_and_each_queue_once() -> None:
    queues = (
        Queue("d1", None, {("a", G): Quota(8)}),
        Queue("p1", "d1", {("a", G): Quota(4)}),
    )
    usage = rollup_usage(queues, {("p1", "a"): 3.0, ("d1", "b"): 1.0})
    assert usage == {("p1", "a"): 3.0, ("d1", "a"): 3.0, ("d1", "b"): 1.0}


@pytest.mark.timeout(10)
def test_usage_rollup_stops_at_a_cycle_in_the_queue_tree() -> None:
    # A queue its own ancestor (bad data) is counted once, not walked for ever.
    queues = (Queue("p1", "p2", {}), Queue("p2", "p1", {}), Queue("p3", "p3", {}))
    usage = rollup_usage(queues, {("p1", "a"): 3.0, ("p3", "a"): 2.0})
    assert usage == {("p1", "a"): 3.0, ("p2", "a"): 3.0, ("p3", "a"): 2.0}


def test_a_project_whose_department_is_missing_is_split_as_a_top_level_queue() -> None:
    queues = (
        Queue("p1", "gone", {("a", G): Quota(2)}),
        Queue("p2", None, {("a", G): Quota(2)}),
    )
    demand = {("p1", "a", G): 10.0, ("p2", "a", G): 10.0}
    shares = fair_shares(FairShareInput(queues, {("a", G): 10.0}, demand, {}))
    assert shares == {("p1", "a", G): 5.0, ("p2", "a", G): 5.0}


def test_a_pool_without_queues_has_no_fair_shares() -> None:
    assert fair_shares(FairShareInput((), {("a", G): 10.0}, {}, {})) == {}


def test_a_project_without_demand_gets_no_share_and_leaves_its_quota_to_its_sibling() -> None:
    queues = (
        Queue("p1", None, {("a", G): Quota(4)}),
        Queue("p2", None, {("a", G): Quota(4)}),
    )
    shares = fair_shares(FairShareInput(queues, {("a", G): 10.0}, {("p2", "a", G): 10.0}, {}))
    assert shares == {("p1", "a", G): 0.0, ("p2", "a", G): 10.0}


def test_a_departments_demand_counts_its_projects_only_up_to_their_limits() -> None:
    # p1 may hold 3 at most, p2 may not borrow past 1: department d1 asks for 4, not 20,
    # and d2 gets the rest instead of d1 holding GPUs its projects cannot use.
    queues = (
        Queue("d1", None, {}),
        Queue("d2", None, {}),
        Queue("p1", "d1", {("a", G): Quota(0, limit=3)}),
        Queue("p2", "d1", {("a", G): Quota(1, over_quota_allowed=False)}),
        Queue("p3", "d2", {}),
    )
    demand = {("p1", "a", G): 10.0, ("p2", "a", G): 10.0, ("p3", "a", G): 10.0}
    shares = fair_shares(FairShareInput(queues, {("a", G): 10.0}, demand, {}))
    assert shares == pytest.approx(
        {
            ("d1", "a", G): 4.0,
            ("d2", "a", G): 6.0,
            ("p1", "a", G): 3.0,
            ("p2", "a", G): 1.0,
            ("p3", "a", G): 6.0,
        }
    )


def test_a_pool_with_no_capacity_gives_nothing_even_to_a_fractional_claim() -> None:
    # All of a pool's nodes gone: a quarter-GPU claim within its deserved quota gets 0.
    assert water_fill(0.0, [Claim("a", 2, None, 1.0, 0.25)]) == {"a": 0.0}
    assert water_fill(0.5, [Claim("a", 2, None, 1.0, 0.75)]) == {"a": 0.5}
