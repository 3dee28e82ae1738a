"""The quota arithmetic alone, without a database."""

from __future__ import annotations

from decimal import Decimal as D

from portal import quota_rules as rules


def test_it_fills_defaults_and_reads_numbers_as_decimals():
    row, errors = rules.normalise_row({"gpus": "2.5", "gpus_limit": ""})
    assert errors == {}
    assert row["gpus"] == D("2.5")
    assert row["gpus_limit"] is None
    assert row["over_quota_weight"] == D(1)
    assert row["over_quota_allowed"] is True


def test_it_names_a_field_that_is_not_a_number_or_not_a_quota_field():
    _row, errors = rules.normalise_row({"cpu": "lots", "colour": 3})
    assert errors == {"cpu": ["Enter a number."], "colour": ["Unknown quota field."]}


def test_it_refuses_negative_values_on_each_field():
    row, _ = rules.normalise_row({"gpus": -1, "memory_gib_limit": -2, "over_quota_weight": -1})
    errors = rules.row_errors(row)
    assert errors["gpus"] == ["Must not be negative."]
    assert errors["memory_gib_limit"] == ["Must not be negative."]
    assert errors["over_quota_weight"] == ["Must not be negative."]


def test_it_refuses_a_limit_below_the_deserved_amount_and_says_both_numbers():
    row, _ = rules.normalise_row({"gpus": 4, "gpus_limit": "2.5", "cpu": 8, "cpu_limit": 8})
    assert rules.row_errors(row) == {
        "gpus_limit": ["The limit (2.5) must be at least the deserved amount (4 GPUs)."]
    }


def test_it_refuses_more_than_two_decimals_and_values_the_column_cannot_hold():
    row, _ = rules.normalise_row({"gpus": "0.125", "cpu": "100000000"})
    errors = rules.row_errors(row)
    assert errors["gpus"] == ["Use at most two decimal places."]
    assert errors["cpu"] == ["Must be at most 9999999.99."]


def test_a_project_fits_when_it_and_its_siblings_stay_within_the_department():
    assert (
        rules.project_over_department(
            project="p",
            department="d",
            pool="a100",
            resource="gpus",
            asked=D(2),
            department_value=D(8),
            siblings={"q": D(6)},
        )
        is None
    )


def test_a_project_over_its_department_is_told_how_much_is_left():
    message = rules.project_over_department(
        project="ml-vision",
        department="vision",
        pool="a100",
        resource="gpus",
        asked=D(4),
        department_value=D(8),
        siblings={"ml-detect": D("5.5")},
    )
    assert message == (
        "Department vision deserves 8 GPUs in a100; its other projects already deserve 5.5, "
        "so ml-vision can deserve at most 2.5 (asked 4)."
    )


def test_a_department_below_its_projects_names_each_project_and_the_total():
    message = rules.department_below_projects(
        department="vision",
        pool="a100",
        resource="gpus",
        asked=D(5),
        projects={"ml-vision": D(4), "ml-detect": D(2), "idle": D(0)},
    )
    assert message == (
        "The projects of vision deserve 6 GPUs in a100 together (ml-detect (2), ml-vision (4)); "
        "the department cannot deserve less (5 asked). Lower those projects first."
    )


def test_a_department_may_drop_exactly_to_what_its_projects_deserve():
    assert (
        rules.department_below_projects(
            department="d", pool="a100", resource="cpu", asked=D(6), projects={"p": D(6)}
        )
        is None
    )
