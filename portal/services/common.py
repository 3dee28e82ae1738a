"""What every service shares: refusing an actor, refusing input."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import PermissionDenied

from portal.errors import ValidationFailed


def require(allowed: bool, message: str) -> None:
    """Services check the actor themselves too: the API, pages and scripts all call them."""
    if not allowed:
        raise PermissionDenied(message)


def raise_if(errors: Mapping[str, list[str]]) -> None:
    if errors:
        raise ValidationFailed(dict(errors))
