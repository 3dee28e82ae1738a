"""Tentative admissions and evictions that are committed or discarded whole.

A Statement is a mark in the cluster state's undo log: everything done after it (pods
placed, workloads released, queue allocations changed, decisions recorded) is undone in
reverse by discard(), so a gang or an eviction plan never half-happens and nothing is
copied. Statements nest: discarding an inner one leaves the outer one's work alone.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from scheduling.engine.state import UNITS, ClusterState, PodSlot, Scratch
from scheduling.engine.types import (
    RESOURCES,
    EvictionReason,
    PodPlacement,
    Queue,
    Resource,
    Workload,
)

AllocKey = tuple[str, str, Resource]  # (queue id, pool, resource)


def slot_amounts(slot: PodSlot) -> tuple[float, float, float]:
    """GPU, CPU and memory a placed pod holds, as quota counts them."""
    gpus = len(slot.gpus) + slot.units / UNITS
    return gpus, slot.cpu, slot.host_memory


def slot_placement(slot: PodSlot) -> PodPlacement:
    """The public form of a placed pod."""
    if slot.mig is not None:
        gpu, inst = slot.mig.gpu.index, slot.mig.instance
        name, start = inst.profile.name, inst.start
        return _placement(slot.pod, slot.node.id, (), None, 0.0, 0, gpu, name, start)
    if slot.shared is not None:
        return _placement(
            slot.pod, slot.node.id, (), slot.shared.index, slot.units / UNITS, slot.memory
        )
    return _placement(slot.pod, slot.node.id, tuple(g.index for g in slot.gpus))


# Placements are values, made for every admitted pod of every cycle (a frozen dataclass
# sets each field through object.__setattr__): equal ones are made once (a cycle that
# decides as the last one did makes none), at most this many kept.
@functools.lru_cache(maxsize=1 << 16)
def _placement(
    pod: int,
    node_id: str,
    gpus: tuple[int, ...],
    shared_gpu: int | None = None,
    share: float = 0.0,
    memory: int = 0,
    mig_gpu: int | None = None,
    mig_profile: str = "",
    mig_start: int = -1,
) -> PodPlacement:
    return PodPlacement(
        pod, node_id, gpus, shared_gpu, share, memory, mig_gpu, mig_profile, mig_start
    )


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    workload: Workload
    reason: EvictionReason
    beneficiary: str | None
    detail: str


class Ledger:
    """Allocation per (queue, pool, resource) for every queue and its ancestors, and
    what each workload's own queue holds with non-preemptible work (`fixed`)."""

    def __init__(
        self,
        state: ClusterState,
        queues: tuple[Queue, ...],
        chains: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.state = state
        self.alloc: dict[AllocKey, float] = {}
        self.fixed: dict[AllocKey, float] = {}
        self.version = 0  # bumped on every change, so callers can cache derived figures
        self.moved: list[AllocKey] = []  # GPU keys in the order they changed (Context.donors)
        self.chains = self.chains_of(queues) if chains is None else chains
        # Per (queue, pool): the (GPU, CPU, memory) keys of the queue and its ancestors.
        self._keys: dict[tuple[str, str], list[tuple[AllocKey, ...]]] = {}

    @staticmethod
    def chains_of(queues: tuple[Queue, ...]) -> dict[str, tuple[str, ...]]:
        """Each queue with its ancestors, leaf first (a cycle in the tree stops the walk)."""
        parents = {q.id: q.parent_id for q in queues}
        chains: dict[str, tuple[str, ...]] = {}
        for q in queues:
            chain: list[str] = []
            seen: set[str] = set()
            current: str | None = q.id
            while current is not None and current not in seen and current in parents:
                seen.add(current)
                chain.append(current)
                current = parents[current]
            chains[q.id] = tuple(chain)
        return chains

    def chain(self, queue_id: str) -> tuple[str, ...]:
        """The queue and its ancestors, leaf first."""
        return self.chains.get(queue_id, (queue_id,))

    def get(self, queue_id: str, pool: str, resource: Resource = Resource.GPU) -> float:
        return self.alloc.get((queue_id, pool, resource), 0.0)

    def add(
        self, queue_id: str, slots: list[PodSlot], sign: int, log: bool = True, fixed: bool = False
    ) -> None:
        """Count slots (sign +1) or stop counting them (-1); fixed: non-preemptible work.
        Runs once per admission and eviction: the ledger keys of a (queue, pool) are
        made once per cycle (_keys), and every sum is added to in the same order."""
        self.version += 1
        alloc, moved = self.alloc, self.moved
        for slot in slots:
            pool = slot.node.pool
            gpus, cpu, memory = slot_amounts(slot)
            gpus, cpu, memory = sign * gpus, sign * cpu, sign * memory
            chain = self._keys.get((queue_id, pool))
            if chain is None:
                chain = self._keys[(queue_id, pool)] = [
                    tuple((qid, pool, r) for r in RESOURCES) for qid in self.chain(queue_id)
                ]
            for gpu_key, cpu_key, memory_key in chain:
                moved.append(gpu_key)
                alloc[gpu_key] = alloc.get(gpu_key, 0.0) + gpus
                alloc[cpu_key] = alloc.get(cpu_key, 0.0) + cpu
                alloc[memory_key] = alloc.get(memory_key, 0.0) + memory
            if fixed:
                gpu_key, cpu_key, memory_key = chain[0]
                held = self.fixed
                held[gpu_key] = held.get(gpu_key, 0.0) + gpus
                held[cpu_key] = held.get(cpu_key, 0.0) + cpu
                held[memory_key] = held.get(memory_key, 0.0) + memory
        if log:
            self.state.log.append(Scratch(lambda: self.add(queue_id, slots, -sign, False, fixed)))


class Statement:
    """The cycle's working set: state, ledger and the decisions taken so far."""

    def __init__(self, state: ClusterState, ledger: Ledger) -> None:
        self.state = state
        self.ledger = ledger
        self.admitted: dict[str, list[PodSlot]] = {}
        self.evicted: dict[str, EvictionRecord] = {}
        self.order: list[str] = []  # admission order, for a stable result

    def mark(self) -> int:
        return self.state.mark()

    def discard(self, mark: int) -> None:
        self.state.rollback(mark)

    def record_admission(self, wl: Workload, slots: list[PodSlot]) -> None:
        """Book placed slots (already in the state) as an admission of wl."""
        fixed = not wl.preemptible
        self.ledger.add(wl.queue_id, slots, +1, log=False, fixed=fixed)
        self.admitted[wl.id] = slots
        self.order.append(wl.id)

        def undo() -> None:
            self.ledger.add(wl.queue_id, slots, -1, log=False, fixed=fixed)
            del self.admitted[wl.id]
            self.order.pop()

        self.state.log.append(Scratch(undo))

    def evict(
        self, wl: Workload, reason: EvictionReason, beneficiary: str | None, detail: str = ""
    ) -> None:
        """Release what a running workload holds and record why."""
        slots = self.state.release(wl.id)
        self.ledger.add(wl.queue_id, slots, -1, fixed=not wl.preemptible)
        self.evicted[wl.id] = EvictionRecord(wl, reason, beneficiary, detail)

        def undo() -> None:
            del self.evicted[wl.id]

        self.state.log.append(Scratch(undo))
