"""Which MPS daemons a node's agent runs, and for which allocations (Kubernetes, issue 26).

A native sharer (a pod made outside GPUPool that asks for part of a GPU,
clusters/native_sharing.py) mounts its GPU's pipe folder through a subPathExpr, and the
kubelet makes a missing subPath folder itself: it does not wait for the GPU's MPS daemon, as
it does for GPUPool's own sharers (their hostPath of type Directory is the folder the agent
makes). A sharer that starts before its daemon runs without its limits. So GPUPool binds a
native sharer only once the node's agent has said that the daemon of the pod's device runs
and that it saw the pod's allocation: after each sync of its daemons (clusters.agent.mps),
the agent posts `{"running": {device: [allocation id, ...]}}` to /api/v1/nodes/mps-report,
with its node token, and the report replaces the last one. An agent keeps a GPU's daemon
while any allocation it was told of shares that GPU, and it was told of this one (its pods
endpoint lists it): the daemon stays up, restarted if it dies, while the allocation lasts.

What the report does not cover: a daemon that died since (the agent restarts it within its
30 s poll, and the pod's own pipe folder stays mounted), and an agent older than this report
(it posts none: its node's native sharers wait; their pods and workloads say why, and that
the agent must be upgraded: `mps_reported`).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from clusters.agent.mps import KEY
from clusters.models import Node
from portal.errors import ValidationFailed

MAX_DEVICES = 64  # GPUs of one node
MAX_ALLOCATIONS = 4096  # sharers of one GPU, at most


def mps_report_store(node: Node, body: Any) -> dict[str, Any]:
    """Keep what a node's agent reports of its MPS daemons (a node speaks for itself only:
    its token names it). Refused whole when malformed."""
    running = body.get("running") if isinstance(body, dict) else None
    if not isinstance(running, dict) or len(running) > MAX_DEVICES:
        raise ValidationFailed(
            {"running": [f"Send an object of at most {MAX_DEVICES} devices: allocation ids."]}
        )
    stored: dict[str, list[int]] = {}
    for device, ids in running.items():
        if not KEY.fullmatch(str(device)):
            raise ValidationFailed(
                {"running": [f"Not a GPU UUID or index: {str(device)[:100]!r}."]}
            )
        if (
            not isinstance(ids, list)
            or len(ids) > MAX_ALLOCATIONS
            or not all(type(i) is int and 0 < i < 2**63 for i in ids)
        ):
            raise ValidationFailed(
                {"running": [f"{device}: send a list of at most {MAX_ALLOCATIONS} allocation ids."]}
            )
        stored[device] = sorted(set(ids))
    report = {"running": stored, "at": timezone.now().isoformat()}
    Node.objects.filter(pk=node.pk).update(mps_report=report)
    node.mps_report = report
    return report


def mps_running_for(report: Any, allocation_id: int) -> tuple[str, ...]:
    """The devices whose MPS daemon a node's stored report says runs for this allocation
    (a report of another shape, or none: no device)."""
    running = report.get("running") if isinstance(report, dict) else None
    if not isinstance(running, dict):
        return ()
    return tuple(
        sorted(
            str(d) for d, ids in running.items() if isinstance(ids, list) and allocation_id in ids
        )
    )


def mps_reported(report: Any) -> bool:
    """Whether a node's agent ever reported its MPS daemons (`mps_report_store`): one older
    than this report never does."""
    return isinstance(report, dict) and isinstance(report.get("running"), dict)
