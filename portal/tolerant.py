"""Reads that survive a value the column's type cannot hold (issue 27, bad rows).

SQLite keeps whatever another writer puts in a column (`cpu = 'abc'`, a date of month 13)
and Django's converters raise on it, or hand a str to code that adds and compares: one such
row broke every page and every cycle. Fields made here select such a value, on SQLite, as
a stand-in the column can never hold (`field.unreadable`); pages still answer, and the code
that uses the row (the scheduling cycle, the snapshot of nodes) finds it with
`unreadable_columns` and sets the row aside saying which column. PostgreSQL refuses such
values; the database's CHECK constraints refuse out-of-range ones on both.
"""

from __future__ import annotations

import decimal
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from django.db import models
from django.db.models.lookups import Exact


class TolerantDecimalField(models.DecimalField):
    """A DecimalField whose rows load even when the stored value does not fit it.

    SQLite stores any number in a decimal column, and Django's converter quantizes what it
    reads with `max_digits` of precision, raising InvalidOperation for 100000 in a 7-digit
    column (or for infinity). One such row then broke every page and every cycle. Reads
    here use ample precision and do not trap: an oversized value loads as itself, a
    non-finite one as NaN, and the scheduling cycle quarantines the row (adapters).
    Writes still go through the column's own bounds.

    SQLite also keeps a text as given (`cpu = 'abc'`, or 'NaN', from another writer), and
    Django's converter raises TypeError on it: such a value is selected as `unreadable`, the
    column's lowest value, so pages (which compare and add these numbers; a Decimal NaN
    raises on both) still answer, and the cycle quarantines the row saying that the value
    is not a number. (PostgreSQL refuses the text.)
    """

    @cached_property
    def context(self) -> decimal.Context:
        return decimal.Context(prec=max(self.max_digits or 0, 60), traps=[])

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        if compiler.connection.vendor != "sqlite":
            return sql, params
        numeric = f"typeof({sql}) IN ('integer', 'real', 'null')"
        return f"(CASE WHEN {numeric} THEN {sql} ELSE {self.unreadable} END)", (*params, *params)

    @cached_property
    def unreadable(self) -> decimal.Decimal:
        """What a text in the column loads as on SQLite: its lowest value, out of bounds."""
        step = decimal.Decimal(1).scaleb(-(self.decimal_places or 0))
        return -(
            decimal.Decimal(10) ** ((self.max_digits or 1) - (self.decimal_places or 0)) - step
        )


def _read_tolerantly(field: Any, valid: str, stand_in: str) -> Any:
    """Give `field` a select_format that, on SQLite, selects `stand_in` (SQL) for a value
    that is not `valid` (SQL over `{sql}`, the column). Set on the field itself, not by a
    subclass: its class stays Django's, so migrations and expressions mixing it with other
    fields of that class see no difference."""
    plain = field.select_format

    def select_format(compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = plain(compiler, sql, params)
        if compiler.connection.vendor != "sqlite":
            return sql, params
        uses = valid.count("{sql}") + 1
        case = f"(CASE WHEN {valid.replace('{sql}', sql)} THEN {sql} ELSE {stand_in} END)"
        return case, tuple(params) * uses

    field.select_format = select_format
    return field


UNREADABLE = datetime(1970, 1, 1, tzinfo=UTC)  # what tolerant_datetime loads a text as


def tolerant_datetime(field: models.DateTimeField) -> models.DateTimeField:
    """`field`, whose rows load whatever text SQLite holds in it.

    SQLite keeps any text in a datetime column; Django's converter raises on one that looks
    like a date but is none ('2026-13-45 ...', '2026-02-31 ...') and loads others as None,
    which pages then subtract: one such row broke the workload lists and every cycle. Such a
    value is selected as `UNREADABLE` (the epoch), and the cycle quarantines the row
    (adapters). A date SQLite would roll over (Feb 31) is none.
    """
    day = "substr({sql}, 1, 10)"
    valid = "typeof({sql}) = 'null' OR (typeof({sql}) = 'text' AND julianday({sql}) IS NOT NULL"
    valid += f" AND date(julianday({day})) = {day})"
    field.unreadable = UNREADABLE  # type: ignore[attr-defined]
    return _read_tolerantly(field, valid, "'1970-01-01 00:00:00'")


def tolerant_count(field: models.IntegerField, unreadable: int = -1) -> models.IntegerField:
    """`field` (a column that cannot hold `unreadable`: -1 for a count), whose rows load a
    text SQLite holds in it as that (`field.unreadable`): Django has no converter for
    integers, and the text reached pages and the cycle as a str (a text priority failed
    every cycle's sort). The cycle quarantines the row (adapters)."""
    field.unreadable = unreadable  # type: ignore[attr-defined]
    return _read_tolerantly(field, "typeof({sql}) IN ('integer', 'null')", str(unreadable))


def unreadable_columns(row: models.Model) -> list[str]:
    """The loaded columns of `row` that held what their type cannot (their stand-in)."""
    return [
        field.name
        for field in row._meta.concrete_fields
        if (stand_in := getattr(field, "unreadable", None)) is not None
        and field.attname in row.__dict__
        and row.__dict__[field.attname] == stand_in
    ]


INT32_MAX = 2**31 - 1  # a PostgreSQL integer
INT64_MAX = 2**63 - 1  # a bigint


def in_range(
    table: str, column: str, low: object, high: object, *, null: bool = False
) -> models.CheckConstraint:
    """A CHECK that `column` holds a number in low..high (or NULL, with `null`). On SQLite
    the upper bound also refuses a text, which compares above every number there: the
    tolerant reads above then only meet rows written before the check, or with checks off."""
    condition = models.Q(**{f"{column}__gte": low, f"{column}__lte": high})
    if null:
        condition |= models.Q(**{f"{column}__isnull": True})
    return models.CheckConstraint(condition=condition, name=f"{table}_{column}_in_range")


def one_of(table: str, column: str, choices: type[models.Choices]) -> models.CheckConstraint:
    """A CHECK that a choice column holds one of its choices."""
    condition = models.Q(**{f"{column}__in": choices.values})
    return models.CheckConstraint(condition=condition, name=f"{table}_{column}_is_a_choice")


class JsonType(models.Func):
    """A JSON column's type, in the word both databases use for an object or an array:
    SQLite's json_type, PostgreSQL's jsonb_typeof (they differ on others: text/string)."""

    function = "JSON_TYPE"
    output_field = models.CharField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return super().as_sql(compiler, connection, function="JSONB_TYPEOF", **extra)


def json_is(table: str, column: str, kind: str) -> models.CheckConstraint:
    """A CHECK that a JSON column holds an `object` or an `array` (`kind`) at its top: code
    that reads its keys or items then meets no text or number there (nested shapes are
    checked where rows are read: scheduling/stored.py, clusters/stored.py)."""
    condition = Exact(JsonType(column), kind)
    return models.CheckConstraint(condition=condition, name=f"{table}_{column}_is_an_{kind}")
