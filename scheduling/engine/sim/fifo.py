"""The `fifo` baseline: one global queue by submission time, no quotas, no preemption.

It backfills: a job that does not fit is skipped and later, smaller jobs may start in front
of it. That is what a plain Kubernetes cluster does (the default scheduler binds whatever
fits), so it is the honest "no GPUPool" baseline. Without backfill the week's trace stalls
behind every multi-node gang. The price is that a large gang can wait while small jobs keep
taking the GPUs it needs; that starvation is part of what the comparison shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduling.engine.sim.placement import Overlay, place_job
from scheduling.engine.sim.trace import TraceJob
from scheduling.engine.types import Admission, CycleResult

if TYPE_CHECKING:
    from scheduling.engine.sim.loop import Simulation


def job_shape(job: TraceJob) -> tuple:
    """Jobs of one shape fit or fail alike once the cluster only fills up."""
    return (
        job.pods,
        job.gpus_per_pod,
        job.gpu_models,
        job.cpu,
        job.memory_gib,
        job.topology_level,
        job.topology_required,
    )


class FifoPolicy:
    """First come, first served over all teams, with backfill."""

    name = "fifo"

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def decide(self, sim: Simulation, now: float) -> CycleResult:
        """Start every pending job that fits, oldest first."""
        overlay = Overlay(sim.cluster)
        failed: set[tuple] = set()
        admissions = []
        for run in sim.pending_in_order():
            shape = job_shape(run.job)
            # Within a cycle GPUs only get taken, so a shape that failed fails again.
            if shape in failed:
                continue
            pods = place_job(overlay, run.job)
            if pods is None:
                failed.add(shape)
                continue
            admissions.append(Admission(workload_id=run.job.id, pods=pods))
        return CycleResult(admissions=tuple(admissions))
