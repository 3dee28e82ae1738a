"""Validating and writing raw GPU samples quickly (COPY on PostgreSQL, bulk_create elsewhere).

The per-row work is a handful of dict reads and float conversions: ingestion has to keep
up with every GPU of every node reporting every few seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from clusters.metrics import conf
from clusters.metrics.models import AllocationInterval, GpuProcessSample, GpuSample
from clusters.models import Gpu, Node
from portal.errors import ValidationFailed
from scheduling.models import PodAllocation

SAMPLE_COLUMNS = (
    "ts",
    "node_id",
    "gpu_index",
    "util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "temp_c",
    "workload_id",
    "pod_index",
)
PROCESS_COLUMNS = ("ts", "node_id", "gpu_index", "pid", "used_mib", "workload_id", "pod_index")
UTC = dt.UTC
FUTURE_SLACK = dt.timedelta(minutes=10)


def parse_ts(value: Any) -> dt.datetime:
    """Seconds since the epoch, an ISO 8601 string, or an aware datetime."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise ValueError(f"not a timestamp: {value!r}")


def _number(sample: dict[str, Any], key: str, low: float, high: float) -> float:
    value = sample[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    if not low <= value <= high:
        raise ValueError(f"{key} must be between {low} and {high}")
    return float(value)


def _optional(sample: dict[str, Any], key: str, low: float, high: float) -> float | None:
    return None if sample.get(key) is None else _number(sample, key, low, high)


def _optional_int(sample: dict[str, Any], key: str) -> int | None:
    value = sample.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value


def sample_row(sample: dict[str, Any], node_id: int) -> tuple[Any, ...]:
    """One validated sample as a row in SAMPLE_COLUMNS order; ValueError says what is wrong."""
    gpu_index = sample.get("gpu_index", sample.get("gpu"))
    if isinstance(gpu_index, bool) or not isinstance(gpu_index, int) or not 0 <= gpu_index < 1024:
        raise ValueError("gpu_index must be an integer from 0 to 1023")
    return (
        parse_ts(sample["ts"]),
        node_id,
        gpu_index,
        _number(sample, "util_pct", 0, 100),
        int(_number(sample, "mem_used_mib", 0, 2**31 - 1)),
        int(_number(sample, "mem_total_mib", 0, 2**31 - 1)),
        _optional(sample, "power_w", 0, 100_000),
        _optional(sample, "temp_c", -100, 300),
        _optional_int(sample, "workload_id"),
        _optional_int(sample, "pod_index"),
    )


def process_rows(sample: dict[str, Any], row: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    rows = []
    for proc in sample.get("processes") or ():
        if not isinstance(proc, dict):
            raise ValueError("processes must be a list of objects")
        pid = _optional_int(proc, "pid")
        if pid is None:
            raise ValueError("each process needs a pid")
        used = int(_number(proc, "used_mib", 0, 2**31 - 1)) if "used_mib" in proc else 0
        workload = _optional_int(proc, "workload_id")
        rows.append((row[0], row[1], row[2], pid, used, workload, _optional_int(proc, "pod_index")))
    return rows


@dataclass(frozen=True, slots=True)
class AgentScope:
    """What one node's agent may report: its node's GPUs, the workloads with a pod on
    that node (now, or since `earliest`), at times since `earliest` (raw retention: an older
    sample would only be deleted, after rewinding the roll-ups to redo days of minutes)."""

    node_id: int
    gpus: frozenset[int]
    workloads: frozenset[int]
    earliest: dt.datetime

    def check(self, row: tuple[Any, ...], procs: list[tuple[Any, ...]]) -> None:
        """ValueError naming the key of a sample row (SAMPLE_COLUMNS) or process row
        (PROCESS_COLUMNS) that is outside the agent's node."""
        if row[1] != self.node_id:
            raise ValueError("node_id: an agent reports for its own node only")
        if row[2] not in self.gpus:
            raise ValueError(f"gpu_index {row[2]} is not a GPU of this node")
        for workload, where in [(row[8], ""), *((p[5], "processes: ") for p in procs)]:
            if workload is not None and workload not in self.workloads:
                raise ValueError(f"{where}workload_id {workload} has no pod on this node")
        if row[0] < self.earliest:
            raise ValueError(
                f"ts {row[0].isoformat(' ', 'seconds')} is before "
                f"{self.earliest.isoformat(' ', 'minutes')}, the oldest time samples are kept for"
            )


def agent_scope(node_id: int, now: dt.datetime | None = None) -> AgentScope:
    earliest = conf.raw_horizon(now or timezone.now())
    recent = Q(ended_at__isnull=True) | Q(ended_at__gte=earliest)
    held = AllocationInterval.objects.filter(recent, node_id=node_id)
    placed = PodAllocation.objects.filter(node_id=node_id)  # an interval not yet written
    return AgentScope(
        node_id=node_id,
        gpus=frozenset(Gpu.objects.filter(node_id=node_id).values_list("index", flat=True)),
        workloads=frozenset(held.values_list("workload_id", flat=True))
        | frozenset(placed.values_list("workload_id", flat=True)),
        earliest=earliest,
    )


def node_ids_for(samples: Sequence[dict[str, Any]]) -> dict[tuple[Any, str], int]:
    """Resolve (cluster, node name) pairs, where samples name nodes that way, in one query."""
    wanted = {
        (s.get("cluster"), s.get("node"))
        for s in samples
        if s.get("node_id") is None and s.get("node") is not None
    }
    if not wanted:
        return {}
    names = {name for _, name in wanted}
    found: dict[tuple[Any, str], int] = {}
    rows = Node.objects.filter(name__in=names).values_list(
        "id", "name", "cluster_id", "cluster__name"
    )
    for node_id, name, cluster_id, cluster_name in rows:
        found[(cluster_id, name)] = node_id
        found[(cluster_name, name)] = node_id
        found[(str(cluster_id), name)] = node_id
    return found


def rows_for(
    samples: Sequence[dict[str, Any]], scope: AgentScope | None = None
) -> tuple[list[tuple], list[tuple]]:
    """Validate every sample (and, from an agent, keep it to its `scope`); the first bad
    one raises ValidationFailed naming its position."""
    by_name = node_ids_for(samples)
    # A node whose clock runs ahead would write samples that show up only days later.
    latest = timezone.now() + FUTURE_SLACK
    rows: list[tuple] = []
    procs: list[tuple] = []
    for position, sample in enumerate(samples):
        try:
            if not isinstance(sample, dict):
                raise ValueError("each sample must be an object")
            node_id = sample.get("node_id")
            if node_id is None:
                node_id = by_name.get((sample.get("cluster"), sample.get("node")))
            if isinstance(node_id, bool) or not isinstance(node_id, int):
                raise ValueError("node_id (or a known cluster and node name) is required")
            row = sample_row(sample, node_id)
            if row[0] > latest:
                raise ValueError(
                    f"ts {row[0]:%Y-%m-%d %H:%M:%S %Z} is in the future; check the node's clock"
                )
            own = process_rows(sample, row) if sample.get("processes") else []
            if scope is not None:
                scope.check(row, own)
            rows.append(row)
            procs.extend(own)
        except KeyError as exc:
            raise ValidationFailed(
                {"samples": [f"sample {position}: {exc.args[0]} is missing"]}
            ) from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValidationFailed({"samples": [f"sample {position}: {exc}"]}) from None
    check_nodes_exist({row[1] for row in rows})
    return rows, procs


def check_nodes_exist(node_ids: set[int]) -> None:
    """Samples carry plain node ids (no foreign key, for COPY speed): check them once a batch."""
    known = set(Node.objects.filter(pk__in=node_ids).values_list("pk", flat=True))
    unknown = sorted(node_ids - known)
    if unknown:
        raise ValidationFailed({"samples": [f"unknown node id(s): {unknown[:10]}"]})


def copy_rows(table: str, columns: Sequence[str], rows: Iterable[tuple]) -> None:
    """PostgreSQL COPY through psycopg 3: an order of magnitude faster than INSERTs."""
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row(row)


def write_rows(rows: list[tuple], procs: list[tuple]) -> None:
    if connection.vendor == "postgresql":
        with transaction.atomic():
            copy_rows(GpuSample._meta.db_table, SAMPLE_COLUMNS, rows)
            if procs:
                copy_rows(GpuProcessSample._meta.db_table, PROCESS_COLUMNS, procs)
        return
    with transaction.atomic():
        GpuSample.objects.bulk_create(
            [GpuSample(**dict(zip(SAMPLE_COLUMNS, row, strict=True))) for row in rows],
            batch_size=2000,
        )
        GpuProcessSample.objects.bulk_create(
            [GpuProcessSample(**dict(zip(PROCESS_COLUMNS, row, strict=True))) for row in procs],
            batch_size=2000,
        )
