"""Celery entry points of the clusters app: take ids, call services."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from functools import partial

from celery import shared_task
from celery.signals import worker_process_init, worker_ready
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from clusters.backends import BackendUnreachable
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster
from clusters.reconcile import cluster_mark_unreachable, cluster_reconcile
from portal.leases import Lease, lease, period_ttl_s
from portal.queueing import enqueue

log = logging.getLogger(__name__)
AGAIN_TTL_S = 300
SOON_S = 0.5  # a burst of pod changes seen by the watch makes one reconcile


def reconcile_lease(cluster_id: int) -> AbstractContextManager[Lease]:
    """Two reconciles of one cluster at once would both create the same missing pod: a pass
    holds the cluster's lease. It lasts one reconcile period and is renewed while the pass
    runs, so a worker killed mid-pass holds the cluster up for one period, not longer."""
    ttl = period_ttl_s(settings.GPUPOOL_RECONCILE_INTERVAL_S)
    return lease(f"reconcile-{cluster_id}", ttl)


@shared_task(ignore_result=True)
def reconcile_cluster(cluster_id: int) -> dict | None:
    cluster = Cluster.objects.filter(pk=cluster_id, enabled=True).first()
    if cluster is None:
        return None
    again, ran = f"gpupool:reconcile-again:{cluster_id}", False
    try:
        with reconcile_lease(cluster_id) as held:
            if not held:
                # The running pass may have observed the cluster before the change that
                # asked for this one: it runs again when it ends.
                cache.set(again, "1", AGAIN_TTL_S)
                log.info("reconcile of %s already running; it runs again after", cluster.name)
                return None
            ran = True
            return _reconcile_held(cluster)
    finally:
        # After the lease is released (an eager task would find it held).
        if ran and cache.delete(again):
            reconcile_soon(cluster_id)


def _reconcile_held(cluster: Cluster) -> dict:
    try:
        result = cluster_reconcile(cluster)
    except Exception as exc:
        # A fault of GPUPool's own, not the cluster's: shown as the cluster's last error
        # (its reachability is unknown), and raised for the worker's log.
        error = f"reconcile failed: {type(exc).__name__}: {exc}"
        Cluster.objects.filter(pk=cluster.pk).update(last_error=error[:2000])
        raise
    return {
        "created": result.created,
        "deleted": result.deleted,
        "errors": result.errors,
        "full": result.full,
        "pods_read": result.pods_read,
        "allocations_read": result.allocations_read,
    }


def reconcile_soon(cluster_id: int) -> None:
    """A watch saw a pod change (finished, failed, deleted): reconcile now rather than at
    the next beat tick. cache.add makes a burst of changes, in any process, one task."""
    if cache.add(f"gpupool:reconcile-soon:{cluster_id}", "1", SOON_S):
        reconcile_cluster.apply_async((cluster_id,), countdown=SOON_S)


@worker_process_init.connect
@worker_ready.connect
def _watch_triggers_reconcile(**_: object) -> None:
    """In a worker (not the web server, not a test), the Kubernetes watches of this process
    enqueue a reconcile when a pod changes."""
    from clusters.backends.kubernetes.watch import set_change_listener  # noqa: PLC0415 - heavy

    set_change_listener(reconcile_soon)


def on_clusters_changed(sender: object, cluster_ids: list[int], **kwargs: object) -> None:
    """scheduling.signals.clusters_changed's receiver (connected in clusters/apps.py)."""
    for cluster_id in cluster_ids:
        send = partial(reconcile_cluster.delay, cluster_id)
        enqueue(send, f"a reconcile of cluster {cluster_id}")


@shared_task(ignore_result=True)
def reconcile_all() -> None:
    for cluster_id in Cluster.objects.filter(enabled=True).values_list("pk", flat=True):
        transaction.on_commit(lambda cid=cluster_id: reconcile_cluster.delay(cid))


@shared_task(ignore_result=True)
def sync_inventory(cluster_id: int) -> dict | None:
    cluster = Cluster.objects.filter(pk=cluster_id, enabled=True).first()
    if cluster is None:
        return None
    try:
        result = inventory_sync(cluster)
        if cluster.backend == Backend.KUBERNETES:
            # The namespaces' labels of the pod webhook, level-triggered; imported here:
            # only a Kubernetes cluster's work imports the client.
            from clusters.enforcement import enforcement_sync  # noqa: PLC0415

            enforcement_sync(cluster)
    except BackendUnreachable as exc:
        cluster_mark_unreachable(cluster, str(exc))
        return None
    return {"nodes": result.nodes, "gpus": result.gpus, "vanished": result.vanished}


@shared_task(ignore_result=True)
def sync_enforcement(cluster_id: int) -> list[str] | None:
    """A project's enforce_scheduler (or namespace) changed: label its namespaces now
    rather than at the next inventory sync."""
    cluster = Cluster.objects.filter(pk=cluster_id, enabled=True).first()
    if cluster is None:
        return None
    from clusters.enforcement import enforcement_sync  # noqa: PLC0415 - Kubernetes only

    try:
        return enforcement_sync(cluster)
    except BackendUnreachable as exc:
        log.warning("%s: namespaces not labelled: %s", cluster.name, exc)
        return None


def sync_enforcement_soon() -> None:
    """On commit: a sync of the labels on every enabled Kubernetes cluster."""
    kubernetes = Cluster.objects.filter(enabled=True, backend=Backend.KUBERNETES)
    for cluster_id in kubernetes.values_list("pk", flat=True):
        send = partial(sync_enforcement.delay, cluster_id)
        what = f"a sync of cluster {cluster_id}'s namespace labels"
        transaction.on_commit(partial(enqueue, send, what))


@shared_task(ignore_result=True)
def sync_all_inventories() -> None:
    for cluster_id in Cluster.objects.filter(enabled=True).values_list("pk", flat=True):
        transaction.on_commit(lambda cid=cluster_id: sync_inventory.delay(cid))
