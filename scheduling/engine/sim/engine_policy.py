"""The `static` and `gpupool` policies: the replay's state as an engine snapshot, each cycle.

Teams become projects (leaf queues) under their department; a department's quota is the
sum of its teams'. `static` is the engine with over-quota borrowing forbidden for every
queue, so a team never holds more than its deserved GPUs; `gpupool` is the engine as
configured. Node and workload objects are cached and rebuilt only when they change, which
keeps building the snapshot cheap next to the cycle itself, and lets the engine (which
keeps its state between cycles, cycle.Engine) find what changed by identity.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduling.engine.cycle import Engine
from scheduling.engine.sim.specs import QuotaSpec, TeamQuota
from scheduling.engine.sim.state import NodeState
from scheduling.engine.sim.trace import TraceJob
from scheduling.engine.sim.usage import UsageHistory
from scheduling.engine.types import (
    CycleResult,
    Gpu,
    GpuShare,
    Node,
    PodRequest,
    Queue,
    Quota,
    Resource,
    SchedulerConfig,
    Snapshot,
    TopologyConstraint,
    TopologyMode,
    UsageRecord,
    Workload,
)

if TYPE_CHECKING:
    from scheduling.engine.sim.loop import JobRun, Simulation

MIB_PER_GIB = 1024


def build_queues(quotas: QuotaSpec, teams: set[str], borrowing: bool) -> tuple[Queue, ...]:
    """Departments and their projects with GPU quotas per pool."""
    members: dict[str, list[str]] = {}
    for team in sorted(teams | set(quotas.quotas)):
        members.setdefault(quotas.departments.get(team, "default"), []).append(team)
    queues: list[Queue] = []
    for department, department_teams in sorted(members.items()):
        totals: dict[str, list[TeamQuota]] = {}
        for team in department_teams:
            for pool, quota in quotas.quotas.get(team, {}).items():
                totals.setdefault(pool, []).append(quota)
        queues.append(Queue(id=f"dept:{department}", quotas=_sum_quotas(totals, borrowing)))
        queues.extend(
            Queue(
                id=team,
                parent_id=f"dept:{department}",
                quotas={
                    (pool, Resource.GPU): _quota(q, borrowing)
                    for pool, q in quotas.quotas.get(team, {}).items()
                },
            )
            for team in department_teams
        )
    return tuple(queues)


def _quota(quota: TeamQuota, borrowing: bool) -> Quota:
    return Quota(
        deserved=quota.deserved,
        limit=quota.limit,
        over_quota_weight=quota.weight,
        over_quota_allowed=borrowing,
    )


def _sum_quotas(
    totals: dict[str, list[TeamQuota]], borrowing: bool
) -> dict[tuple[str, Resource], Quota]:
    result = {}
    for pool, quotas in totals.items():
        limits = [q.limit for q in quotas]
        result[(pool, Resource.GPU)] = Quota(
            deserved=sum(q.deserved for q in quotas),
            limit=None if None in limits else sum(lim for lim in limits if lim is not None),
            over_quota_weight=sum(q.weight for q in quotas),
            over_quota_allowed=borrowing,
        )
    return result


def node_snapshot(node: NodeState, static_mig: bool = False) -> Node:
    """The engine's frozen view of one simulated node (with `static_mig` its MIG devices
    may not be repartitioned)."""
    spec = node.spec
    gpus = tuple(
        Gpu(
            index=gpu.index,
            model=spec.gpu_model,
            memory_mib=spec.gpu_memory_mib,
            whole_by=gpu.whole_by,
            shares=tuple(GpuShare(workload_id=job, share=share) for job, share in gpu.shares),
            mig=gpu.mig,
            mig_instances=tuple(gpu.instances),
        )
        for gpu in node.gpus
    )
    memory = None if spec.memory_gib is None else int(spec.memory_gib * MIB_PER_GIB)
    return Node(
        id=spec.name,
        pool=spec.pool,
        gpus=gpus,
        topology={"rack": spec.rack} if spec.rack else {},
        cpu=spec.cpu,
        memory_mib=memory,
        mig_repartition=not static_mig,
    )


def pod_requests(run: JobRun) -> tuple[PodRequest, ...]:
    """One request per pod of the job."""
    job = run.job
    if job.mig_profile:
        mig = PodRequest(
            mig_profile=job.mig_profile,
            gpu_memory_mib=job.gpu_memory_mib,
            cpu=job.cpu,
            memory_mib=int(job.memory_gib * MIB_PER_GIB),
        )
        return (mig,) * job.pods
    request = PodRequest(
        gpus=0 if job.is_fractional else int(job.gpus_per_pod),
        gpu_fraction=job.gpus_per_pod if job.is_fractional else 0.0,
        cpu=job.cpu,
        memory_mib=int(job.memory_gib * MIB_PER_GIB),
    )
    return (request,) * job.pods


def topology_of(job: TraceJob) -> TopologyConstraint | None:
    """The engine's topology rule for the job's topology_level / topology_required."""
    if not job.topology_level:
        return None
    mode = TopologyMode.REQUIRED if job.topology_required else TopologyMode.PREFERRED
    return TopologyConstraint(job.topology_level, mode)


def workload_snapshot(run: JobRun, now: float, interval: float, periodic: bool = True) -> Workload:
    """The engine's view of a pending or running job at `now`. Its checkpoint interval
    is told only to a replay with periodic cycles: the engine may then wait for a
    checkpoint that is due soon, and a later cycle acts once it is saved (an
    event-only replay might run none before the job ends)."""
    job = run.job
    checkpoint_every = interval or None if periodic else None
    checkpoint = None
    if run.run_start is not None:
        checkpoint = run.run_start + (run.checkpointed(now, interval) - run.saved) / run.rate
    return Workload(
        id=job.id,
        queue_id=job.team,
        pods=pod_requests(run),
        priority=job.priority,
        preemptible=job.preemptible,
        submit_time=job.submit,
        gpu_models=job.gpu_models,
        topology=topology_of(job),
        last_checkpoint_time=checkpoint,
        checkpoint_interval_s=checkpoint_every,
        started_at=run.run_start,
        placement=run.placement,
        restarts=run.preemptions,
        min_pods=job.min_pods if job.elastic else None,
        elastic=job.elastic,
        resized_at=run.resized_at,
    )


class EnginePolicy:
    """Calls scheduling.engine.schedule on a snapshot of the replay each cycle."""

    def __init__(
        self,
        sim: Simulation,
        name: str,
        config: SchedulerConfig,
        borrowing: bool,
        scheduler: Callable[[Snapshot, SchedulerConfig, float], CycleResult] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        # The engine keeps its state between cycles: a cycle pays for the jobs that
        # started, ended or were evicted since the last one, not for the whole cluster.
        self.engine = Engine()
        self.scheduler = scheduler or self.engine.schedule
        teams = {run.job.team for run in sim.runs.values()}
        self.queues = build_queues(sim.quotas, teams, borrowing)
        self.pools = tuple(dict.fromkeys(spec.pool for spec in sim.node_specs))
        self._nodes: dict[str, tuple[int, Node]] = {}
        self._workloads: dict[str, tuple[tuple, Workload]] = {}
        self.cycle_seconds = 0.0
        half_life = config.fairness_half_life_s
        self.usage = UsageHistory(half_life) if half_life else None

    def snapshot(self, sim: Simulation, now: float) -> Snapshot:
        """The replay's state now, reusing unchanged nodes and workloads."""
        nodes = []
        for node in sim.cluster.nodes:
            cached = self._nodes.get(node.spec.name)
            if cached is None or cached[0] != node.version:
                cached = (node.version, node_snapshot(node, sim.cluster.static_mig))
                self._nodes[node.spec.name] = cached
            nodes.append(cached[1])
        interval, periodic = sim.config.checkpoint_interval, sim.config.period > 0
        workloads = [self._workload(run, now, interval, periodic) for run in sim.running.values()]
        workloads.extend(
            self._workload(run, now, interval, periodic) for run in sim.pending_in_order()
        )
        history: tuple[UsageRecord, ...] = ()
        if self.usage is not None:
            self.usage.advance(sim, now)
            history = self.usage.records(now)
        return Snapshot(self.pools, tuple(nodes), self.queues, tuple(workloads), history)

    def _workload(self, run: JobRun, now: float, interval: float, periodic: bool) -> Workload:
        running = run.run_start is not None
        key = (run.epoch, run.run_start, run.checkpointed(now, interval) if running else 0.0)
        cached = self._workloads.get(run.job.id)
        if cached is None or cached[0] != key:
            cached = (key, workload_snapshot(run, now, interval, periodic))
            self._workloads[run.job.id] = cached
        return cached[1]

    def decide(self, sim: Simulation, now: float) -> CycleResult:
        """One engine cycle over the replay's snapshot."""
        snapshot = self.snapshot(sim, now)
        started = time.perf_counter()
        result = self.scheduler(snapshot, self.config, now)
        self.cycle_seconds += time.perf_counter() - started
        return result
