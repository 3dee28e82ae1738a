"""Values written into a row behind the ORM's back, as another database writer leaves them
(issue 27, bad rows)."""

from __future__ import annotations

from django.db import connection
from django.db.models import Model

from portal.versioned import new_version


def plant_text(row: Model, **columns: str) -> tuple:
    """Write `columns` into the row behind the ORM's back, with the database's CHECKs off
    (scheduling 0016 refuses them): as rows written before those checks, or by a writer
    that turned them off, hold them. Their SQLite types as stored."""
    table = row._meta.db_table
    if any(field.name == "version" for field in row._meta.fields):
        columns = {**columns, "version": new_version()}  # as raw SQL must (portal.versioned)
    sets = ", ".join(f'"{name}" = %s' for name in columns)
    sqlite = connection.vendor == "sqlite"
    where = f'"{row._meta.pk.column}" = %s'
    with connection.cursor() as cursor:
        if sqlite:
            cursor.execute("PRAGMA ignore_check_constraints = ON")
        try:
            cursor.execute(f"UPDATE {table} SET {sets} WHERE {where}", [*columns.values(), row.pk])
        finally:
            if sqlite:
                cursor.execute("PRAGMA ignore_check_constraints = OFF")
        if not sqlite:
            return ()
        types = ", ".join(f'typeof("{name}")' for name in columns if name != "version")
        cursor.execute(f"SELECT {types} FROM {table} WHERE {where}", [row.pk])
        return cursor.fetchone()
