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
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from clusters.agent.miglayout import LayoutInvalid, report_decode
from clusters.backends import Backend, MigKey
from clusters.models import Cluster, Gpu, MigInstance, Node
from portal.errors import ValidationFailed
from scheduling.engine.mig import profiles_for
from scheduling.engine.mig_profiles import MEMORY_SLICES

_PROFILE = re.compile(r"([1-7])g\.(\d+)gb")  # matched whole
# The namespace of the MIG device UUIDs the simulated backend makes up (stable per instance).
SIMULATED_NAMESPACE = uuidlib.UUID("7d3c1d36-6b7e-4b52-9a5e-2f0e6f4c1a11")


def mig_limits(profile: str) -> dict[str, Any]:
    """What the GPU enforces for a pod on an instance of `profile`, for the API and pages."""
    found = _PROFILE.fullmatch(profile)
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
    """Whether a pod may start, or stay: not MIG, made already (it has its device: a
    device unknown for a while, a node that did not report yet, must not delete it), or
    its instance exists on the node."""
    if allocation.mig_gpu_index is None or allocation.mig_start is None:
        return True
    if allocation.backend_ref:
        return True
    return (allocation.node_id, allocation.mig_gpu_index, allocation.mig_start) in devices


# --- Kubernetes: the node agents report what they made ------------------------------------


def mig_report_store(node: Node, body: Any) -> dict[str, Any]:
    """Keep what a node's agent reports of its MIG devices (POST /api/v1/nodes/mig-report,
    its node token: a node speaks for itself only). Refused whole when malformed."""
    try:
        report = report_decode(body)
    except LayoutInvalid as exc:
        field_name = str(exc).split(":", 1)[0] if ":" in str(exc) else "report"
        raise ValidationFailed({field_name: [str(exc)]}) from exc
    stored = {
        **report,
        "devices": {
            str(i): {str(s): u for s, u in d.items()} for i, d in report["devices"].items()
        },
        "at": timezone.now().isoformat(),
    }
    Node.objects.filter(pk=node.pk).update(mig_report=stored)
    node.mig_report = stored
    return stored


@dataclass(slots=True)
class NodeMigState:
    """What the portal knows of one node for its MIG layout."""

    repartition: bool = True  # its pool lets the scheduler destroy idle instances
    report: dict[str, Any] = field(default_factory=dict)


def mig_node_states(cluster: Cluster) -> dict[str, NodeMigState]:
    rows = Node.objects.filter(cluster=cluster).values_list(
        "name", "pool__mig_repartition", "mig_report"
    )
    return {
        name: NodeMigState(repartition is not False, report if isinstance(report, dict) else {})
        for name, repartition, report in rows
    }


def mig_mode_reported(cluster: Cluster) -> dict[str, set[int]]:
    """Node name -> the GPUs its agent found in MIG mode (Kubernetes inventory)."""
    return {
        name: {int(i) for i in state.report.get("mig_mode", [])}
        for name, state in mig_node_states(cluster).items()
    }


def mig_reported(
    cluster: Cluster, published: dict[str, str], states: dict[str, NodeMigState]
) -> tuple[dict[MigKey, str], list[str]]:
    """The MIG devices of the instances wanted on nodes whose layout (`published`: node
    name -> layout id) the portal wrote, and the nodes' errors. A report of the layout
    now published is the truth; until one comes (the agent has not applied it yet), the
    devices already known are kept, so that a change on one GPU does not make every
    instance of the node unknown."""
    made: dict[MigKey, str] = {}
    errors: list[str] = []
    rows = MigInstance.objects.filter(gpu__node__cluster=cluster, gpu__node__name__in=published)
    known = {
        (node, index, start): uuid
        for node, index, start, uuid in rows.values_list(
            "gpu__node__name", "gpu__index", "start", "uuid"
        )
    }
    for (node, index, start), uuid in known.items():
        report = states[node].report if node in states else {}
        if report.get("layout") == published[node]:
            device = report.get("devices", {}).get(str(index), {}).get(str(start), "")
            if device:
                made[(node, index, start)] = device
        elif uuid:
            made[(node, index, start)] = uuid
    for node, layout in sorted(published.items()):
        report = states[node].report if node in states else {}
        if report.get("layout") == layout:
            errors += [f"node {node}: {e}" for e in report.get("errors", [])]
    return made, errors
