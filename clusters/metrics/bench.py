"""Shared plumbing of the bench_* commands: run against PostgreSQL, starting one if needed.

Settings are read once per process, so when no PostgreSQL is configured the command
starts a throw-away server (tests/services.py, as the test suite does) and runs itself
again in a child process with DATABASE_URL pointing at it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection


class StatementCounter:
    """connection.execute_wrapper: one per statement (an executemany counts once).

    Unlike CaptureQueriesContext it sees every statement: that one measures the growth of
    `connection.queries`, which stops growing at 9,000 entries with DEBUG on."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


@contextlib.contextmanager
def statements() -> Iterator[StatementCounter]:
    """Count the statements the block sends through Django's connection."""
    counter = StatementCounter()
    with connection.execute_wrapper(counter):
        yield counter


def on_postgresql() -> bool:
    return connection.vendor == "postgresql"


def rerun_with_postgres(argv: list[str], *, redis: bool = False) -> int:
    """Start PostgreSQL (and Redis, with `redis`), run `manage.py <argv>` against it, return
    the child's exit code."""
    from tests.services import postgres_server, services  # noqa: PLC0415 - only needed here

    manage = Path(settings.BASE_DIR) / "manage.py"
    if redis:
        with services() as urls:
            return subprocess.call([sys.executable, str(manage), *argv], env=os.environ | urls)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        os.chmod(tmp, 0o755)
        with postgres_server(Path(tmp)) as url:
            env = {**os.environ, "DATABASE_URL": url}
            return subprocess.call([sys.executable, str(manage), *argv], env=env)


def migrate_quietly() -> None:
    call_command("migrate", verbosity=0, interactive=False)
