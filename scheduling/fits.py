"""Could any node ever hold one pod of this request? Checked at submit, against the inventory.

A request that no node of its pools could hold even when idle (4 GPUs on a pool of CPU
nodes, more memory than any machine) would wait forever; it is refused with the largest
node named instead. Only what a pod needs of one node is compared: whether the pool has
room *now* is the scheduler's business. Before the first inventory sync there are no
nodes to compare with, and only the static bounds (scheduling.bounds) apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Count, Max, Q

from clusters.models import Gpu, Node
from scheduling.bounds import fmt
from scheduling.engine.mig import AUTO, profile_for, profiles_for
from scheduling.engine.types import PodRequest
from scheduling.kept import kept
from scheduling.models import GpuRequestKind


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """What one node could give one pod when nothing else runs on it (0 = not reported)."""

    name: str
    pool: str
    gpus: int
    gpu_memory_mib: int
    cpu: Decimal
    memory_mib: int


# field, what one node offers of it, words for the message, and whether 0 means "not
# reported" (the scheduler then does not hold cpu or memory against a pod either).
Measure = tuple[str, Callable[[NodeRoom], Any], str, bool]
MEASURES: list[Measure] = [
    ("gpus", lambda room: room.gpus, "GPUs", False),
    ("gpu_memory_mib", lambda room: room.gpu_memory_mib, "MiB of memory on one GPU", False),
    ("cpu", lambda room: room.cpu, "CPU cores", True),
    ("memory_mib", lambda room: room.memory_mib, "MiB of memory", True),
]


def fit_errors(fields: dict[str, Any]) -> dict[str, list[str]]:
    """Messages per field when no node in the request's pools could hold one of its pods."""
    rooms = node_rooms(fields["node_pools"], fields["gpu_model"])
    if not rooms:
        return {}
    need = _needs(fields)
    if any(_fits(need, room) for room in rooms):
        return {}
    pools = sorted({room.pool for room in rooms})
    where = f"pool {pools[0]}" if len(pools) == 1 else f"pools {', '.join(pools)}"
    errors: dict[str, list[str]] = {}
    for field, offered, words, zero_unbounded in MEASURES:
        if not need[field] or (zero_unbounded and not all(offered(room) for room in rooms)):
            continue
        largest = max(rooms, key=offered)  # the first by name among equals
        if need[field] > offered(largest):
            errors[field] = [
                f"No node of {where} can hold {fmt(Decimal(need[field]))} {words} for one pod: "
                f"the largest, {largest.name} (pool {largest.pool}), has "
                f"{fmt(Decimal(offered(largest)))} {words}."
            ]
    if not errors:  # each resource fits some node, but no node has them all together
        errors["__all__"] = [f"No single node of {where} has all this pod asks for at once."]
    return errors


def mig_errors(fields: dict[str, Any]) -> dict[str, list[str]]:
    """For a MIG request: the pools asked (all when none) must have MIG-enabled GPUs, and one
    of their models must offer the profile (or a profile holding the memory asked)."""
    if fields["gpu_request"] != GpuRequestKind.MIG:
        return {}
    pools = fields["node_pools"]
    gpus = Gpu.objects.filter(node__cluster__enabled=True, node__pool__isnull=False)
    if pools:
        gpus = gpus.filter(node__pool__name__in=pools)
    models = [m for m in fields["gpu_model"].split("|") if m]
    if models:
        gpus = gpus.filter(model__in=models)
    if not gpus.exists():
        return {}  # before the first inventory sync only the static checks apply
    found = set(gpus.filter(mig_enabled=True).values_list("model", "memory_mib").distinct())
    where = f"pool {', '.join(pools)}" if pools else "any pool"
    if not found:
        field = "node_pools" if pools else "gpu_request"
        return {field: [f"{where.capitalize()} has no MIG-enabled GPU; ask for whole GPUs, "
                        "a fraction or GPU memory there."]}  # fmt: skip
    pod = PodRequest(mig_profile=fields["mig_profile"], gpu_memory_mib=fields["gpu_memory_mib"])
    offered: set[str] = set()
    for model, memory in sorted(found):
        profiles = profiles_for(model, memory)
        if profile_for(pod, profiles) is not None:
            return {}
        offered.update(profiles)
    asked = fields["mig_profile"]
    what = f"{fields['gpu_memory_mib']} MiB" if asked == AUTO else f"profile {asked}"
    return {"mig_profile": [f"No MIG-enabled GPU in {where} offers {what}; offered: "
                            f"{', '.join(sorted(offered)) or 'none'}."]}  # fmt: skip


def node_rooms(pools: list[str], gpu_model: str) -> list[NodeRoom]:
    """The nodes the scheduler could use for these pools (all pools when none is named),
    with only the GPUs of the wanted models counted: one query, whatever the inventory
    (read once inside a `scheduling.kept.reads_kept` block)."""
    return kept(("node_rooms", tuple(pools), gpu_model), lambda: _node_rooms(pools, gpu_model))


def _node_rooms(pools: list[str], gpu_model: str) -> list[NodeRoom]:
    models = [m for m in gpu_model.split("|") if m]
    wanted = Q(gpus__model__in=models) if models else Q()
    nodes = Node.objects.filter(cluster__enabled=True, pool__isnull=False)
    if pools:
        nodes = nodes.filter(pool__name__in=pools)
    rows = nodes.annotate(
        gpu_count=Count("gpus", filter=wanted), gpu_memory=Max("gpus__memory_mib", filter=wanted)
    ).order_by("name")
    return [
        NodeRoom(
            name=row["name"],
            pool=row["pool__name"],
            gpus=row["gpu_count"],
            gpu_memory_mib=row["gpu_memory"] or 0,
            cpu=row["cpu_cores"],
            memory_mib=row["memory_mib"],
        )
        for row in rows.values(
            "name", "pool__name", "gpu_count", "gpu_memory", "cpu_cores", "memory_mib"
        )
    ]


def _needs(fields: dict[str, Any]) -> dict[str, Any]:
    request = fields["gpu_request"]
    # A fraction or a slice of GPU memory still needs one GPU on the node.
    gpus = fields["gpus"] if request == GpuRequestKind.WHOLE else 1
    memory = fields["gpu_memory_mib"] if request == GpuRequestKind.MEMORY else 0
    # (a MIG request's memory is checked against the MIG profiles: mig_errors)
    return {"gpus": gpus, "gpu_memory_mib": memory, "cpu": fields["cpu"],
            "memory_mib": fields["memory_mib"]}  # fmt: skip


def _fits(need: dict[str, Any], room: NodeRoom) -> bool:
    return (
        need["gpus"] <= room.gpus
        and (not need["gpu_memory_mib"] or need["gpu_memory_mib"] <= room.gpu_memory_mib)
        and (not room.cpu or need["cpu"] <= room.cpu)
        and (not room.memory_mib or need["memory_mib"] <= room.memory_mib)
    )
