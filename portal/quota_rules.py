"""Quota arithmetic and its messages, as small pure functions (no queries), each tested alone.

A quota row holds, per node pool: deserved amounts (gpus, cpu, memory_gib), optional limits
(None = no cap), an over-quota weight and whether the owner may go over quota at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from scheduling.bounds import QUOTA, fmt

RESOURCES = ("gpus", "cpu", "memory_gib")
LABELS = {"gpus": "GPUs", "cpu": "CPU cores", "memory_gib": "GiB of memory"}
NUMBER_FIELDS = (*RESOURCES, *(f"{r}_limit" for r in RESOURCES), "over_quota_weight")
DEFAULTS: dict[str, Any] = {
    "gpus": Decimal(0),
    "gpus_limit": None,
    "cpu": Decimal(0),
    "cpu_limit": None,
    "memory_gib": Decimal(0),
    "memory_gib_limit": None,
    "over_quota_weight": Decimal(1),
    "over_quota_allowed": True,
}
# The columns are DECIMAL(9, 2) (memory 11, 2): refuse what the database would round or reject.
MAX_VALUE = QUOTA.high


def normalise_row(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Fill defaults, turn numbers into Decimals; return (row, errors by field)."""
    row = dict(DEFAULTS)
    errors: dict[str, list[str]] = {}
    for field, value in values.items():
        if field not in DEFAULTS:
            errors.setdefault(field, []).append("Unknown quota field.")
        elif field == "over_quota_allowed":
            row[field] = bool(value)
        elif value is None or value == "":
            row[field] = None if field.endswith("_limit") else DEFAULTS[field]
        else:
            try:
                row[field] = Decimal(str(value))
            except InvalidOperation:
                errors.setdefault(field, []).append("Enter a number.")
    return row, errors


def row_errors(row: Mapping[str, Any]) -> dict[str, list[str]]:
    """A row's own rules: numbers in range, at most two decimals, limit ≥ deserved."""
    errors: dict[str, list[str]] = {}
    for field in NUMBER_FIELDS:
        value = row.get(field)
        if not isinstance(value, Decimal):
            continue
        if not value.is_finite():  # NaN cannot even be compared with 0
            errors.setdefault(field, []).append("Enter a number.")
        elif value < 0:
            errors.setdefault(field, []).append("Must not be negative.")
        elif value > MAX_VALUE:
            errors.setdefault(field, []).append(f"Must be at most {fmt(MAX_VALUE)}.")
        elif value != value.quantize(Decimal("0.01")):
            errors.setdefault(field, []).append("Use at most two decimal places.")
    for resource in RESOURCES:
        limit, deserved = row.get(f"{resource}_limit"), row.get(resource)
        if f"{resource}_limit" in errors or resource in errors:
            continue  # one message per field: the number itself is wrong already
        if isinstance(limit, Decimal) and isinstance(deserved, Decimal) and limit < deserved:
            errors[f"{resource}_limit"] = [
                f"The limit ({fmt(limit)}) must be at least the deserved amount "
                f"({fmt(deserved)} {LABELS[resource]})."
            ]
    return errors


def project_over_department(
    *,
    project: str,
    department: str,
    pool: str,
    resource: str,
    asked: Decimal,
    department_value: Decimal,
    siblings: Mapping[str, Decimal],
) -> str | None:
    """Why a project's deserved amount does not fit in its department's, or None if it does."""
    taken = sum(siblings.values(), Decimal(0))
    if asked + taken <= department_value:
        return None
    label = LABELS[resource]
    free = max(department_value - taken, Decimal(0))
    others = f"; its other projects already deserve {fmt(taken)}" if siblings else ""
    return (
        f"Department {department} deserves {fmt(department_value)} {label} in {pool}{others}, "
        f"so {project} can deserve at most {fmt(free)} (asked {fmt(asked)})."
    )


def department_below_projects(
    *,
    department: str,
    pool: str,
    resource: str,
    asked: Decimal,
    projects: Mapping[str, Decimal],
) -> str | None:
    """Why a department may not drop to `asked` given what its projects deserve, or None."""
    total = sum(projects.values(), Decimal(0))
    if asked >= total:
        return None
    named = ", ".join(
        f"{name} ({fmt(value)})" for name, value in sorted(projects.items()) if value > 0
    )
    return (
        f"The projects of {department} deserve {fmt(total)} {LABELS[resource]} in {pool} "
        f"together ({named}); the department cannot deserve less ({fmt(asked)} asked). "
        "Lower those projects first."
    )
