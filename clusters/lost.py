"""Who stopped a pod that GPUPool did not stop: the words of a requeue.

A pod GPUPool created and still wants can vanish or fail for reasons that are not its
own code's: someone deleted it (`kubectl delete`, a drain's evictions), its node is gone
or does not answer, or the kubelet evicted it (node pressure, a device it could not
allocate). Each is requeued (reconcile's `_requeue_lost`); these are the words that say
which, so that nobody reads "preempted" where nobody preempted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusters.backends import BackendError, PodStatus, pod_name

if TYPE_CHECKING:
    from clusters.backends import Backend
    from scheduling.models import PodAllocation

# Failure reasons that mean the node went away rather than the kubelet evicting the pod.
NODE_GONE_REASONS = {"NodeLost"}
NAMES_SHOWN = 3  # a gang can lose dozens of pods at once: the first few, then a count


def nodes_present(backend: Backend, missing: list[PodAllocation]) -> set[str] | None:
    """The names of the cluster's nodes now, asked only when a pod GPUPool made is
    missing (rare): a pod gone with its node was lost, one gone from a node still there was
    deleted. None when the cluster does not say (the words then name the node only)."""
    if not missing:
        return set()
    try:
        return {node.name for node in backend.list_inventory()}
    except BackendError:
        return None


def lost_message(
    lost: list[tuple[PodAllocation, PodStatus | None]], present: set[str] | None
) -> str:
    """One sentence per cause, in the order deleted, evicted, node lost."""
    deleted, evicted, node_lost = [], [], set()
    for allocation, status in lost:
        node = allocation.node.name
        name = pod_name(allocation.workload_id, allocation.pod_index)
        if status is None and present is not None and node in present:
            deleted.append(name)
        elif status is not None and status.lost and status.reason not in NODE_GONE_REASONS:
            evicted.append((name, node, status))
        else:  # gone with its node, or stuck terminating on one that does not answer
            node_lost.add(node)
    sentences = []
    if deleted:
        were = "was" if len(deleted) == 1 else "were"
        sentences.append(
            f"{_pods(deleted)} {were} deleted outside GPUPool (kubectl delete, a drain)"
        )
    if evicted:
        name, node, status = evicted[0]
        why = ": ".join(filter(None, [status.reason, status.message])) or "no reason given"
        more = f" (and {len(evicted) - 1} more)" if len(evicted) > 1 else ""
        sentences.append(f"Pod {name}{more} was evicted by the kubelet on {node}: {why}")
    if node_lost:
        sentences.append(f"Pods lost on {', '.join(sorted(node_lost))}")
    return ". ".join(s.rstrip(".") for s in sentences) + "."


def _pods(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:NAMES_SHOWN])
    rest = len(names) - NAMES_SHOWN
    word = "Pod" if len(names) == 1 else "Pods"
    return f"{word} {shown}" + (f" and {rest} more" if rest > 0 else "")
