"""The private-cluster baselines: each team alone on a cluster of its quota, FIFO.

"Extra queueing" compares a team's queueing in the shared cluster with this: what the team
would have waited had it bought its guaranteed GPUs for itself. Two replays per team:

- grown: a private cluster too small for the team's largest job is grown until that job
  fits (otherwise the job would never start); the summary says when that happened. This
  is the historical figure (`extra_queueing_s`), but a grown cluster gives the team more
  GPUs than it is guaranteed in the pool, so no scheduler can promise it (docs/simulator.md,
  "No team worse off").
- within quota: a cluster of exactly the quota, replaying only the jobs that fit on it;
  jobs larger than the quota could never run there and are left out of the comparison
  (`extra_queueing_within_quota_s`, over the same jobs in the shared replay). This is the
  sharing incentive a guaranteed quota can keep.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

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
    quota_gpus: int = 0  # the within-quota replay's cluster: exactly the quota
    quota_waits: Mapping[str, float] = field(default_factory=dict)  # job id -> wait there
    larger_than_quota: int = 0  # jobs left out: they cannot run on the quota's cluster


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
    team: str,
    quotas: QuotaSpec,
    shared: list[NodeSpec],
    jobs: list[TraceJob],
    grow: bool = True,
) -> tuple[list[NodeSpec], bool]:
    """Nodes shaped like the shared pool's, holding the team's deserved GPUs per pool
    (grown in the team's main pool to fit its largest job, unless `grow` is False)."""
    nodes: list[NodeSpec] = []
    grown = False
    team_quotas = quotas.quotas.get(team, {})
    templates: dict[str, NodeSpec] = {}
    for node in shared:
        templates.setdefault(node.pool, node)  # each pool's first node is its shape
    main_pool = max(team_quotas, key=lambda p: (team_quotas[p].deserved, p), default=None)
    for pool, template in templates.items():
        gpus = round(team_quotas[pool].deserved) if pool in team_quotas else 0
        if grow and pool == (main_pool or shared[0].pool):
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
    """Replay the team's jobs alone on its private clusters (grown, and exactly its quota)."""
    nodes, grown = private_nodes(team, quotas, shared, jobs)
    waits = _replay(team, nodes, jobs, config, fifo_factory)
    exact, _ = private_nodes(team, quotas, shared, jobs, grow=False)
    capacity = sum(n.gpus for n in exact)
    gpus_per_node = max((n.gpus for n in shared), default=0)
    fit = [job for job in jobs if _needed_gpus([job], gpus_per_node) <= capacity]
    within = _replay(team, exact, fit, config, fifo_factory) if grown else waits
    return PrivateResult(
        gpus=sum(n.gpus for n in nodes),
        grown=grown,
        mean_queueing_s=mean(list(waits.values())),
        quota_gpus=capacity,
        quota_waits=within,
        larger_than_quota=len(jobs) - len(fit),
    )


def _replay(
    team: str,
    nodes: list[NodeSpec],
    jobs: list[TraceJob],
    config: SimConfig,
    fifo_factory: Callable[[Simulation], Policy],
) -> dict[str, float]:
    """Each job's queueing when the team runs alone on `nodes`."""
    if not jobs or not nodes:
        return {}
    own = QuotaSpec(
        quotas={team: {n.pool: TeamQuota(deserved=n.gpus) for n in nodes[:1]}},
        departments={team: "default"},
    )
    sim = Simulation(nodes, jobs, own, fifo_factory, config).run()
    return {run.job.id: run.waited(sim.now) for run in sim.runs.values()}
