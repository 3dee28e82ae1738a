"""The private-cluster baseline: each team alone on a cluster the size of its quota, FIFO.

"Extra queueing" compares a team's queueing in the shared cluster with this: what the team
would have waited had it bought exactly its guaranteed GPUs for itself. A private cluster
too small for the team's largest job is grown until that job fits (otherwise the job would
never start and the baseline would be meaningless); the summary says when that happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from scheduling.engine.sim.loop import Policy, SimConfig, Simulation
from scheduling.engine.sim.metrics import mean
from scheduling.engine.sim.specs import NodeSpec, QuotaSpec, TeamQuota
from scheduling.engine.sim.trace import TraceJob


@dataclass(frozen=True, slots=True)
class PrivateResult:
    """One team's private-cluster replay."""

    gpus: int
    grown: bool  # the quota was too small for the team's largest job
    mean_queueing_s: float | None


def _needed_gpus(jobs: list[TraceJob], gpus_per_node: int) -> int:
    """GPUs a private cluster needs for its largest job (gangs take whole nodes)."""
    need = 0
    for job in jobs:
        if job.is_cpu_only:
            continue
        if job.pods > 1:
            per_node = gpus_per_node // max(1, math.ceil(job.gpus_per_pod))
            need = max(need, math.ceil(job.pods / max(per_node, 1)) * gpus_per_node)
        else:
            need = max(need, math.ceil(job.gpus))
    return need


def private_nodes(
    team: str, quotas: QuotaSpec, shared: list[NodeSpec], jobs: list[TraceJob]
) -> tuple[list[NodeSpec], bool]:
    """Nodes shaped like the shared pool's, holding the team's deserved GPUs per pool."""
    nodes: list[NodeSpec] = []
    grown = False
    team_quotas = quotas.quotas.get(team, {})
    templates: dict[str, NodeSpec] = {}
    for node in shared:
        templates.setdefault(node.pool, node)  # each pool's first node is its shape
    main_pool = max(team_quotas, key=lambda p: (team_quotas[p].deserved, p), default=None)
    for pool, template in templates.items():
        gpus = round(team_quotas[pool].deserved) if pool in team_quotas else 0
        if pool == (main_pool or shared[0].pool):
            need = _needed_gpus(jobs, template.gpus)
            grown = need > gpus
            gpus = max(gpus, need)
        nodes.extend(_nodes_holding(template, gpus, len(nodes)))
    if not nodes and jobs:  # only CPU-only jobs: one node of the shared shape, no GPUs
        nodes = [replace(shared[0], name="private-000", gpus=0)]
    return nodes, grown


def _nodes_holding(template: NodeSpec, gpus: int, start: int) -> list[NodeSpec]:
    full, rest = divmod(gpus, template.gpus)
    sizes = [template.gpus] * full + ([rest] if rest else [])
    return [
        NodeSpec(
            name=f"private-{start + i:03d}",
            pool=template.pool,
            gpus=size,
            gpu_model=template.gpu_model,
            gpu_memory_mib=template.gpu_memory_mib,
            rack=template.rack,
            cpu=template.cpu,
            memory_gib=template.memory_gib,
        )
        for i, size in enumerate(sizes)
    ]


def private_cluster_queueing(
    team: str,
    jobs: list[TraceJob],
    quotas: QuotaSpec,
    shared: list[NodeSpec],
    config: SimConfig,
    fifo_factory: Callable[[Simulation], Policy],
) -> PrivateResult:
    """Replay the team's jobs alone on its private cluster and return its mean queueing."""
    nodes, grown = private_nodes(team, quotas, shared, jobs)
    own = QuotaSpec(
        quotas={team: {n.pool: TeamQuota(deserved=n.gpus) for n in nodes[:1]}},
        departments={team: "default"},
    )
    sim = Simulation(nodes, jobs, own, fifo_factory, config).run()
    waits = [run.waited(sim.now) for run in sim.runs.values()]
    return PrivateResult(sum(n.gpus for n in nodes), grown, mean(waits))
