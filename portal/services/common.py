"""What every service shares: refusing an actor, refusing input, audited writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Model

from portal.audit import audit_log, snapshot
from portal.errors import ValidationFailed
from portal.models import Department


def require(allowed: bool, message: str) -> None:
    """Services check the actor themselves too: the API, pages and scripts all call them."""
    if not allowed:
        raise PermissionDenied(message)


def raise_if(errors: Mapping[str, list[str]]) -> None:
    if errors:
        raise ValidationFailed(dict(errors))


def create_audited(
    model: type[Model],
    values: Mapping[str, Any],
    *,
    actor: Any,
    action: str,
    department: Department | None = None,
) -> Any:
    """Create a row and its audit entry; the caller's transaction holds both.

    The caller checked uniqueness with a message; a request that raced it past that check
    meets the database's constraint, told as a refusal rather than a server error.
    """
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction stays usable
            obj = model.objects.create(**values)
    except IntegrityError:
        name = model._meta.verbose_name
        raise ValidationFailed(
            f"Another {name} like this one was saved at the same moment; reload and check."
        ) from None
    audit_log(actor=actor, action=action, obj=obj, after=snapshot(obj), department=department)
    return obj


def save_audited(
    obj: Model,
    changes: Mapping[str, Any],
    *,
    actor: Any,
    action: str,
    department: Department | None = None,
    fields: list[str] | None = None,
    update_fields: list[str] | None = None,
) -> None:
    """Apply `changes`, save, and audit the row's before and after (`fields` of it, or all).

    The caller's transaction holds both, so a failed save leaves no audit row behind.
    """
    before = snapshot(obj, fields)
    for name, value in changes.items():
        setattr(obj, name, value)
    obj.save(update_fields=update_fields)
    after = snapshot(obj, fields)
    audit_log(
        actor=actor, action=action, obj=obj, before=before, after=after, department=department
    )
