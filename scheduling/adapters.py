"""Database rows -> engine snapshot. The engine never sees a model; this is the border.

Ids in the snapshot are strings: a workload's and a node's primary key, a project's
queue "p<id>" and a department's "d<id>". Pools are named. Times are epoch seconds.

What goes in:
- nodes of enabled clusters that belong to a pool, their GPUs, and who holds each GPU
  (from PodAllocation rows, the only truth about occupancy);
- queues: every department and project with their quotas per pool;
- workloads: pending ones (except sweep parents, and trials over their sweep's
  parallelism) and admitted/running ones with their placement.
Allocations of workloads in any other state (preempted or stopped, pods still going
away) still hold their GPUs, but the engine does not manage them: it sees them only as
taken capacity.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Container
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

from django.db.models import Q

from clusters.models import Node
from portal.models import Department, DepartmentQuota, Project, ProjectQuota
from portal.tolerant import unreadable_columns
from scheduling import bounds, gpu_range, kept_rows
from scheduling.autoscale import wanted_replicas
from scheduling.engine import types as t
from scheduling.engine.mig import AUTO, known_profile
from scheduling.models import (
    ACTIVE_STATES,
    GpuRequestKind,
    PodAllocation,
    Workload,
    WorkloadState,
)
from scheduling.stored import allocation_problem, stored_spec_problem

logger = logging.getLogger(__name__)
Amount = TypeVar("Amount", int, float)
# The holder of GPUs pods GPUPool did not bind hold (no workload id looks like it).
FOREIGN_HOLDER = "not-gpupool"
RESOURCE_FIELDS = (
    (t.Resource.GPU, "gpus", 1.0),
    (t.Resource.CPU, "cpu", 1.0),
    (t.Resource.MEMORY, "memory_gib", 1024.0),  # the engine counts memory in MiB
)


def engine_node_id(pk: int) -> str:
    """A node's id in the engine: zero-padded, so that the engine's string tie-breaks
    follow the database order (node 9 before node 10), whatever the ids' lengths."""
    return f"{pk:012d}"


def epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None


def pending_order_of(result: t.CycleResult) -> list[int]:
    """Workload primary keys in the order the engine considered them, for
    CycleRun.pending_order: the queue page shows this order rather than re-deriving it."""
    return [int(wid) for wid in result.pending_order]


def project_queue(project_id: int) -> str:
    return f"p{project_id}"


def department_queue(department_id: int) -> str:
    return f"d{department_id}"


@dataclass
class SnapshotRead:
    """The snapshot plus what applying its result needs, so nothing is read twice."""

    snapshot: t.Snapshot
    workloads: dict[str, Workload]
    nodes: dict[str, Node]
    held_elsewhere: set[str] = field(default_factory=set)  # ids releasing GPUs (reachable)
    held_devices: set[tuple[str, int]] = field(default_factory=set)  # (node id, gpu index)
    throttled: dict[str, str] = field(default_factory=dict)  # trial id -> reason
    # The allocations of each workload the engine manages, as read (by pod index).
    placed: dict[str, list[PodAllocation]] = field(default_factory=dict)
    # Rows that cannot be turned into an engine request, with why: the cycle fails them
    # (quarantine) instead of letting one of them stop scheduling for everyone.
    unrunnable: dict[str, tuple[Workload, str]] = field(default_factory=dict)


def finite(value: object) -> bool:
    return isinstance(value, int | float | Decimal) and math.isfinite(float(value))


def _unreadable_problems(unread: list[str]) -> list[str]:
    """The columns that held what their type cannot (SQLite keeps a text): their fields
    loaded a stand-in (portal.tolerant)."""
    return [
        f"{name} is not {'a date' if name.endswith('_at') else 'a number'} in the database"
        for name in unread
    ]


# Choice columns the engine request is made of: a value none of them names (another
# writer's) would be taken for the default (whole GPUs, a training job).
CHOICES = ("kind", "gpu_request", "priority_class")


def _shape_problems(wl: Workload) -> list[str]:
    problems = [
        f"{name}={str(value)[:32]} is not one of its choices"  # any length on SQLite
        for name in CHOICES
        if (value := getattr(wl, name)) not in dict(Workload._meta.get_field(name).choices)
    ]
    pools = wl.node_pools
    if pools and not (isinstance(pools, list) and all(isinstance(p, str) for p in pools)):
        problems.append("node_pools is not a list of pool names")
    return problems


def node_problem(node: Node, allocations: list[PodAllocation]) -> str:
    """Why nothing may be placed on this node now (naming the rows and columns), or ''.
    Its free capacity is unknown while the node, a GPU of it or an allocation on it holds
    what its column cannot: the inventory sync writes the node's columns again, and the
    workload of a bad allocation is quarantined (its pod then goes)."""
    problems = [f"{name} is not a number in the database" for name in unreadable_columns(node)]
    problems += [
        f"gpu {gpu.pk}: {name} is not a number in the database"
        for gpu in node.gpu_list
        for name in unreadable_columns(gpu)
    ]
    problems += [
        f"{name} is not an object"
        for name in ("labels", "topology")
        if not isinstance(getattr(node, name) or {}, dict)
    ]
    problems += [problem for alloc in allocations if (problem := allocation_problem(alloc))]
    return "; ".join(problems)


# What a row may hold to be scheduled: the input bounds (scheduling.bounds), so a value
# planted in the database or left by an older version is judged as a submit would be.
REQUEST_BOUNDS = {
    "cpu": bounds.CPU,
    "gpus": bounds.GPUS,
    "memory_mib": bounds.MEMORY_MIB,
    "gpu_memory_mib": bounds.GPU_MEMORY_MIB,
    "pods": bounds.PODS,
    "min_pods": bounds.PODS,
}


def request_problem(wl: Workload) -> str:
    """Why this row cannot be turned into an engine request, or '' when it can."""
    unread = unreadable_columns(wl)
    problems = _unreadable_problems(unread) + _shape_problems(wl)
    for name, bound in REQUEST_BOUNDS.items():
        value = getattr(wl, name)
        if name not in unread and bound.check(value)[1]:
            problems.append(
                f"{name}={value} is outside {bounds.fmt(bound.low)}..{bounds.fmt(bound.high)}"
            )
    if not problems:
        if wl.min_pods > wl.pods:
            problems.append(f"min_pods={wl.min_pods} is more than pods={wl.pods}")
        if wl.min_gpus is not None and not (1 <= wl.min_gpus <= wl.gpus and wl.pods == 1):
            problems.append(f"a GPU range of {wl.min_gpus}..{wl.gpus} on {wl.pods} pods")
        if wl.gpu_request == GpuRequestKind.FRACTION and not 0 < wl.gpus <= 1:
            problems.append(f"a GPU fraction of {wl.gpus} is not in (0, 1]")
        if wl.gpu_request == GpuRequestKind.WHOLE and wl.gpus != int(wl.gpus):
            problems.append(f"{wl.gpus} whole GPUs is not a whole number")
        if wl.gpu_request == GpuRequestKind.MIG and not known_profile(
            wl.mig_profile or AUTO, wl.gpu_memory_mib
        ):
            problems.append(f"MIG profile {wl.mig_profile!r} is not one of any GPU model")
    problems.append(stored_spec_problem(wl))  # what reconcile could not make pods of
    return "; ".join(p for p in problems if p)


def _convert(
    rows: list[tuple[Workload, list[PodAllocation]]], unrunnable: dict[str, tuple[Workload, str]]
) -> list[t.Workload]:
    """Engine workloads for the rows that convert; the others go to `unrunnable`."""
    converted = []
    for wl, allocations in rows:
        why = "; ".join(
            p for p in (request_problem(wl), *map(allocation_problem, allocations)) if p
        )
        if not why:
            try:
                converted.append(_workload(wl, allocations))
                continue
            except (ArithmeticError, TypeError, ValueError, OverflowError, MemoryError) as exc:
                why = f"{type(exc).__name__}: {exc}"
        unrunnable[str(wl.pk)] = (wl, why)
    return converted


def _convert_kept(
    rows: list[kept_rows.Row], unrunnable: dict[str, tuple[Workload, str]]
) -> list[t.Workload]:
    """_convert, made once per kept row (a row read again is converted again)."""
    converted = []
    for row in rows:
        if not row.done:
            problems: dict[str, tuple[Workload, str]] = {}
            made = _convert([(row.wl, row.allocations)], problems)
            row.converted = made[0] if made else None
            row.problem = problems[str(row.wl.pk)][1] if problems else ""
            row.done = True
        if row.converted is None:
            unrunnable[str(row.wl.pk)] = (row.wl, row.problem)
        else:
            converted.append(row.converted)
    return converted


def read_snapshot() -> SnapshotRead:
    """One consistent read of everything the engine needs, in a handful of queries; the
    workload and allocation rows that did not change since the last cycle of this
    process are taken as it kept them (kept_rows)."""
    queues = _queues()
    names = {int(q.id[1:]): q.name for q in queues if q.parent_id is not None}
    holding, waiting_rows = kept_rows.holders_and_pending(
        kept_rows.KEPT_ROWS.refresh(names).values()
    )
    allocations = [alloc for row in holding for alloc in row.allocations]
    kept_nodes = kept_rows.KEPT_NODES
    node_rows = kept_nodes.refresh()
    nodes = [row.node for row in node_rows]
    node_by_id = {node.pk: node for node in nodes}
    managed_rows = [row for row in holding if row.wl.state in ACTIVE_STATES]
    managed = {row.wl.pk: row.wl for row in managed_rows}
    pending, throttled, waiting = _pending_workloads([row.wl for row in waiting_rows])
    admit = {wl.pk for wl in pending}
    unrunnable: dict[str, tuple[Workload, str]] = {}
    workloads = _convert_kept(managed_rows, unrunnable)
    workloads += _convert_kept([row for row in waiting_rows if row.wl.pk in admit], unrunnable)
    # A running row that cannot be read keeps its GPUs (as taken capacity) until its pods go.
    managed = {wid: wl for wid, wl in managed.items() if str(wid) not in unrunnable}
    on_node = by_node(allocations)
    snapshot = t.Snapshot(
        pools=tuple(sorted(pool.name for pool in kept_nodes.pools.values())),
        nodes=tuple(_node_kept(row, on_node.get(row.node.pk, []), managed) for row in node_rows),
        queues=queues,
        workloads=tuple(sorted(workloads, key=lambda wl: int(wl.id))),
    )
    # Pods of stopped or preempted workloads, and pods elastic ones gave back.
    releasing = [a for a in allocations if a.workload_id not in managed or a.releasing]
    # Pods with a GPU range that gave GPUs back (few): only those are checked, not every
    # allocation of the cluster each cycle (most of a steady cycle's adapter time).
    given_back = [a for a in allocations if a.releasing_gpu_indices]
    # Pods on an unreachable (or disabled) cluster may never confirm they are gone; they
    # keep their GPUs, but must not hold back evictions everywhere else. A pod giving back
    # part of its GPU range settles too: until it has, the work it shrank for is nominated
    # on GPUs still held, and a reclaim for that work again would shrink a second pod.
    settling = {
        str(a.workload_id)
        for a in (*releasing, *given_back)
        if (node := node_by_id.get(a.node_id)) is not None and node.cluster.reachable
    }
    return SnapshotRead(
        snapshot=snapshot,
        workloads={
            str(wl.pk): wl for wl in [*managed.values(), *waiting] if str(wl.pk) not in unrunnable
        },
        nodes={engine_node_id(node.pk): node for node in nodes},
        held_elsewhere=settling,
        held_devices=_devices(readable(releasing)) | _given_back_gpus(readable(given_back)),
        throttled=throttled,
        unrunnable=unrunnable,
        placed={str(row.wl.pk): row.allocations for row in managed_rows},
    )


def readable(allocations: list[PodAllocation]) -> list[PodAllocation]:
    """The allocations whose GPUs are known (those on a node with a bad one: node_problem)."""
    return [alloc for alloc in allocations if not allocation_problem(alloc)]


def by_node(allocations: list[PodAllocation]) -> dict[int, list[PodAllocation]]:
    grouped: dict[int, list[PodAllocation]] = {}
    for alloc in allocations:
        grouped.setdefault(alloc.node_id, []).append(alloc)
    return grouped


def _devices(allocations: list[PodAllocation]) -> set[tuple[str, int]]:
    devices = set()
    for alloc in allocations:
        indices = alloc.gpu_indices if alloc.shared_gpu_index is None else [alloc.shared_gpu_index]
        devices.update((engine_node_id(alloc.node_id), int(i)) for i in indices)
    return devices


def _given_back_gpus(allocations: list[PodAllocation]) -> set[tuple[str, int]]:
    """GPUs a pod with a GPU range gave back, held until it restarts (gpu_range.py)."""
    return {
        (engine_node_id(a.node_id), int(i)) for a in allocations for i in a.releasing_gpu_indices
    }


def _node_kept(
    row: kept_rows.NodeRow, allocations: list[PodAllocation], managed: Container[int]
) -> t.Node:
    """_node, made again only when the node's rows, its cluster's or pool's fields it
    reads, or the allocations on it changed (the same object otherwise). Also when one
    of those allocations' workloads joined or left the engine's workloads: the engine
    re-derives the holdings of workloads outside the snapshot only on nodes whose
    object changed (engine/incremental.py), so such a node is made again, equal."""
    node = row.node
    made_from = (
        tuple((a.pk, a.version, a.workload_id in managed) for a in allocations),
        node.cluster.name,
        node.cluster.reachable,
        node.pool.name,
        node.pool.mig_repartition,
    )
    if row.made is None or row.made_from != made_from:
        row.made, row.made_from = _node(node, allocations), made_from
    return row.made


def _node(node: Node, allocations: list[PodAllocation]) -> t.Node:
    problem = node_problem(node, allocations)
    if problem:
        logger.warning("node %s takes no pods: %s", node.pk, problem)
        allocations = readable(allocations)
    whole: dict[int, str] = {}
    shares: dict[int, list[t.GpuShare]] = {}
    mig_holders: dict[tuple[int, int], str] = {}
    for alloc in allocations:
        wid = str(alloc.workload_id)
        if alloc.mig_gpu_index is not None and alloc.mig_start is not None:
            mig_holders[(alloc.mig_gpu_index, alloc.mig_start)] = wid
        if alloc.shared_gpu_index is not None:
            share = t.GpuShare(wid, float(alloc.gpu_share or 0), alloc.gpu_memory_mib)
            shares.setdefault(alloc.shared_gpu_index, []).append(share)
        for index in alloc.gpu_indices:
            whole[int(index)] = wid
        for index in alloc.releasing_gpu_indices:  # held by no engine workload: taken
            whole[int(index)] = f"{wid}/given-back"
    taken = {*whole, *shares, *(index for index, _ in mig_holders)}
    for index in foreign_gpus(node, taken):
        whole[index] = FOREIGN_HOLDER
    gpus = tuple(
        t.Gpu(
            index=gpu.index,
            model=gpu.model,
            memory_mib=gpu.memory_mib,
            whole_by=whole.get(gpu.index),
            shares=tuple(shares.get(gpu.index, ())),
            mig=gpu.mig_enabled,
            mig_instances=tuple(
                t.MigInstance(i.profile, i.start, mig_holders.get((gpu.index, i.start)))
                for i in gpu.mig_list
            ),
        )
        for gpu in node.gpu_list
    )
    return t.Node(
        id=engine_node_id(node.pk),
        pool=node.pool.name,
        gpus=gpus,
        cluster=node.cluster.name,
        labels=node.labels if isinstance(node.labels, dict) else {},
        topology={
            **(node.topology if isinstance(node.topology, dict) else {}),
            gpu_range.NODE_LEVEL: engine_node_id(node.pk),
        },
        schedulable=node.schedulable and node.cluster.reachable and not problem,
        cpu=_less(float(node.cpu_cores), float(node.foreign_cpu)),
        memory_mib=_less(int(node.memory_mib), int(node.foreign_memory_mib)),
        mig_repartition=node.pool.mig_repartition,
    )


def foreign_gpus(node: Node, taken: Container[int]) -> list[int]:
    """The GPUs the snapshot marks as held by pods GPUPool did not bind (Node.foreign_gpus):
    the device plugin, not GPUPool, picked theirs, so which ones is unknown; the engine
    only needs that many out of its reach. Chosen deterministically: the highest-index
    GPUs that no GPUPool allocation holds (whole, shared or MIG) and that are not in MIG
    mode (such a GPU is offered as MIG devices, never as a whole `nvidia.com/gpu`). A node
    with more foreign GPUs than such free ones is simply full."""
    free = [gpu.index for gpu in node.gpu_list if gpu.index not in taken and not gpu.mig_enabled]
    return sorted(free, reverse=True)[: node.foreign_gpus]


def _less(capacity: Amount, held: Amount) -> Amount | None:
    """A node's CPU or memory less what others hold: None (unlimited) when the node
    states none, never below nothing."""
    return max(capacity - held, 0) if capacity else None


def _quota(row: DepartmentQuota | ProjectQuota) -> dict[tuple[str, t.Resource], t.Quota]:
    """The row's quotas in its pool; none (as if unset) while one of its numbers holds a
    text (SQLite): the queue then has no guarantee there until an admin sets it again."""
    unread = unreadable_columns(row)
    if unread:
        logger.warning("quota %s left out: %s not a number", row, ", ".join(unread))
        return {}
    quotas = {}
    for resource, name, scale in RESOURCE_FIELDS:
        limit = getattr(row, f"{name}_limit")
        quotas[(row.node_pool.name, resource)] = t.Quota(
            deserved=float(getattr(row, name)) * scale,
            limit=None if limit is None else float(limit) * scale,
            over_quota_weight=float(row.over_quota_weight),
            over_quota_allowed=row.over_quota_allowed,
        )
    return quotas


def _queues() -> tuple[t.Queue, ...]:
    dept_quotas: dict[int, dict] = {}
    for row in DepartmentQuota.objects.select_related("node_pool"):
        dept_quotas.setdefault(row.department_id, {}).update(_quota(row))
    project_quotas: dict[int, dict] = {}
    for row in ProjectQuota.objects.select_related("node_pool"):
        project_quotas.setdefault(row.project_id, {}).update(_quota(row))
    queues = [
        t.Queue(id=department_queue(d.pk), quotas=dept_quotas.get(d.pk, {}), name=d.name)
        for d in Department.objects.order_by("pk")
    ]
    queues += [
        t.Queue(
            id=project_queue(p.pk),
            parent_id=department_queue(p.department_id),
            quotas=project_quotas.get(p.pk, {}),
            name=p.name,
            nonpreemptible_over_quota=p.nonpreemptible_over_quota,
        )
        for p in Project.objects.order_by("pk")
    ]
    return tuple(queues)


def _pending_workloads(
    pending: list[Workload],
) -> tuple[list[Workload], dict[str, str], list[Workload]]:
    """Of the pending workloads (by id), those the engine may admit now; trials beyond
    their sweep's parallelism wait outside the snapshot with a reason."""
    parents = {wl.parent_id for wl in pending if wl.parent_id}
    busy = dict.fromkeys(parents, 0)
    # A trial holds one of its sweep's slots while it runs and until its pods are gone
    # (a stopped trial whose pods are still terminating holds GPUs too), and while it is
    # nominated onto GPUs being freed for it: it is admitted there when they are
    # (scheduling/nominations.py), whatever the sweep's other trials did meanwhile.
    nominated = Q(state=WorkloadState.PENDING, nominated__isnull=False)
    for parent_id in (
        Workload.objects.filter(parent_id__in=parents)
        .filter(Q(state__in=ACTIVE_STATES) | Q(allocations__isnull=False) | nominated)
        .distinct()
        .values_list("parent_id", flat=True)
    ):
        busy[parent_id] += 1
    # The sweeps' names and specs as they are now (a kept trial's parent may be older).
    sweeps = (
        {
            pk: (name, spec)
            for pk, name, spec in (
                Workload.objects.filter(pk__in=parents).values_list("pk", "name", "spec")
            )
        }
        if parents
        else {}
    )
    admit, throttled = [], {}
    for wl in pending:
        if wl.parent_id is None:
            admit.append(wl)
            continue
        name, spec = sweeps.get(wl.parent_id, (wl.parent.name, wl.parent.spec))
        limit = int((spec or {}).get("search", {}).get("parallelism", 1))
        if wl.nominated is not None:  # its slot is counted above
            admit.append(wl)
        elif busy[wl.parent_id] < limit:
            busy[wl.parent_id] += 1  # this trial may take one of the sweep's slots
            admit.append(wl)
        else:
            throttled[str(wl.pk)] = f"sweep {name} runs at most {limit} trials at once"
    return admit, throttled, pending


def checkpoint_interval(wl: Workload) -> float | None:
    """The declared checkpoint interval, or None (unknown) for one outside its bound: a
    planted week-long-plus interval would let the victim hold off a reclaim that long,
    while an unknown one only means its eviction does not wait."""
    value = wl.checkpoint_interval_s
    if value is None or bounds.CHECKPOINT_INTERVAL_S.check(value)[1]:
        return None
    return float(value)


def _pod_request(wl: Workload) -> t.PodRequest:
    gpus, fraction, memory, mig = 0, 0.0, 0, ""
    if wl.gpu_request == GpuRequestKind.FRACTION:
        fraction = float(wl.gpus)
    elif wl.gpu_request == GpuRequestKind.MEMORY:
        memory = wl.gpu_memory_mib
    elif wl.gpu_request == GpuRequestKind.MIG:
        mig = wl.mig_profile or AUTO
        memory = wl.gpu_memory_mib if mig == AUTO else 0
    else:
        gpus = int(wl.gpus)
    return t.PodRequest(
        gpus=gpus,
        gpu_fraction=fraction,
        gpu_memory_mib=memory,
        cpu=float(wl.cpu),
        memory_mib=wl.memory_mib,
        mig_profile=mig,
    )


def _placement(allocations: list[PodAllocation]) -> tuple[t.PodPlacement, ...]:
    return tuple(
        t.PodPlacement(
            pod=a.pod_index,
            node_id=engine_node_id(a.node_id),
            gpus=tuple(int(i) for i in a.gpu_indices),
            shared_gpu=a.shared_gpu_index,
            share=float(a.gpu_share or 0),
            gpu_memory_mib=a.gpu_memory_mib,
            mig_gpu=a.mig_gpu_index,
            mig_profile=a.mig_profile,
            mig_start=-1 if a.mig_start is None else a.mig_start,
        )
        for a in allocations
    )


def _workload(wl: Workload, allocations: list[PodAllocation]) -> t.Workload:
    made = _rigid_or_elastic(wl, allocations)
    if wl.min_gpus is None:
        return made
    # A GPU range: one-GPU slices on one node (scheduling/gpu_range.py).
    active = made.placement is not None
    rows = [a for a in allocations if not a.releasing][:1]
    return replace(
        made,
        pods=gpu_range.engine_slices(wl, made.pods[0]),
        min_pods=wl.min_gpus if wl.min_gpus < wl.gpus else None,
        elastic=True,
        topology=gpu_range.ONE_NODE,
        placement=(
            gpu_range.engine_placement(engine_node_id(rows[0].node_id), rows[0])
            if active and rows
            else made.placement
        ),
    )


def _rigid_or_elastic(wl: Workload, allocations: list[PodAllocation]) -> t.Workload:
    topology = None
    if wl.topology_level:
        mode = t.TopologyMode.REQUIRED if wl.topology_required else t.TopologyMode.PREFERRED
        topology = t.TopologyConstraint(wl.topology_level, mode)
    active = wl.state in ACTIVE_STATES
    given_back = [a for a in allocations if a.releasing]  # their GPUs are taken capacity
    allocations = [a for a in allocations if not a.releasing]
    # A service scaled on load may grow only to what its load asks for (and never hides
    # a pod it holds beyond that).
    held = [a.pod_index + 1 for a in allocations] if active else []
    pods = max([wanted_replicas(wl), *held])
    if active and given_back:  # it grows again once the pods it gave back are gone
        pods = max(held, default=pods)
    return t.Workload(
        id=str(wl.pk),
        queue_id=project_queue(wl.project_id),
        pods=(_pod_request(wl),) * pods,
        priority=wl.priority,
        priority_class=wl.priority_class,
        preemptible=wl.preemptible,
        submit_time=epoch(wl.queued_at or wl.created_at) or 0.0,
        min_pods=wl.min_pods if wl.min_pods < wl.pods else None,
        elastic=wl.elastic,
        resized_at=epoch(wl.resized_at),
        pools=tuple(wl.node_pools),
        gpu_models=tuple(m for m in wl.gpu_model.split("|") if m),
        topology=topology,
        last_checkpoint_time=epoch(wl.last_checkpoint_at),
        checkpoint_interval_s=checkpoint_interval(wl),
        started_at=epoch(wl.admitted_at) if active else None,
        placement=_placement(allocations) if active else None,
        name=f"{wl.project.name}/{wl.name}",
        restarts=wl.restart_count,
    )
