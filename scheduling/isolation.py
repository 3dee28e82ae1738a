"""Work a pool could not isolate is refused when it is submitted, not failed at its start.

A local cluster that cannot sandbox pods here (no root, no bubblewrap, sandboxing turned
off: `Cluster.isolation`) runs only a platform admin's work; anyone else's pod used to be
admitted and then fail a second later, the reason shown only on the admin's clusters
page. A submit that names only such pools is refused on its node pools, saying why."""

from __future__ import annotations

from typing import Any

from clusters.models import Backend, Cluster, Node
from portal.permissions import is_platform_admin


def pools_without_isolation() -> dict[str, str]:
    """Pools whose nodes are all on local clusters that cannot sandbox pods, with why."""
    clusters = {c.pk: c for c in Cluster.objects.all()}
    unsafe: dict[str, str] = {}
    safe: set[str] = set()
    for cluster_id, pool in Node.objects.values_list("cluster_id", "pool__name").distinct():
        cluster = clusters.get(cluster_id)
        if pool is None or cluster is None:
            continue
        isolation = cluster.isolation if cluster.backend == Backend.LOCAL else None
        if isolation is not None and not isolation.available:
            unsafe.setdefault(pool, isolation.reason)
        else:
            safe.add(pool)
    return {pool: why for pool, why in unsafe.items() if pool not in safe}


def isolation_errors(actor: Any, fields: dict[str, Any]) -> dict[str, list[str]]:
    """The node pools' error when every pool the work names cannot isolate it."""
    pools = fields.get("node_pools") or []
    if not pools or actor is None or is_platform_admin(actor):
        return {}
    unsafe = pools_without_isolation()
    if not all(pool in unsafe for pool in pools):
        return {}
    why = "; ".join(f"{pool}: {unsafe[pool]}" for pool in pools)
    return {
        "node_pools": [
            f"This pool runs pods without isolating tenants ({why}), so only a platform "
            "admin's work runs there. Choose another pool."
        ]
    }
