"""The engine's public data model: what a snapshot holds and what a cycle returns.

Everything here is a frozen, slotted dataclass or a StrEnum, so a snapshot can be shared
between the engine, the Django adapter and the simulator without anyone mutating it.
Times are float seconds on one clock chosen by the caller (epoch seconds or virtual time);
`now` is always passed in, never read from the system clock.

Extend only compatibly: new fields get defaults, nothing is renamed or removed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Resource(enum.StrEnum):
    """A resource a queue has quota for. GPU counts whole devices (fractions add up)."""

    GPU = "gpu"
    CPU = "cpu"
    MEMORY = "memory"  # MiB of host memory


RESOURCES: tuple[Resource, ...] = tuple(Resource)  # iterating the enum itself is slow


class PlacementStrategy(enum.StrEnum):
    """How pods are spread over the nodes of a pool."""

    BINPACK = "binpack"  # fill partly used nodes and shared GPUs first
    SPREAD = "spread"  # prefer the emptiest node


class TopologyMode(enum.StrEnum):
    """Whether a topology level must hold the whole gang or is only preferred."""

    REQUIRED = "required"
    PREFERRED = "preferred"


class EvictionReason(enum.StrEnum):
    """Why the engine stops a running workload."""

    RECLAIM = "reclaim"  # an under-quota queue takes its deserved GPUs back
    PREEMPT = "preempt"  # a higher-priority workload of the same project needs room
    BORROWED = "borrowed"  # its project's work within the guaranteed quota takes back
    # GPUs this workload borrowed over the quota (same priority; actions/preempt.py)
    CONSOLIDATE = "consolidate"  # moved elsewhere to defragment; re-admitted in the same result
    STALE_GANG = "stale_gang"  # a running gang stayed below its minimum pods too long


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for. At most one of gpus / gpu_fraction / gpu_memory_mib is set.

    gpus: whole devices (0 for a CPU-only pod); gpu_fraction: part of one shared device,
    0 < f < 1; gpu_memory_mib: memory on one shared device (its share is memory ÷ device
    memory). cpu in cores, memory_mib in MiB of host memory.
    """

    gpus: int = 0
    gpu_fraction: float = 0.0
    gpu_memory_mib: int = 0
    cpu: float = 0.0
    memory_mib: int = 0
    mig_profile: str = ""  # a MIG instance ("3g.40gb"), or "auto": smallest holding gpu_memory_mib

    @property
    def is_shared(self) -> bool:
        """True when the pod takes part of one GPU rather than whole devices."""
        return not self.mig_profile and (self.gpu_fraction > 0 or self.gpu_memory_mib > 0)


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """Keep a gang's pods inside one domain of `level` (a key of Node.topology)."""

    level: str
    mode: TopologyMode = TopologyMode.REQUIRED


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod runs: whole GPU indices, or one shared GPU and the share it holds."""

    pod: int  # index into Workload.pods
    node_id: str
    gpus: tuple[int, ...] = ()  # whole devices
    shared_gpu: int | None = None  # index of the shared device, for fractional pods
    share: float = 0.0  # fraction of the shared device (memory requests converted)
    gpu_memory_mib: int = 0  # memory reserved on the shared device
    mig_gpu: int | None = None  # index of the MIG-enabled device, for MIG pods
    mig_profile: str = ""  # the instance's profile and first memory slice on that device
    mig_start: int = -1


@dataclass(frozen=True, slots=True)
class Workload:
    """A job, workspace or inference service: running when `placement` is set.

    queue_id is the project's queue. min_pods makes it a gang (None = all pods). pools
    lists the allowed node pools in preference order (empty = any pool, by name).
    gpu_models restricts the device model (empty = any).

    elastic: it starts with min_pods pods (a gang) and grows toward len(pods) with idle
    GPUs; reclaim takes its extra pods (beyond min_pods, newest first) before evicting
    any whole workload (actions/elastic.py). resized_at: when its size last changed.
    """

    id: str
    queue_id: str
    pods: tuple[PodRequest, ...]
    priority: int = 0
    priority_class: str = ""
    preemptible: bool = True
    submit_time: float = 0.0
    min_pods: int | None = None
    pools: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    topology: TopologyConstraint | None = None
    last_checkpoint_time: float | None = None
    started_at: float | None = None
    placement: tuple[PodPlacement, ...] | None = None
    name: str = ""  # readable name for reasons; falls back to id
    degraded_since: float | None = None  # when a running gang fell below min_pods
    restarts: int = 0  # times it was evicted and went back to pending (victim cost)
    elastic: bool = False
    resized_at: float | None = None
    # How often it saves a checkpoint, in seconds of running (None = unknown): an
    # eviction waits for a checkpoint that is due soon (actions/victims.py).
    checkpoint_interval_s: float | None = None
    # A pending elastic workload cut to its minimum (actions/elastic.py elastic_view):
    # the pods it may grow to, so that a required topology domain with room for them
    # all is chosen before a fuller one (where it could never grow).
    grows_to: int = 0

    @property
    def running(self) -> bool:
        """True when the workload holds a placement."""
        return self.placement is not None

    @property
    def gang_min(self) -> int:
        """The number of pods that must run together."""
        return len(self.pods) if self.min_pods is None else self.min_pods


@dataclass(frozen=True, slots=True)
class GpuShare:
    """Part of a shared GPU held by one workload's pod."""

    workload_id: str
    share: float
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance on a device: its profile, first memory slice, and holder (None:
    idle, kept for the next workload of the same shape)."""

    profile: str
    start: int
    workload_id: str | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    """One device and what holds it now: a whole-device owner, or shares, or nothing.

    Allocations by workloads absent from the snapshot still count as taken capacity.
    A device with `mig` set is only ever split into MIG instances (scheduling/engine/mig.py).
    """

    index: int
    model: str
    memory_mib: int
    whole_by: str | None = None
    shares: tuple[GpuShare, ...] = ()
    mig: bool = False
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    """A node of a pool. topology maps a level (zone, rack, nvlink) to this node's domain.

    cpu and memory_mib are allocatable totals; None means not limited by the engine.
    Host CPU and memory in use come from the running workloads' placements.
    """

    id: str
    pool: str
    gpus: tuple[Gpu, ...] = ()
    cluster: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    topology: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True
    cpu: float | None = None
    memory_mib: int | None = None
    mig_repartition: bool = True  # its pool lets the engine destroy idle MIG instances


@dataclass(frozen=True, slots=True)
class Quota:
    """A queue's quota for one resource in one pool.

    deserved is guaranteed when asked for; limit caps the total (None = no cap);
    over_quota_weight divides what is left; over_quota_allowed=False forbids borrowing.
    """

    deserved: float = 0.0
    limit: float | None = None
    over_quota_weight: float = 1.0
    over_quota_allowed: bool = True


@dataclass(frozen=True, slots=True)
class Queue:
    """A department (parent_id None) or a project (parent_id = its department).

    quotas maps (pool, resource) to a Quota; a missing entry means deserved 0, no
    limit, weight 1. Workloads belong to leaf queues (projects).

    Non-preemptible workloads of a queue run only within its deserved quota, per pool
    and resource (nothing may evict them to give borrowed GPUs back);
    nonpreemptible_over_quota=True lets them borrow like preemptible work.
    """

    id: str
    parent_id: str | None = None
    quotas: Mapping[tuple[str, Resource], Quota] = field(default_factory=dict)
    name: str = ""  # readable name for reasons; falls back to id
    nonpreemptible_over_quota: bool = False


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Past allocation of a queue in a pool, for time-based fairness.

    gpu_seconds were used over [start, end); the engine decays them by the configured
    half-life measured from `now` to the middle of the interval.
    """

    queue_id: str
    pool: str
    start: float
    end: float
    gpu_seconds: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle needs. pools lists node pool names (order is irrelevant)."""

    pools: tuple[str, ...]
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    workloads: tuple[Workload, ...]
    usage_history: tuple[UsageRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Policy knobs. Defaults give bin packing and all actions on.

    min_runtime_s maps a priority class to seconds a started workload runs before it may
    be preempted or reclaimed; stale_gang_grace_s is how long a running gang may stay
    below its minimum; fairness_half_life_s turns on time-based fairness (None = off),
    fairness_usage_weight scales how much decayed past usage shrinks an over-quota share.
    max_victim_searches bounds the searches for eviction plans in one cycle, so a burst
    of starved work is served over a few cycles instead of one long one. restart_cost_s
    is what each earlier restart adds to a victim's cost, in seconds of its GPUs' work.
    """

    placement: Mapping[str, PlacementStrategy] = field(default_factory=dict)
    default_placement: PlacementStrategy = PlacementStrategy.BINPACK
    min_runtime_s: Mapping[str, float] = field(default_factory=dict)
    stale_gang_grace_s: float = 300.0
    fairness_half_life_s: float | None = None
    fairness_usage_weight: float = 1.0
    reclaim: bool = True
    preempt: bool = True
    consolidate: bool = True
    max_consolidation_moves: int = 4
    max_victim_searches: int = 256  # per cycle, shared by consolidate, reclaim, preempt
    restart_cost_s: float = 600.0  # victim cost of each earlier restart (actions/victims.py)
    # Bin packing by fragmentation gradient descent against the snapshot's pod shapes,
    # each weighted by 2^(-age / half-life) (engine/fragmentation.py); None = plain best fit.
    fragmentation_half_life_s: float | None = 86400.0
    # The fragmentation score is computed, per pod, for this many nodes where it fits from
    # each bucket of the free-capacity indexes, in node order (engine/placement.py).
    fragmentation_candidates: int = 2

    def strategy_for(self, pool: str) -> PlacementStrategy:
        """The placement strategy configured for a pool."""
        return self.placement.get(pool, self.default_placement)


@dataclass(frozen=True, slots=True)
class Admission:
    """A pending workload (or one moved by consolidation) placed pod by pod."""

    workload_id: str
    pods: tuple[PodPlacement, ...]


@dataclass(frozen=True, slots=True)
class Eviction:
    """A running workload to stop; beneficiary is the workload that needed the room."""

    workload_id: str
    reason: EvictionReason
    beneficiary: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Resize:
    """A running elastic workload changes size: pods added (placed) and pods taken back.

    beneficiary is the workload a shrink made room for (None for growth)."""

    workload_id: str
    added: tuple[PodPlacement, ...] = ()
    removed: tuple[int, ...] = ()  # pod indices
    beneficiary: str | None = None

    @property
    def delta(self) -> int:
        return len(self.added) - len(self.removed)


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What a cycle decided. Apply evictions before admissions.

    fair_shares and allocations map (queue id, pool, resource) to an amount; allocations
    are after this cycle's decisions. pending_reasons holds a readable reason for every
    workload still pending after the cycle. resizes: running elastic workloads that grew or
    shrank (one admitted this cycle has its grown pods in its admission).
    """

    admissions: tuple[Admission, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pending_reasons: Mapping[str, str] = field(default_factory=dict)
    fair_shares: Mapping[tuple[str, str, Resource], float] = field(default_factory=dict)
    allocations: Mapping[tuple[str, str, Resource], float] = field(default_factory=dict)
    pending_order: tuple[str, ...] = ()  # workloads pending at the start, as considered
    resizes: tuple[Resize, ...] = ()
