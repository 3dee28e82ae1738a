"""Audit rows as a person reads them: only what changed, `field: before → after`."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'a100': {'gpus': '4'}} -> {'a100.gpus': '4'}: quota tables nest by node pool."""
    if not isinstance(value, dict):
        return {prefix: value} if prefix else {}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


@register.filter
def audit_changes(row: Any) -> list[tuple[str, Any, Any]]:
    """(field, before, after) for each field that differs; all fields of a create or delete."""
    before, after = _flatten(row.before or {}), _flatten(row.after or {})
    fields = sorted(set(before) | set(after))
    return [
        (field, before.get(field), after.get(field))
        for field in fields
        if before.get(field) != after.get(field) and field != "id"
    ]
