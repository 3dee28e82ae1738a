"""What one step of the bench costs: CPU of this process, CPU of its PostgreSQL backend,
SQL statements, wall time and peak RSS.

The backend's CPU is read from /proc/<pid>/stat of the connection's server process
(`pg_backend_pid()`), so it needs the server on this machine (the throw-away server is);
elsewhere, or when the connection was replaced during the step, it is None.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from clusters.metrics.bench import StatementCounter

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Cost:
    cpu_s: float = 0.0  # this process (every thread)
    db_cpu_s: float | None = None  # its PostgreSQL backend
    sql: int = 0
    wall_s: float = 0.0
    peak_rss_mb: float = 0.0  # this process's peak so far
    gc_s: float = 0.0  # of cpu_s, in Python's cycle collector (a full pass walks every object)

    @property
    def total_cpu_s(self) -> float | None:
        """Worker and database together; None when the database's part is unknown."""
        return None if self.db_cpu_s is None else self.cpu_s + self.db_cpu_s

    def as_dict(self) -> dict[str, Any]:
        row = {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}
        total = self.total_cpu_s
        return row | {"total_cpu_s": None if total is None else round(total, 4)}


def backend_pid() -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def backend_cpu_s(pid: int | None) -> float | None:
    """utime + stime of a local process, in seconds; None if it cannot be read."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of stat(5)


class CollectorTime:
    """CPU spent in the cycle collector's passes, from gc.callbacks: where a full pass
    falls (whichever step allocates past its threshold) moves a step's CPU by more than
    many changes do, so each step says how much of its CPU it was."""

    def __init__(self) -> None:
        self.total = 0.0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.total += time.process_time() - self._began


COLLECTOR = CollectorTime()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def measured() -> Iterator[Cost]:
    """The Cost of the block, filled in when it ends."""
    cost = Cost()
    pid = backend_pid()
    db_before = backend_cpu_s(pid)
    counter = StatementCounter()
    wall, cpu, collector = time.perf_counter(), time.process_time(), COLLECTOR.total
    with connection.execute_wrapper(counter):
        yield cost
    cost.cpu_s = time.process_time() - cpu
    cost.gc_s = COLLECTOR.total - collector
    cost.wall_s = time.perf_counter() - wall
    cost.sql = counter.count
    db_after = backend_cpu_s(pid)
    if db_before is not None and db_after is not None and backend_pid() == pid:
        cost.db_cpu_s = db_after - db_before
    cost.peak_rss_mb = peak_rss_mb()


def measure(fn: Callable[[], Any]) -> tuple[Cost, Any]:
    with measured() as cost:
        value = fn()
    return cost, value
