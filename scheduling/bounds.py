"""Every number a user can send, bounded once: the forms, the API's serializers, query
parameters and the CLI all read their limits from here.

A bound is the smaller of what the database column can store (PostgreSQL's `integer` is
32 bits; a DECIMAL(7, 2) holds 99999.99; SQLite stores more and then fails on reading it
back, stopping every scheduling cycle) and what the platform could ever run (no machine
has 100,000 cores). Whether a request fits the *actual* nodes is a second check, against
the inventory, at submit (scheduling.specs).

Standard library only: the CLI imports it without Django.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

INT32_MAX = 2**31 - 1  # PositiveIntegerField / IntegerField on PostgreSQL
ID_MAX = 2**63 - 1  # BigAutoField, and SQLite's INTEGER
DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class Bound:
    """low ≤ value ≤ high, with at most `places` decimals (0: whole numbers)."""

    low: Decimal
    high: Decimal
    places: int = 0
    unit: str = ""

    @classmethod
    def of(cls, low: int | str, high: int | str, places: int = 0, unit: str = "") -> Bound:
        return cls(Decimal(low), Decimal(high), places, unit)

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        kind = "a whole number" if self.places == 0 else "a number"
        return f"Enter {kind} from {fmt(self.low)} to {fmt(self.high)}{unit}."

    def check(self, value: Any) -> tuple[Decimal | None, str | None]:
        """(the number, None) when in bounds, else (None, a message for the field)."""
        if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
            return None, self.describe()
        try:
            number = Decimal(str(value).strip())
        except (InvalidOperation, ValueError):
            return None, self.describe()
        if not number.is_finite() or not self.low <= number <= self.high:
            return None, self.describe()
        step = Decimal(1).scaleb(-self.places)
        if number != number.quantize(step):
            if self.places == 0:
                return None, f"Enter a whole number. {self.describe()}"
            return None, f"Use at most {self.places} decimal places. {self.describe()}"
        return (number.quantize(step) if self.places else number), None

    def whole(self, value: Any) -> tuple[int | None, str | None]:
        number, error = self.check(value)
        return (None, error) if number is None else (int(number), None)


def fmt(value: Decimal) -> str:
    """2.50 -> '2.5', 8.00 -> '8', 100 -> '100' (never '1E+2'): as a person writes it."""
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# --- A workload's request, per pod ----------------------------------------------------------
# Workload.gpus is DECIMAL(6, 3); no server carries more than a few dozen GPUs.
GPUS = Bound.of(0, 256, places=3, unit="GPUs")
GPU_RANGE = Bound.of(1, 256, unit="GPUs")  # min_gpus..max_gpus: whole GPUs of one pod
# Workload.cpu is DECIMAL(7, 2) (99999.99); the largest servers have a few hundred cores.
CPU = Bound.of(0, 4096, places=2, unit="CPU cores")
# 64 TiB: more memory than any single machine sold; an integer column holds 2 PiB.
MEMORY_MIB = Bound.of(1, 64 * 1024 * 1024, unit="MiB")
MEMORY_GIB = Bound.of(1, 64 * 1024, unit="GiB")
# 1 TiB on one GPU: several times today's largest.
GPU_MEMORY_MIB = Bound.of(0, 1024 * 1024, unit="MiB")
GPU_MEMORY_GIB = Bound.of(0, 1024, unit="GiB")
# Pods of one workload (workers, replicas, the gang minimum): the cycle places each one.
PODS = Bound.of(1, 1000, unit="pods")
# A year: "no limit" is an empty field, and now + runtime must stay a valid date.
RUNTIME_S = Bound.of(1, 366 * DAY_S, unit="seconds")
DURATION_S = RUNTIME_S
# A day: longer would let one stopped workload hold its GPUs hostage.
GRACE_S = Bound.of(0, DAY_S, unit="seconds")
# How often training saves a checkpoint: an eviction may wait up to one interval for it
# (engine/actions/victims.py), so a week at most; under a minute is no checkpoint to wait for.
CHECKPOINT_INTERVAL_S = Bound.of(60, 7 * DAY_S, unit="seconds")
# Scale-on-requests target of an elastic service (scheduling/load.py counts them): up to
# 1,000 a second per replica; what one replica serves is for its owner to say.
SCALE_TARGET_REQUESTS = Bound.of(1, 60_000, unit="requests per replica per minute")
PORT = Bound.of(1, 65535)
# Processes and threads per pod (a local pod's cgroup pids.max): enough for a data loader's
# workers, and far below what the kernel's pid space holds (4 million). The cluster's own
# `pids_max` (an admin's, default 1024) caps what a workload asks (clusters.backends.cgroups).
PIDS_MAX = Bound.of(16, 1_048_576, unit="processes")
# The command line, its arguments and the environment, each: far below what a Kubernetes
# object (1.5 MB) or an exec() (ARG_MAX) can carry.
PROGRAM_TEXT_MAX = 64 * 1024
# Any other field of a submission, as text (text_size), before anything parses it: a
# megabyte `command` once cost the server most of a minute of shlex before its 400.
FIELD_TEXT_MAX = 8 * 1024
PORTS_MAX = 100
# HPO: sweeps.MAX_TRIALS caps the trials; the seed is any 32-bit number.
TRIALS = Bound.of(1, 200, unit="trials")
SEED = Bound.of(0, INT32_MAX)
# Workload policy: a cap of GPUs per workload (DECIMAL(7, 3)).
POLICY_GPUS = Bound.of(0, 9999, places=3, unit="GPUs")

# Quotas per pool (DECIMAL(9, 2); memory DECIMAL(11, 2) keeps to the same bound).
QUOTA = Bound.of(0, "9999999.99", places=2)
# Idle culling: minutes before a warning and a stop (now - minutes must stay a valid date).
IDLE_MINUTES = Bound.of(1, 366 * 24 * 60, unit="minutes")

# --- Query parameters -----------------------------------------------------------------------
ID = Bound.of(1, ID_MAX)
PAGE_LIMIT = Bound.of(1, 1000)
PAGE_OFFSET = Bound.of(0, INT32_MAX)
LOG_LINES = Bound.of(1, 10_000, unit="lines")
# Report periods: dates a person could mean, with room for the +1 day and time-zone
# arithmetic around them (year 9999 overflows Python's datetime).
FIRST_DATE = dt.date(1970, 1, 1)
LAST_DATE = dt.date(2999, 12, 31)


@dataclass(frozen=True, slots=True)
class Shape:
    """Limits of a JSON value a user sends as it is (a sweep's search space, a workload's
    params): its size as compact JSON, how deeply it nests (a scalar is 0) and how many
    keys and list items it holds in all. Each is stored in a workload and returned in
    every list of workloads."""

    bytes: int
    depth: int
    items: int

    def check(self, value: Any) -> str | None:
        """None when `value` keeps to the limits, else a message for the field."""
        items, stack = 0, [(value, 1)]
        while stack:
            item, level = stack.pop()
            if not isinstance(item, dict | list):
                continue
            if level > self.depth:
                return f"Nest at most {self.depth} levels deep."
            items += len(item)
            if items > self.items:
                return f"Use at most {self.items} keys and values in all."
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
        too_big = text_size(value, self.bytes) > self.bytes
        if too_big or len(json.dumps(value, separators=(",", ":"), default=str)) > self.bytes:
            return f"Keep it under {self.bytes} bytes as JSON."
        return None


def text_size(value: Any, limit: int) -> int:
    """About how many characters `value` takes as text: a string its length, a number its
    digits, one more for each item of a list or mapping. Counting stops once past `limit`,
    so refusing a megabyte costs no more than reading `limit` characters of it."""
    size, stack = 0, [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, dict | list | tuple):
            size += len(item)
            if size <= limit:
                stack.extend(item)  # a mapping's keys, then its values
                if isinstance(item, dict):
                    stack.extend(item.values())
        elif isinstance(item, str):
            size += len(item)
        elif item is not None:
            size += len(str(item))
    return size


# A sweep's search space, and the params a workload carries (a trial's values): a grid of
# a few hundred values fits with room to spare.
PARAMS = Shape(bytes=8 * 1024, depth=5, items=1000)


def pod_index(pods: int) -> Bound:
    """Which pod of a workload of `pods` pods: 0 to pods - 1."""
    return Bound.of(0, max(pods - 1, 0))


def query_id(value: Any) -> int | None:
    """An object id from a query string, or None for anything that cannot be one."""
    number, _ = ID.whole(value) if value not in (None, "") else (None, None)
    return number


def date_error(value: dt.date | None) -> str | None:
    if value is not None and not FIRST_DATE <= value <= LAST_DATE:
        return f"Give a date from {FIRST_DATE:%Y-%m-%d} to {LAST_DATE:%Y-%m-%d}."
    return None


# A manifest submitted as YAML (`gpupool submit -f`, the "From YAML" form): one object, a
# Pod or a Job, is a few KiB; the API server takes at most about 1.5 MiB per object.
MANIFEST_MAX_BYTES = 128 * 1024
