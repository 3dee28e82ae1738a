"""A GPU range for single-pod work, as the engine sees it and as the rows hold it.

A training job with min_gpus .. max_gpus runs one pod whose GPU count changes. To the
engine it is an elastic workload of max_gpus one-GPU "slices" (pod 0 carries the pod's
CPU and memory), min_gpus of them a gang, all required on one node (the topology level
NODE_LEVEL, which every node carries with its own id). So it is admitted when min_gpus
GPUs fit on one node within quota, grown a slice at a time with idle GPUs of that node
(over quota, by fair share, as elastic pods are) and shrunk slice by slice, newest first,
before any whole workload is evicted, never below min_gpus (actions/elastic.py). A GPU
range never moves its pod to another node to grow: it grows where it runs.

In the database it is one PodAllocation (pod 0) holding every GPU of its slices, in
slice order. A size change rewrites that row and restarts the pod with the new GPU count
(Workload.restarting): GPUs taken back stay in `releasing_gpu_indices`, still held, until
the old pod is gone.
"""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine import types as t
from scheduling.models import PodAllocation, Workload

NODE_LEVEL = "gpupool.io/node"  # the topology level that keeps a GPU range on one node
ONE_NODE = t.TopologyConstraint(NODE_LEVEL, t.TopologyMode.REQUIRED)


def engine_slices(wl: Workload, request: t.PodRequest) -> tuple[t.PodRequest, ...]:
    """max_gpus one-GPU requests; the first carries the pod's CPU and memory."""
    first = replace(request, gpus=1)
    return (first,) + (t.PodRequest(gpus=1),) * (int(wl.gpus) - 1)


def engine_placement(node_id: str, allocation: PodAllocation) -> tuple[t.PodPlacement, ...]:
    """The pod's GPUs as slices 0..k-1, in the order it was given them."""
    return tuple(
        t.PodPlacement(pod=i, node_id=node_id, gpus=(int(index),))
        for i, index in enumerate(allocation.gpu_indices)
    )


def as_rows(read_workloads: dict[str, Workload], result: t.CycleResult) -> t.CycleResult:
    """The result with each GPU-range admission's slices made one pod holding their GPUs
    (what the rows and the cluster see); resizes stay in slices (elastic.resizes_apply)."""
    admissions = tuple(
        _one_pod(a) if _ranged(read_workloads.get(a.workload_id)) else a for a in result.admissions
    )
    return replace(result, admissions=admissions)


def _ranged(wl: Workload | None) -> bool:
    return wl is not None and wl.min_gpus is not None


def _one_pod(admission: t.Admission) -> t.Admission:
    slices = sorted(admission.pods, key=lambda p: p.pod)
    gpus = tuple(index for pod in slices for index in pod.gpus)
    return t.Admission(admission.workload_id, (t.PodPlacement(0, slices[0].node_id, gpus),))


def resize_row(
    wl: Workload, resize: t.Resize
) -> tuple[PodAllocation, tuple[int, ...], tuple[int, ...]]:
    """Apply a GPU range's resize to its pod row: GPUs of removed slices move to
    releasing_gpu_indices (held until the pod restarts), added ones are appended. Returns
    the row, and the GPU counts before and after."""
    row = wl.allocations.get(pod_index=0)
    before = [int(i) for i in row.gpu_indices]
    gone = {before[i] for i in resize.removed if i < len(before)}
    kept = [i for i in before if i not in gone]
    added = [index for pod in sorted(resize.added, key=lambda p: p.pod) for index in pod.gpus]
    row.gpu_indices = kept + added
    row.releasing_gpu_indices = sorted({*row.releasing_gpu_indices, *gone})
    row.save(update_fields=["gpu_indices", "releasing_gpu_indices"])
    return row, tuple(sorted(gone)), tuple(added)
