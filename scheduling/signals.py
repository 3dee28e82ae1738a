"""What scheduling tells the rest of the platform, without importing it.

Scheduling decides; the clusters app applies and reports pod facts back through
scheduling.lifecycle. The two calls the other way are signals, connected when the apps are
ready (scheduling/apps.py, clusters/apps.py), so neither app imports the other's tasks:

- cycle_wanted: work arrived or capacity came free; a cycle should run soon.
- clusters_changed(cluster_ids): the database now asks these clusters to change (pods to
  create or delete); each should be reconciled.

Both are sent after the current transaction commits, so a receiver never sees a decision
that is later rolled back.

- gpus_freed: the sender's transaction has just released pods' GPUs (a reconcile saw a
  cycle's victims gone). Sent in that transaction, not after it: a receiver admits there
  the placements an earlier cycle nominated on those GPUs (scheduling/nominations.py) and
  answers with the workloads it admitted, by cluster ({cluster id: workload ids}), so that
  their pods are made at once instead of after the next cycle.

- allocations_releasing(allocation_ids, at): these PodAllocation rows are about to be
  deleted together, in the sender's transaction (their pods are gone). Sent in place of
  one post_delete per row, so that a receiver records all of them in a few statements
  (clusters/metrics/allocations.py closes their usage intervals).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.dispatch import Signal

cycle_wanted = Signal()
clusters_changed = Signal()
allocations_releasing = Signal()
gpus_freed = Signal()


def cycle_request() -> None:
    """Ask for a scheduling cycle once the current transaction commits."""
    transaction.on_commit(lambda: cycle_wanted.send(sender=__name__))


def clusters_reconcile(cluster_ids: Iterable[int | None]) -> None:
    """Ask for these clusters to be reconciled once the current transaction commits."""
    ids = sorted({c for c in cluster_ids if c is not None})
    if ids:
        transaction.on_commit(lambda: clusters_changed.send(sender=__name__, cluster_ids=ids))
