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
from django.db.models.functions import Cast

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


# Rows summed by bucket (a key column modulo BUCKETS): a reader that keeps what it read
# compares these sums and reads again only the buckets whose sums moved. A row added,
# removed or written moves its bucket's count, sum of primary keys or sum of versions
# (a fresh random version: it leaves the sum where it was with odds of one in ~2**31).
BUCKETS = 4096
_MODULUS = 2**31 - 1  # versions summed modulo this: no sum of a bucket overflows 64 bits

Sums = tuple[int, ...]  # (rows, sum of primary keys, sum of each version column modulo)


def bucket_sums(rows: models.QuerySet, key: str, versions: Iterable[str]) -> dict[int, Sums]:
    """Per bucket of `key % BUCKETS` among `rows`: `Sums`, in one statement (the database
    adds them up; a few thousand buckets at most come back)."""
    names = list(versions)
    sums = [models.Sum("pk"), *(models.Sum(models.F(name) % _MODULUS) for name in names)]
    aggregates = {
        "n": models.Count("pk"),
        # as 64-bit integers, not PostgreSQL's numeric (a Decimal apiece in Python)
        **{f"s{i}": Cast(total, models.BigIntegerField()) for i, total in enumerate(sums)},
    }
    grouped = (
        rows.annotate(bucket=models.F(key) % BUCKETS)
        .order_by()  # a model's default ordering would join the GROUP BY
        .values("bucket")
        .annotate(**aggregates)
        .values_list("bucket", *aggregates)
    )
    return {row[0]: row[1:] for row in grouped}


def bucket_of(key: int) -> int:
    return key % BUCKETS


def in_buckets(rows: models.QuerySet, key: str, buckets: Iterable[int]) -> models.QuerySet:
    """The rows whose `key % BUCKETS` is one of `buckets`."""
    picked = rows.annotate(bucket=models.F(key) % BUCKETS)
    return picked.filter(bucket__in=sorted(buckets))


class SumsOf:
    """`bucket_sums` of rows read one by one: what was read of each bucket, summed as the
    database sums it, so a reader keeps the sums of exactly the rows it holds."""

    def __init__(self) -> None:
        self.sums: dict[int, list[int]] = {}

    def add(self, key: int, pk: int, *versions: int, sign: int = 1) -> None:
        sums = self.sums.setdefault(key % BUCKETS, [0, 0, *(0 for _ in versions)])
        sums[0] += sign
        sums[1] += sign * pk
        for i, version in enumerate(versions):
            sums[2 + i] += sign * (version % _MODULUS)

    def remove(self, key: int, pk: int, *versions: int) -> None:
        """A row taken away: `of` and `sums_fold` then count what was added less this."""
        self.add(key, pk, *versions, sign=-1)

    def of(self, buckets: Iterable[int]) -> dict[int, Sums | None]:
        """The sums of these buckets as read; None for a bucket no row was read of."""
        return {b: tuple(self.sums[b]) if b in self.sums else None for b in buckets}


def buckets_moved(now: dict[int, Sums], kept: dict[int, Sums]) -> set[int]:
    """The buckets whose sums differ (rows added, removed or written since `kept`)."""
    return {b for b in now.keys() | kept.keys() if now.get(b) != kept.get(b)}


def sums_keep(kept: dict[int, Sums], read: dict[int, Sums | None]) -> None:
    """Keep the sums of the buckets just read (those with no row: forgotten)."""
    for bucket, sums in read.items():
        if sums is None:
            kept.pop(bucket, None)
        else:
            kept[bucket] = sums


def sums_fold(kept: dict[int, Sums], change: SumsOf) -> None:
    """Move kept sums by the rows a reader wrote itself (`change`: the rows as they are now
    added, as they were removed), so that it does not read them again. Kept minus the
    database stays what it was: a bucket that differed (another writer) still differs."""
    for bucket, moved in change.sums.items():
        old = kept.get(bucket) or (0,) * len(moved)
        new = tuple(a + b for a, b in zip(old, moved, strict=True))
        if any(new):
            kept[bucket] = new
        else:  # no row: as `bucket_sums` tells an empty bucket
            kept.pop(bucket, None)
