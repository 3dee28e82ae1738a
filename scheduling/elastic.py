"""Applying an elastic workload's size changes: pod rows, the timeline, and a restart.

The engine decides (scheduling/engine/actions/elastic.py); this writes what it decided:
pod allocations added and removed, `resized_at`, a "resized" event on the workload's
timeline, and, unless the job handles resizing itself, a restart of its pods from their
checkpoint with the new size (clusters.reconcile deletes the pods of a `restarting`
workload, then creates them again with the new rank and world size).
"""

from __future__ import annotations

from datetime import datetime

from scheduling import adapters, gpu_range
from scheduling.engine import types as t
from scheduling.lifecycle import workload_event
from scheduling.models import PodAllocation, Workload


def resizes_apply(
    read: adapters.SnapshotRead, resizes: tuple[t.Resize, ...], now: datetime
) -> tuple[set[int], set[tuple[str, int]]]:
    """Write each resize (the caller has checked the added pods' capacity); return the
    clusters to reconcile and the devices that pods taken back still hold (admissions
    onto them wait for those pods to stop)."""
    clusters: set[int] = set()
    freed: set[tuple[str, int]] = set()
    for resize in resizes:
        wl = read.workloads[resize.workload_id]
        if wl.min_gpus is not None:
            clusters_of, held = _gpu_range_resize(read, wl, resize, now)
            clusters |= clusters_of
            freed |= held
            continue
        gone = list(wl.allocations.filter(pod_index__in=resize.removed))
        before = wl.allocations.filter(releasing=False).count()
        freed |= adapters._devices(gone)
        clusters |= {a.node.cluster_id for a in gone}
        release_pods(gone)
        PodAllocation.objects.bulk_create(_rows(wl, resize.added))
        clusters |= {read.nodes[p.node_id].cluster_id for p in resize.added}
        wl.resized_at = now
        wl.restarting = not wl.handles_resize
        wl.save(update_fields=["resized_at", "restarting"])
        workload_event(
            wl, type="resized", reason=_reason(resize), message=_message(read, resize, before)
        )
    return clusters, freed


def _gpu_range_resize(
    read: adapters.SnapshotRead, wl: Workload, resize: t.Resize, now: datetime
) -> tuple[set[int], set[tuple[str, int]]]:
    """A single pod with a GPU range changes its GPU count: always a restart (a pod's
    GPUs are fixed while it runs), from its checkpoint, with GPUPOOL_NUM_GPUS the new
    count. GPUs it gives back stay held until the old pod is gone."""
    row, gone, added = gpu_range.resize_row(wl, resize)
    wl.resized_at, wl.restarting = now, True
    wl.save(update_fields=["resized_at", "restarting"])
    before = len(row.gpu_indices) - len(added) + len(gone)
    text = f"From {before} to {len(row.gpu_indices)} GPUs (range {wl.min_gpus}..{int(wl.gpus)})"
    beneficiary = read.workloads.get(resize.beneficiary or "")
    if beneficiary is not None:
        text += f": room for {beneficiary.project.name}/{beneficiary.name}"
    workload_event(
        wl,
        type="resized",
        reason=_reason(resize),
        message=text + "; its pod restarts from its checkpoint with the new GPU count.",
    )
    node = adapters.engine_node_id(row.node_id)
    return {read.nodes[node].cluster_id}, {(node, index) for index in gone}


def release_pods(allocations: list[PodAllocation]) -> None:
    """Pods given back: their rows stay, marked, so that their GPUs count as taken until
    the cluster confirms the pods are gone (clusters.reconcile deletes the rows then)."""
    PodAllocation.objects.filter(pk__in=[a.pk for a in allocations]).update(releasing=True)


def _rows(wl: Workload, added: tuple[t.PodPlacement, ...]) -> list[PodAllocation]:
    return [
        PodAllocation(
            workload=wl,
            pod_index=pod.pod,
            node_id=int(pod.node_id),
            gpu_indices=list(pod.gpus),
            shared_gpu_index=pod.shared_gpu,
            gpu_share=pod.share if pod.shared_gpu is not None else None,
            gpu_memory_mib=pod.gpu_memory_mib,
        )
        for pod in added
    ]


def _reason(resize: t.Resize) -> str:
    return "Grew" if resize.delta > 0 else "Shrunk"


def _message(read: adapters.SnapshotRead, resize: t.Resize, before: int) -> str:
    wl = read.workloads[resize.workload_id]
    unit = "replicas" if wl.kind == "inference" else "pods"
    text = f"From {before} to {before + resize.delta} {unit} (range {wl.min_pods}..{wl.pods})"
    beneficiary = read.workloads.get(resize.beneficiary or "")
    if beneficiary is not None:
        text += f": room for {beneficiary.project.name}/{beneficiary.name}"
    if not wl.handles_resize:
        text += "; its pods restart from their checkpoint with the new size"
    return text + "."
