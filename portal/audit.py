"""The audit log: every admin change writes a row in the same transaction as the change."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction
from django.forms.models import model_to_dict

from portal.models import AuditLog, Department
from scheduling.bounds import fmt


def snapshot(obj: Any, fields: list[str] | None = None) -> dict[str, Any]:
    """A JSON-safe picture of a model instance for the before/after columns."""
    data = model_to_dict(obj, fields=fields)
    return {key: _json_safe(value) for key, value in data.items()}


def _json_safe(value: Any) -> Any:
    if isinstance(value, Decimal):
        return fmt(value)  # 100, not the 1E+2 that normalize() wrote
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if hasattr(value, "pk"):
        return value.pk
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def audit_log(**entry: Any) -> AuditLog:
    """Record a change (`audit_entry`'s fields). Must run inside the transaction that makes
    the change."""
    (written,) = audit_log_many([audit_entry(**entry)])
    return written


def audit_entry(
    *,
    actor: Any,
    action: str,
    obj: Any,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    department: Department | None = None,
) -> AuditLog:
    """An audit row not yet written: `audit_log_many` writes many at once."""
    return AuditLog(
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        action=action,
        object_type=type(obj).__name__.lower(),
        object_id=str(getattr(obj, "pk", "") or ""),
        object_repr=str(obj)[:200],
        department=department,
        before=before,
        after=after,
    )


def audit_log_many(entries: list[AuditLog]) -> list[AuditLog]:
    """Record many changes in one statement. Must run inside the changes' transaction."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_log must be called inside the change's transaction")
    return AuditLog.objects.bulk_create(entries)
