"""Rows that carry a change stamp: a new random value written with every change.

The scheduling cycle keeps what it read between cycles and reads again only the rows
whose stamp differs from the one it kept (scheduling/kept_rows.py). The stamp is written
by the same statement as the change, so it commits (or rolls back) with it, and a reader
never sees new content under an old stamp.

Random rather than counted up: a write never reads the old stamp, so two writers holding
stale copies of a row cannot both write "old + 1" over different content; a row made
again under a reused primary key (a rolled-back test, a restored database) gets a stamp
of its own; and a cycle whose transaction rolls back leaves its in-memory copies with
stamps the database never had, so they are read again. Two stamps collide with odds of
one in 2**62 per change.

Every ORM write path bumps it: `save()` (with `update_fields` too), `QuerySet.update()`
(also through related managers) and `bulk_update()`. Inserts take a fresh one from the
field's default; a delete removes the row, which a reader sees as a missing key. Raw SQL
that writes these tables must set `version` itself.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from django.db import connection, models

_random = random.SystemRandom()


def new_version() -> int:
    """A fresh change stamp (positive, fits a signed 64-bit column)."""
    return _random.getrandbits(62) + 1


class VersionedQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        kwargs.setdefault("version", new_version())
        return super().update(**kwargs)

    def bulk_update(
        self, objs: Iterable[models.Model], fields: Iterable[str], batch_size: int | None = None
    ) -> int:
        objs = list(objs)
        for obj in objs:
            obj.version = new_version()
        return super().bulk_update(
            objs, [*dict.fromkeys([*fields, "version"])], batch_size=batch_size
        )


class Versioned(models.Model):
    """Abstract base: a `version` column changed by every write of the row."""

    version = models.BigIntegerField(default=new_version, editable=False)

    objects = VersionedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            self.version = new_version()
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "version"}
        super().save(*args, **kwargs)


def column_set(
    model: type[Versioned], name: str, values: dict[int, Any], expected: dict[int, int]
) -> dict[int, int]:
    """Set one column to a value per row (by primary key) in one statement per thousand
    rows, with a new version: what `bulk_update` does, without building a CASE
    expression per row in Python. Only rows still at their `expected` version are
    written (a row changed by someone else since it was read is left for its next
    read); returns the new version of each row written."""
    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(model._meta.get_field(name).column)
    pk = connection.ops.quote_name(model._meta.pk.column)
    items = [(key, value, expected[key], new_version()) for key, value in sorted(values.items())]
    stamps = {key: version for key, _, _, version in items}
    written: dict[int, int] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(items), 1000):
            chunk = items[start : start + 1000]
            rows = ", ".join(["(%s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"WITH v(id, value, expected, version) AS (VALUES {rows}) "
                f"UPDATE {table} SET {column} = v.value, version = v.version FROM v "
                f"WHERE {table}.{pk} = v.id AND {table}.version = v.expected "
                f"RETURNING {table}.{pk}",
                [p for item in chunk for p in item],
            )
            written.update((key, stamps[key]) for (key,) in cursor.fetchall())
    return written
