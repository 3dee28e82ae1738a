"""Work a pool could not isolate is refused when it is submitted, not failed at its start.

A local cluster that cannot sandbox pods here (no root, no bubblewrap, sandboxing turned
off: `Cluster.isolation`) runs only a platform admin's work; anyone else's pod used to be
admitted and then fail a second later, the reason shown only on the admin's clusters
page. A submit that names only such pools is refused on its node pools, saying why; one that
names none is given the pools that can isolate it (and refused when there are none), so
the scheduler never places it where it could not start."""

from __future__ import annotations

from typing import Any

from clusters.models import Backend, Cluster, Node
from portal.permissions import is_platform_admin
from scheduling.kept import kept


def pools_without_isolation() -> dict[str, str]:
    """Pools whose nodes are all on local clusters that cannot sandbox pods, with why."""
    return _pools()[1]


def _pools() -> tuple[set[str], dict[str, str]]:
    """Every pool with nodes, and those of them that cannot isolate tenants, with why;
    (set(), {}) without reading the nodes where every cluster can isolate (a submit's
    common case: no local cluster, or one that sandboxes)."""
    reasons = {
        c.pk: isolation.reason
        for c in Cluster.objects.filter(backend=Backend.LOCAL)
        if (isolation := c.isolation) is not None and not isolation.available
    }
    if not reasons:
        return set(), {}
    unsafe: dict[str, str] = {}
    safe: set[str] = set()
    for cluster_id, pool in Node.objects.values_list("cluster_id", "pool__name").distinct():
        if pool is None:
            continue
        if cluster_id in reasons:
            unsafe.setdefault(pool, reasons[cluster_id])
        else:
            safe.add(pool)
    return safe | set(unsafe), {pool: why for pool, why in unsafe.items() if pool not in safe}


def isolation_errors(actor: Any, fields: dict[str, Any]) -> dict[str, list[str]]:
    """The node pools' error when every pool the work names cannot isolate it.

    Work that names no pool may run in any: where some pools cannot isolate it, its
    `node_pools` become the others (by name, the order the scheduler tries all pools
    in), and it is refused when none can."""
    if actor is None or is_platform_admin(actor):
        return {}
    pools = fields.get("node_pools") or []
    every, unsafe = kept("isolation", _pools)  # once per native intake pass
    if not unsafe:
        return {}
    if not pools:
        fields["node_pools"] = pools = sorted(every - set(unsafe))
        if pools:
            return {}
        pools = sorted(unsafe)
    elif not all(pool in unsafe for pool in pools):
        return {}
    why = "; ".join(f"{pool}: {unsafe[pool]}" for pool in pools)
    return {
        "node_pools": [
            f"This pool runs pods without isolating tenants ({why}), so only a platform "
            "admin's work runs there. Choose another pool."
        ]
    }
