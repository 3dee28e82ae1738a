"""Dynamic MIG on the cluster side: what a MIG pod gets, and the instances a page draws.

The scheduler keeps the instances it wants as MigInstance rows (scheduling/mig.py); the node
makes its GPU match them through NVML (clusters/agent/mig.py) and reports each instance's
MIG device UUID. A pod on an instance sees only that device: NVIDIA_VISIBLE_DEVICES (the
container toolkit) and CUDA_VISIBLE_DEVICES (a process) are the MIG UUID. The GPU enforces
the instance's memory and compute itself, so no MPS limits are added. docs/mig.md.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from typing import Any

from clusters.backends import Backend
from clusters.models import Cluster, Gpu, MigInstance
from scheduling.engine.mig import profiles_for
from scheduling.engine.mig_profiles import MEMORY_SLICES

_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")
# The namespace of the MIG device UUIDs the simulated backend makes up (stable per instance).
SIMULATED_NAMESPACE = uuidlib.UUID("7d3c1d36-6b7e-4b52-9a5e-2f0e6f4c1a11")


def mig_limits(profile: str) -> dict[str, Any]:
    """What the GPU enforces for a pod on an instance of `profile`, for the API and pages."""
    found = _PROFILE.match(profile)
    slices, gb = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    return {
        "mechanism": "mig",
        "profile": profile,
        "gpu_memory_mib": gb * 1024,
        "compute_slices": slices,
    }


def mig_env(device_uuid: str) -> dict[str, str]:
    """The variables that show a pod (container or process) only its MIG device."""
    return {"NVIDIA_VISIBLE_DEVICES": device_uuid, "CUDA_VISIBLE_DEVICES": device_uuid}


def simulated_uuid(gpu_uuid: str, profile: str, start: int) -> str:
    """A stable made-up MIG device UUID, in the real format (MIG-<uuid>)."""
    return f"MIG-{uuidlib.uuid5(SIMULATED_NAMESPACE, f'{gpu_uuid}/{profile}@{start}')}"


def drawn_instances(
    model: str, memory_mib: int, instances: list[Any], holders: dict[int, dict]
) -> list[dict[str, Any]]:
    """One GPU's instances as the nodes page draws them: where each lies on the 8 memory
    slices (left and width in %), its profile, UUID and holder (None: idle, kept for
    reuse). `holders` maps an instance's start to its holder's label."""
    profiles = profiles_for(model, memory_mib)
    out = []
    for inst in instances:
        profile = profiles.get(inst.profile)
        size = profile.size if profile else 1
        out.append(
            {
                "profile": inst.profile,
                "start": inst.start,
                "uuid": inst.uuid,
                "left": round(100 * inst.start / MEMORY_SLICES, 2),
                "width": round(100 * size / MEMORY_SLICES, 2),
                "holder": holders.get(inst.start),
            }
        )
    return out


def mig_sync(cluster: Cluster, backend: Backend) -> list[str]:
    """Have the cluster's nodes hold the instances the scheduler wants, and keep the UUIDs
    they report (level-triggered: every MIG-enabled GPU is named, so instances nobody
    wants any more are destroyed). Returns the node side's errors."""
    wanted: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for gpu in Gpu.objects.filter(node__cluster=cluster, mig_enabled=True).select_related("node"):
        wanted[(gpu.node.name, gpu.index)] = []
    rows = list(
        MigInstance.objects.filter(gpu__node__cluster=cluster)
        .select_related("gpu__node")
        .order_by("gpu_id", "start")
    )
    for row in rows:
        wanted.setdefault((row.gpu.node.name, row.gpu.index), []).append((row.profile, row.start))
    if not wanted:
        return []
    made, errors = backend.mig_sync(wanted)
    changed = []
    for row in rows:
        device = made.get((row.gpu.node.name, row.gpu.index, row.start), "")
        if device != row.uuid:
            row.uuid = device
            changed.append(row)
    MigInstance.objects.bulk_update(changed, ["uuid"])
    return errors


def mig_device_map(node_ids: set[int]) -> dict[tuple[int, int, int], str]:
    """(node id, GPU index, start) -> the MIG device UUID the node reported."""
    rows = MigInstance.objects.filter(gpu__node_id__in=node_ids).exclude(uuid="")
    return {
        (node, index, start): uuid
        for node, index, start, uuid in rows.values_list(
            "gpu__node_id", "gpu__index", "start", "uuid"
        )
    }


def mig_ready(allocation: Any, devices: dict[tuple[int, int, int], str]) -> bool:
    """Whether a pod may start: not MIG, or its instance exists on the node."""
    if allocation.mig_gpu_index is None or allocation.mig_start is None:
        return True
    return (allocation.node_id, allocation.mig_gpu_index, allocation.mig_start) in devices
