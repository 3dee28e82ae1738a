"""Bounded query parameters and pagination for the API.

Kept apart from portal/api.py: DRF imports the pagination class named in settings while
its own generics module is still loading, so this module must import nothing that asks
DRF for its settings (drf-spectacular's decorators do)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from scheduling import bounds
from scheduling.bounds import Bound


def query_number(request: Request, name: str, bound: Bound, default: int | None = None) -> Any:
    """A whole-number query parameter within `bound` (`default` when absent), else a 400
    naming the parameter."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    number, error = bound.whole(value)
    if error:
        raise serializers.ValidationError({name: [error]})
    return number


class BoundedPagination(LimitOffsetPagination):
    """?limit= and ?offset= within bounds; anything else is a 400 naming the parameter
    (DRF's own would pass a huge offset on to the database, which overflows)."""

    max_limit = int(bounds.PAGE_LIMIT.high)

    def get_limit(self, request: Request) -> int | None:
        return query_number(request, self.limit_query_param, bounds.PAGE_LIMIT, self.default_limit)

    def get_offset(self, request: Request) -> int:
        return query_number(request, self.offset_query_param, bounds.PAGE_OFFSET, 0)
