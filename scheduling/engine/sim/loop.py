"""The discrete-event replay: virtual time, submit and finish events, scheduling cycles.

Events that fall into the same tick are applied together and followed by one cycle (a real
scheduler also batches what happened since its last cycle); while work is pending a cycle
also runs every `period` seconds. A preempted job returns to the queue and later resumes
from its last checkpoint: the progress since then is lost.

An elastic job's work scales with its size: with k of its n pods it progresses k/n as fast
(progress is counted in seconds at full size, and so are checkpoint intervals). When it
grows or shrinks it restarts from its last checkpoint with the new size, unless it handles
resizing itself.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from scheduling.engine.sim.metrics import Recorder
from scheduling.engine.sim.specs import NodeSpec, QuotaSpec
from scheduling.engine.sim.state import ClusterState
from scheduling.engine.sim.trace import TraceJob
from scheduling.engine.types import CycleResult, Eviction, PodPlacement, Resize

MIG_LAYOUTS = ("dynamic", "static")
SUBMIT, FINISH = 1, 0  # finishes first: a job ending at t frees room for one submitted at t


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Replay knobs, all in seconds of virtual time."""

    tick: float = 60.0  # events are batched up to the next multiple of tick, then a cycle
    period: float = 600.0  # a cycle at least this often while work is pending (0 = never)
    checkpoint_interval: float = 1800.0  # a job saves its progress this often (0 = always)
    idle_cycles_to_stop: int = 6  # cycles without decisions, no events left: give up
    mig_layout: str = "dynamic"  # "static": MIG devices hold their node's mig_layout, always


@dataclass(slots=True)
class JobRun:
    """A trace job's life in the replay."""

    job: TraceJob
    saved: float = 0.0  # seconds of work checkpointed
    run_start: float | None = None  # start of the current run
    first_start: float | None = None
    end: float | None = None
    pending_since: float | None = None
    queued: float = 0.0  # total seconds spent pending, re-queueing included
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    epoch: int = 0  # bumped on eviction so the old finish event is ignored
    placement: tuple[PodPlacement, ...] | None = None
    nodes: tuple[str, ...] = ()
    evictions: list[str] = field(default_factory=list)
    resizes: int = 0
    resized_at: float | None = None

    @property
    def rate(self) -> float:
        """Progress per second: the share of its pods the job runs with."""
        held = len(self.placement) if self.placement else self.job.pods
        return held / self.job.pods

    @property
    def gpus_held(self) -> float:
        return len(self.placement or ()) * self.job.gpus_per_pod

    def waited(self, now: float) -> float:
        """Seconds spent pending up to `now`; a job still waiting counts until `now`."""
        waiting = now - self.pending_since if self.pending_since is not None else 0.0
        return self.queued + waiting

    def progress(self, now: float) -> float:
        """Seconds of work done, counting the current run."""
        running = now - self.run_start if self.run_start is not None else 0.0
        return self.saved + running * self.rate

    def checkpointed(self, now: float, interval: float) -> float:
        """Progress saved by the last checkpoint at `now` (a start counts as one)."""
        progress = self.progress(now)
        if interval <= 0:
            return progress
        return max(self.saved, math.floor(progress / interval) * interval)


class Policy(Protocol):
    """Decides a cycle from the replay's state; the replay applies the result."""

    name: str

    def decide(self, sim: Simulation, now: float) -> CycleResult:
        """Admissions and evictions for this cycle."""
        ...


class Simulation:
    """One replay of a trace on a cluster under a policy."""

    def __init__(
        self,
        nodes: list[NodeSpec],
        jobs: list[TraceJob],
        quotas: QuotaSpec,
        policy_factory: Callable[[Simulation], Policy],
        config: SimConfig | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.node_specs = nodes
        if self.config.mig_layout not in MIG_LAYOUTS:
            raise ValueError(f"mig_layout must be one of {', '.join(MIG_LAYOUTS)}")
        self.cluster = ClusterState(nodes, static_mig=self.config.mig_layout == "static")
        self.quotas = quotas
        self.runs = {job.id: JobRun(job) for job in jobs}
        self.pending: dict[str, JobRun] = {}
        self.running: dict[str, JobRun] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.now = 0.0
        self.cycles = 0
        self.eviction_counts: dict[str, int] = {}
        self.lost_gpu_s_by_reason: dict[str, float] = {}
        self._sorted_pending: list[JobRun] | None = None
        self._seq = 0
        self._follow_up = False
        window_end = max((job.submit for job in jobs), default=0.0)
        self.recorder = Recorder(self.cluster.capacity, quotas, window_end)
        for job in jobs:
            self._push(job.submit, SUBMIT, job.id, 0)
        self.policy = policy_factory(self)

    def _push(self, time: float, kind: int, job_id: str, epoch: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time, kind, self._seq, job_id, epoch))

    def pending_in_order(self) -> list[JobRun]:
        """Pending jobs by submission time then id (cached until the queue changes)."""
        if self._sorted_pending is None:
            self._sorted_pending = sorted(
                self.pending.values(), key=lambda run: (run.job.submit, run.job.id)
            )
        return self._sorted_pending

    def run(self) -> Simulation:
        """Replay until every job has ended or nothing more can happen.

        1. pick the next cycle time: the tick after the next event, or the periodic cycle;
        2. apply every event up to then (finishes before submits at equal times);
        3. run the policy's cycle and apply its evictions, then its admissions;
        4. after a cycle that decided something, run another a tick later;
        5. stop when no event is left and cycles stop deciding anything.
        """
        idle = 0
        while True:
            cycle_time = self._next_cycle_time()
            if cycle_time is None:
                break
            self._apply_events_until(cycle_time)
            self._advance(cycle_time)
            self.now = cycle_time
            changed = self._cycle()
            self._follow_up = changed
            idle = 0 if changed or self.events else idle + 1
            if idle >= self.config.idle_cycles_to_stop:
                break
        self.recorder.finish(self.now)
        return self

    def _advance(self, time: float) -> None:
        self.recorder.advance(time)
        self.cluster.mig.advance(time, self.recorder.window_end)

    def _next_cycle_time(self) -> float | None:
        periodic = self.now + self.config.period if self.pending and self.config.period else None
        if self.pending and self._follow_up:
            # Evicted jobs and the jobs they made room for are placed by the next cycle, a
            # tick later, as a real scheduler would after the evicted pods have gone.
            soon = self.now + (self.config.tick or 1.0)
            periodic = soon if periodic is None else min(periodic, soon)
        if not self.events:
            return periodic
        time = self.events[0][0]
        tick = self.config.tick
        batched = math.ceil(time / tick) * tick if tick > 0 else time
        batched = max(batched, self.now)
        return batched if periodic is None else min(batched, max(periodic, self.now))

    def _apply_events_until(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            time, kind, _, job_id, epoch = heapq.heappop(self.events)
            run = self.runs[job_id]
            self._advance(time)
            if kind == SUBMIT:
                self._submit(run, time)
            elif epoch == run.epoch and run.placement is not None:
                self._finish(run, time)

    def _submit(self, run: JobRun, time: float) -> None:
        run.pending_since = time
        self.pending[run.job.id] = run
        self._sorted_pending = None
        self.recorder.demand_changed(run.job.team, run.job.gpus)

    def _finish(self, run: JobRun, time: float) -> None:
        self._release(run)
        run.end = time
        run.run_start = None
        del self.running[run.job.id]
        self.recorder.demand_changed(run.job.team, -run.job.gpus)

    def _cycle(self) -> bool:
        self.cycles += 1
        result = self.policy.decide(self, self.now)
        for eviction in result.evictions:
            self._evict(eviction)
        # Pods taken back first (they made room for this cycle's admissions), pods added
        # last (they took what was idle after them).
        for resize in result.resizes:
            self._resize(self.running[resize.workload_id], resize, shrink=True)
        for admission in result.admissions:
            self._admit(self.pending[admission.workload_id], admission.pods)
        for resize in result.resizes:
            self._resize(self.running[resize.workload_id], resize, shrink=False)
        return bool(result.evictions or result.admissions or result.resizes)

    def _release(self, run: JobRun) -> None:
        assert run.placement is not None
        job = run.job
        self.cluster.release(job.id, run.placement, job.cpu, job.memory_gib)
        self.recorder.allocation_changed(job.team, -run.gpus_held)
        run.placement = None

    def _admit(self, run: JobRun, pods: tuple[PodPlacement, ...]) -> None:
        job = run.job
        least = job.min_pods if job.elastic and job.min_pods is not None else job.pods
        if not least <= len(pods) <= job.pods:
            raise RuntimeError(f"{job.id}: admitted {len(pods)} of {job.pods} pods")
        self.cluster.allocate(job.id, pods, job.cpu, job.memory_gib)
        assert run.pending_since is not None
        run.queued += self.now - run.pending_since
        run.pending_since = None
        run.placement = pods
        self.recorder.allocation_changed(job.team, run.gpus_held)
        run.nodes = tuple(dict.fromkeys(pod.node_id for pod in pods))
        run.run_start = self.now
        if run.first_start is None:
            run.first_start = self.now
        del self.pending[job.id]
        self._sorted_pending = None
        self.running[job.id] = run
        self._push_finish(run)

    def _push_finish(self, run: JobRun) -> None:
        """The finish event of a run that (re)started now at its current size."""
        if run.job.duration is not None:
            left = (run.job.duration - run.saved) / run.rate
            self._push(self.now + left, FINISH, run.job.id, run.epoch)

    def _resize(self, run: JobRun, resize: Resize, shrink: bool) -> None:
        """An elastic job gives pods back (`shrink`) or takes new ones: it restarts from
        its checkpoint at the new size (or goes on from where it is, when it handles
        resizing itself). A resize that both removes and adds pods restarts once."""
        job = run.job
        assert run.placement is not None
        pods = resize.removed if shrink else tuple(p.pod for p in resize.added)
        if not pods:
            return
        progress = run.progress(self.now)
        interval = self.config.checkpoint_interval
        saved = progress if job.handles_resize else run.checkpointed(self.now, interval)
        lost = (progress - saved) / run.rate * run.gpus_held
        run.lost_gpu_s += lost
        if lost:
            lost_by = self.lost_gpu_s_by_reason
            lost_by["resize"] = lost_by.get("resize", 0.0) + lost
        before = run.gpus_held
        if shrink:
            gone = set(pods)
            removed = tuple(p for p in run.placement if p.pod in gone)
            self.cluster.release(job.id, removed, job.cpu, job.memory_gib)
            run.placement = tuple(p for p in run.placement if p.pod not in gone)
        else:
            self.cluster.allocate(job.id, resize.added, job.cpu, job.memory_gib)
            run.placement = tuple(sorted(run.placement + resize.added, key=lambda p: p.pod))
        self.recorder.allocation_changed(job.team, run.gpus_held - before)
        run.nodes = tuple(dict.fromkeys(pod.node_id for pod in run.placement))
        run.saved, run.run_start, run.resized_at = saved, self.now, self.now
        if shrink or not resize.removed:
            run.resizes += 1
        run.epoch += 1
        self._push_finish(run)

    def _evict(self, eviction: Eviction) -> None:
        run = self.running.pop(eviction.workload_id)
        saved = run.checkpointed(self.now, self.config.checkpoint_interval)
        lost = (run.progress(self.now) - saved) / run.rate * run.gpus_held  # GPU-seconds
        run.lost_gpu_s += lost
        run.saved = saved
        run.run_start = None
        run.preemptions += 1
        run.epoch += 1
        run.evictions.append(str(eviction.reason))
        reason = str(eviction.reason)
        self.eviction_counts[reason] = self.eviction_counts.get(reason, 0) + 1
        lost_by = self.lost_gpu_s_by_reason
        lost_by[reason] = lost_by.get(reason, 0.0) + lost
        self._release(run)
        run.pending_since = self.now
        self.pending[run.job.id] = run
        self._sorted_pending = None
