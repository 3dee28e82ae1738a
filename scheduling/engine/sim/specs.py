"""The cluster and quota descriptions (JSON) the simulator reads, and generated quotas.

Cluster: {"pools": [{"name": "a100", "nodes": [{"count": 96, "gpus": 8, "gpu_model": "A100",
"gpu_memory_mib": 81920, "cpu": 96, "memory_gib": 1024, "nodes_per_rack": 8}]}]}. A node
entry without count is one node; "name" or "prefix" names it, "rack" pins its rack;
"mig_gpus": the last so many GPUs of each node are MIG-enabled, and "mig_layout" (profile
names, e.g. ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) is the layout they hold when the
replay pre-partitions them (--mig-layout static).
Quotas: {"teams": {"vision": {"department": "research", "pools": {"a100": {"deserved": 16,
"limit": 32, "weight": 1}}}}}. See docs/simulator.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduling.engine.mig import best_start, canonical_model, table
from scheduling.engine.sim.trace import TraceJob


class SpecError(ValueError):
    """A cluster or quota description is not valid; the message says where."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node to simulate."""

    name: str
    pool: str
    gpus: int
    gpu_model: str
    gpu_memory_mib: int
    rack: str
    cpu: float | None = None
    memory_gib: float | None = None
    mig_gpus: int = 0  # the last so many devices are MIG-enabled
    mig_layout: tuple[tuple[str, int], ...] = ()  # (profile, start) of a static layout


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """One team's quota in one pool, in GPUs."""

    deserved: float
    limit: float | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """Quotas per team (project) and pool; department groups teams (one level up)."""

    quotas: Mapping[str, Mapping[str, TeamQuota]]  # team -> pool -> quota
    departments: Mapping[str, str]  # team -> department

    def deserved(self, team: str) -> float:
        """The team's deserved GPUs summed over pools."""
        return sum(q.deserved for q in self.quotas.get(team, {}).values())


def mig_layout(pool: str, entry: Mapping[str, Any]) -> tuple[int, tuple[tuple[str, int], ...]]:
    """(mig_gpus, static layout as (profile, start)) of a node entry. A layout takes its
    profiles in order, each at the start the engine would cut it at, and must fill the
    device (a static layout leaves no room for the engine to cut another instance)."""
    where = f"pool {pool}: node entry"
    count = entry.get("mig_gpus", 0)
    gpus = int(entry.get("gpus", 0))
    if not isinstance(count, int) or not 0 <= count <= gpus:
        raise SpecError(f"{where}: mig_gpus must be a whole number from 0 to gpus ({gpus})")
    names = entry.get("mig_layout", [])
    if not count:
        if names:
            raise SpecError(f"{where}: mig_layout needs mig_gpus")
        return 0, ()
    model = str(entry.get("gpu_model", "gpu"))
    canonical = canonical_model(model, int(entry.get("gpu_memory_mib", 16384)))
    if canonical is None:
        raise SpecError(f"{where}: mig_gpus: GPU model {model!r} has no MIG")
    if not isinstance(names, list):
        raise SpecError(f"{where}: mig_layout must be a list of profile names")
    profiles, used, layout = table(canonical), 0, []
    for name in names:
        if name not in profiles:
            raise SpecError(f"{where}: mig_layout: {canonical} has no profile {name!r}")
        start = best_start(canonical, used, name)
        if start is None:
            raise SpecError(f"{where}: mig_layout: {name} does not fit beside {layout}")
        used |= profiles[name].mask(start)
        layout.append((name, start))
    if layout and any(best_start(canonical, used, other) is not None for other in profiles):
        raise SpecError(f"{where}: mig_layout leaves room for another instance; fill the GPU")
    return count, tuple(layout)


def _node_entries(pool: str, entry: Mapping[str, Any], start: int) -> list[NodeSpec]:
    count = int(entry.get("count", 1))
    mig_gpus, layout = mig_layout(pool, entry)
    prefix = str(entry.get("prefix", f"{pool}-n"))
    per_rack = int(entry.get("nodes_per_rack", 0))
    nodes = []
    for offset in range(count):
        number = start + offset
        name = str(entry["name"]) if count == 1 and "name" in entry else f"{prefix}{number:03d}"
        rack = entry.get("rack") or (f"{pool}-r{number // per_rack:02d}" if per_rack else "")
        memory = entry.get("memory_gib")
        nodes.append(
            NodeSpec(
                name=name,
                pool=pool,
                gpus=int(entry["gpus"]),
                gpu_model=str(entry.get("gpu_model", "gpu")),
                gpu_memory_mib=int(entry.get("gpu_memory_mib", 16384)),
                rack=str(rack),
                cpu=float(entry["cpu"]) if "cpu" in entry else None,
                memory_gib=float(memory) if memory is not None else None,
                mig_gpus=mig_gpus,
                mig_layout=layout,
            )
        )
    return nodes


def cluster_from_dict(data: Mapping[str, Any]) -> list[NodeSpec]:
    """Every node of the cluster description, pool by pool, in file order."""
    nodes: list[NodeSpec] = []
    for pool in data.get("pools", []):
        name = str(pool["name"])
        for entry in pool.get("nodes", []):
            nodes.extend(_node_entries(name, entry, len(nodes)))
    if not nodes:
        raise SpecError("the cluster has no nodes")
    if len({node.name for node in nodes}) != len(nodes):
        raise SpecError("node names are not unique")
    return nodes


def quotas_from_dict(data: Mapping[str, Any]) -> QuotaSpec:
    """The quota description; a team's pool entry needs at least `deserved`."""
    quotas: dict[str, dict[str, TeamQuota]] = {}
    departments: dict[str, str] = {}
    for team, entry in data.get("teams", {}).items():
        departments[team] = str(entry.get("department", "default"))
        quotas[team] = {
            pool: TeamQuota(
                deserved=float(q["deserved"]),
                limit=float(q["limit"]) if q.get("limit") is not None else None,
                weight=float(q.get("weight", 1.0)),
            )
            for pool, q in entry.get("pools", {}).items()
        }
    return QuotaSpec(quotas=quotas, departments=departments)


def quotas_to_dict(spec: QuotaSpec) -> dict[str, Any]:
    """The JSON form of a quota description (inverse of quotas_from_dict)."""
    teams = {}
    for team, pools in sorted(spec.quotas.items()):
        teams[team] = {
            "department": spec.departments.get(team, "default"),
            "pools": {
                pool: {"deserved": q.deserved, "limit": q.limit, "weight": q.weight}
                for pool, q in sorted(pools.items())
            },
        }
    return {"teams": teams}


def load_json(path: Path) -> Any:
    """A JSON file, with the path in the error when it does not parse."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SpecError(f"{path}: {error}") from error


def team_gpu_hours(jobs: Iterable[TraceJob], horizon: float) -> dict[str, float]:
    """GPU-hours each team asks for; a job that never ends counts until `horizon`."""
    hours: dict[str, float] = {}
    for job in jobs:
        length = job.duration if job.duration is not None else max(horizon - job.submit, 0.0)
        hours[job.team] = hours.get(job.team, 0.0) + job.gpus * length / 3600
    return hours


def largest_remainder(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Integers proportional to weights that add up to total (Hamilton's method)."""
    weight_sum = sum(weights.values())
    if weight_sum <= 0:
        return dict.fromkeys(weights, 0)
    exact = {key: total * w / weight_sum for key, w in weights.items()}
    result = {key: math.floor(value) for key, value in exact.items()}
    short = total - sum(result.values())
    # Ties go to the name that sorts first so the split is the same on every run.
    order = sorted(exact, key=lambda key: (result[key] - exact[key], key))
    for key in order[:short]:
        result[key] += 1
    return result


def proportional_quotas(jobs: list[TraceJob], nodes: list[NodeSpec]) -> QuotaSpec:
    """Each pool's GPUs split between teams in proportion to their GPU-hours in the trace.

    The over-quota weight equals the deserved quota, so idle GPUs are lent in the same
    proportions as the guarantees; no limits.
    """
    horizon = max((job.submit for job in jobs), default=0.0)
    hours = team_gpu_hours(jobs, horizon)
    capacity: dict[str, int] = {}
    for node in nodes:
        capacity[node.pool] = capacity.get(node.pool, 0) + node.gpus
    quotas: dict[str, dict[str, TeamQuota]] = {team: {} for team in hours}
    for pool, gpus in capacity.items():
        for team, share in largest_remainder(hours, gpus).items():
            quotas[team][pool] = TeamQuota(deserved=float(share), weight=float(max(share, 1)))
    return QuotaSpec(quotas=quotas, departments=dict.fromkeys(hours, "default"))
