"""Nominations: a placement the cycle chose on GPUs still being freed, kept until they are.

The engine decides evictions and the admissions they make room for in one cycle, as if
the victims' pods were gone at once (scheduling.engine.apply.apply_result is its own
replay of that). The portal cannot admit onto those GPUs until reconciliation confirms
the pods gone, so it holds such an admission back (scheduling.cycle._blocked_by). Were
the plan then forgotten, the next cycle would decide afresh over GPUs that had become
free: other work (the victims among it) would take them, and the work they were freed
for would need new evictions, cycle after cycle, with nothing arriving. So the held-back
admission is kept on its row (Workload.nominated) and admitted first, exactly there,
once those GPUs are free: what the engine's own replay would already be running. The
reconcile that releases them admits it in the same transaction (cycle.on_gpus_freed) and
makes its pods; where a cycle holds the nodes' lock then, that cycle or the next admits it
before reading its snapshot (cycle.nominations_apply).

A nomination stands only while the workload is pending with the same request and every
node it names can still take pods; MIG pods are not nominated (their instances are made
at admission and may not be there any more). A nominated sweep trial holds one of its
sweep's slots while it waits (adapters._pending_workloads), so admitting it at the
release never runs more trials than the sweep's parallelism. (Trials were not nominated
before: in the demo a trial within its project's guarantee evicted the project's 16-GPU
borrowed job, which, earlier in the queue, took the freed GPUs back at the next cycle,
and was evicted again, every ten seconds.)
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any, NamedTuple

from clusters.models import Node
from scheduling import adapters
from scheduling.engine import types as t
from scheduling.models import PodAllocation, Workload, WorkloadState

# What the pods were chosen for: a change to any of these makes the placement stale.
REQUEST_FIELDS = (
    "gpu_request",
    "gpus",
    "min_gpus",
    "pods",
    "min_pods",
    "cpu",
    "memory_mib",
    "gpu_memory_mib",
    "mig_profile",
    "node_pools",
    "gpu_model",
    "topology_level",
    "topology_required",
    "elastic",
)


def request_key(wl: Workload) -> str:
    return repr(tuple(str(getattr(wl, name)) for name in REQUEST_FIELDS))


class Nomination(NamedTuple):
    workload: Workload
    admission: t.Admission
    at: datetime  # when the cycle that placed it ran
    cycle: int | None  # that cycle's CycleRun id (None: kept before it was recorded)


def nominations_save(
    workloads: dict[str, Workload], admissions: list[t.Admission], at: datetime, cycle: int
) -> None:
    """Keep each held-back admission on its workload's row, with the cycle's time and
    CycleRun id (the first cycle to choose it, while a later cycle chooses the same
    again)."""
    changed = []
    for admission in admissions:
        wl = workloads.get(admission.workload_id)
        if wl is None:
            continue
        if any(pod.mig_gpu is not None for pod in admission.pods):
            continue
        # As the JSON column gives it back (lists, not tuples): compared with what is kept
        # below, and the row kept between cycles (kept_rows) holds it as written.
        pods = [{**asdict(pod), "gpus": list(pod.gpus)} for pod in admission.pods]
        kept = {"request": request_key(wl), "pods": pods}
        old = wl.nominated if isinstance(wl.nominated, dict) else {}
        if {key: old.get(key) for key in kept} == kept:
            continue  # placed there again while it waits: kept as first chosen
        wl.nominated = {**kept, "at": at.isoformat(), "cycle": cycle}
        changed.append(wl)
    Workload.objects.bulk_update(changed, ["nominated"], batch_size=500)


def _waiting() -> Any:
    return Workload.objects.filter(
        state=WorkloadState.PENDING, allocations__isnull=True, nominated__isnull=False
    )


def nominations_waiting() -> bool:
    """Whether any pending workload holds a nomination (one indexed read, before a
    reconcile takes the nodes' lock for them)."""
    return _waiting().exists()


def nominations_due() -> tuple[list[Nomination], dict[str, Node]]:
    """Pending workloads with a nomination that still stands, each with its admission,
    and the nodes those name (by engine id). Nominations that no longer stand are
    dropped; those on GPUs a pod with a GPU range gave back but still holds wait.
    Whether their GPUs are otherwise free is for the caller to check (capacity_check)."""
    rows = list(_waiting().order_by("pk"))
    if not rows:
        return [], {}
    kept = {wl.pk: _nomination(wl) for wl in rows}
    node_pks = {int(pod.node_id) for n in kept.values() if n for pod in n.admission.pods}
    nodes = {
        adapters.engine_node_id(node.pk): node
        for node in Node.objects.filter(
            pk__in=node_pks,
            pool__isnull=False,
            schedulable=True,
            cluster__enabled=True,
            cluster__reachable=True,
        ).select_related("pool", "cluster")
    }
    given_back = adapters._given_back_gpus(
        list(PodAllocation.objects.filter(node_id__in=node_pks).exclude(releasing_gpu_indices=[]))
    )
    due, stale = [], []
    for wl in rows:
        nomination = kept[wl.pk]
        if nomination is None or any(p.node_id not in nodes for p in nomination.admission.pods):
            wl.nominated = None
            stale.append(wl)
        elif not given_back & _devices(nomination.admission):
            due.append(nomination)
    Workload.objects.bulk_update(stale, ["nominated"], batch_size=500)
    return due, nodes


def _nomination(wl: Workload) -> Nomination | None:
    """The nomination kept on the row, or None when its request changed since or it
    cannot be read back."""
    kept: Any = wl.nominated
    if not isinstance(kept, dict) or kept.get("request") != request_key(wl):
        return None
    try:
        pods = tuple(_placement(pod) for pod in kept["pods"])
        at = datetime.fromisoformat(kept["at"])
    except (KeyError, TypeError, ValueError):
        return None
    if not pods or len({pod.pod for pod in pods}) != len(pods) or at.tzinfo is None:
        return None
    cycle = kept.get("cycle")
    cycle = cycle if isinstance(cycle, int) and not isinstance(cycle, bool) else None
    return Nomination(wl, t.Admission(str(wl.pk), pods), at, cycle)


def _devices(admission: t.Admission) -> set[tuple[str, int]]:
    """(engine node id, GPU index) of every GPU the admission's pods take."""
    return {
        (pod.node_id, index)
        for pod in admission.pods
        for index in (pod.gpus if pod.shared_gpu is None else (pod.shared_gpu,))
    }


def _placement(fields: dict[str, Any]) -> t.PodPlacement:
    placement = t.PodPlacement(**fields)
    if placement.mig_gpu is not None:
        raise ValueError("MIG pods are not nominated")
    return t.PodPlacement(
        pod=int(placement.pod),
        node_id=adapters.engine_node_id(int(placement.node_id)),
        gpus=tuple(int(i) for i in placement.gpus),
        shared_gpu=None if placement.shared_gpu is None else int(placement.shared_gpu),
        share=float(placement.share),
        gpu_memory_mib=int(placement.gpu_memory_mib),
    )
