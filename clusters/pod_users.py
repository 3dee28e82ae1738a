"""Who a local pod's processes run as, known to the sandbox that sets it and to the node
agent that reads it back (which imports no Django: keep this module free of imports).

A sandboxed pod runs as a kernel uid of its own workload's, `UID_BASE` + its workload id,
with no passwd entry needed (like systemd's dynamic users); nothing inside the sandbox can
change it, so it names the pod's workload where its environment could lie."""

UID_BASE = 1_000_000_000  # + workload id: one user per workload


def pod_uid(workload_id: int) -> int:
    return UID_BASE + workload_id


def workload_of_uid(uid: int) -> int | None:
    """The workload a sandboxed pod's uid belongs to, or None for any other user."""
    return uid - UID_BASE if uid >= UID_BASE else None
