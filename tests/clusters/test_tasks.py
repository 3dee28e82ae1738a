"""Celery entry points: ids in, single flight per cluster, unreachable clusters marked."""

from __future__ import annotations

import time

import pytest

from clusters import tasks
from clusters.backends.simulated import description_parse
from clusters.models import Backend, Node, SimulatedPod
from tests.clusters.conftest import admit, make_cluster, make_workload
from tests.leases import leave_dead_holder, seconds_left

DESCRIPTION = "nodes: [{name: n0, gpus: 4, labels: {gpupool.io/node-pool: a100}}]"


def sim(name: str, **extra):
    return make_cluster(name, Backend.SIMULATED, config=description_parse(DESCRIPTION), **extra)


def test_sync_inventory_and_reconcile_cluster_take_ids(org):
    cluster = sim("one")
    assert tasks.sync_inventory(cluster.pk) == {"nodes": 1, "gpus": 4, "vanished": 0}
    workload = make_workload(org.project_a, org.researcher, "job")
    admit(workload, Node.objects.get(cluster=cluster), pods=[{"gpu_indices": [0]}])
    # the first pass of the period is the full one (clusters.reconcile.full_pass_due); it
    # reads the cluster's pods (none yet) and compares no kept rows
    first = {"created": 1, "deleted": 0, "errors": [], "full": True}
    assert tasks.reconcile_cluster(cluster.pk) == first | {"pods_read": 0, "allocations_read": 0}
    # the next is targeted. How many rows it reads depends on what this worker process kept
    # of a cluster with the same id (earlier tests in the process reuse ids): not pinned here
    # (tests/clusters/test_reconcile_changes.py counts them)
    second = tasks.reconcile_cluster(cluster.pk)
    assert {key: second[key] for key in first} == first | {"created": 0, "full": False}
    assert {"pods_read", "allocations_read"} <= second.keys()


def test_a_reconcile_already_running_for_the_cluster_is_not_started_twice(org):
    cluster = sim("one")
    tasks.sync_inventory(cluster.pk)
    admit(make_workload(org.project_a, org.researcher, "job"), Node.objects.get())
    with tasks.reconcile_lease(cluster.pk) as held:  # another worker holds it
        assert held
        assert tasks.reconcile_cluster(cluster.pk) is None
    assert SimulatedPod.objects.count() == 0
    tasks.reconcile_cluster(cluster.pk)
    assert SimulatedPod.objects.count() == 1


def test_a_pass_holds_its_cluster_for_one_reconcile_period_at_a_time(org, settings, monkeypatch):
    """A worker killed mid-pass cannot release its lease: what it leaves must run out within
    one reconcile period. (A 300 s lock once held every reconcile of the demo's clusters up
    after its worker was killed, and the restarted worker ran nothing.)"""
    settings.GPUPOOL_RECONCILE_INTERVAL_S = 5
    cluster = sim("one")
    real, left = tasks.cluster_reconcile, []

    def observed(cluster, **kwargs):
        left.append(seconds_left(f"reconcile-{cluster.pk}"))
        return real(cluster, **kwargs)

    monkeypatch.setattr(tasks, "cluster_reconcile", observed)
    assert tasks.reconcile_cluster(cluster.pk) is not None
    assert left and 0 < left[0] <= 5
    assert seconds_left(f"reconcile-{cluster.pk}") is None, "released at the end"


def test_a_lease_left_by_a_killed_worker_runs_out_and_the_next_pass_runs(org):
    cluster = sim("one")
    tasks.sync_inventory(cluster.pk)
    admit(make_workload(org.project_a, org.researcher, "job"), Node.objects.get())
    leave_dead_holder(f"reconcile-{cluster.pk}", 0.5)
    assert tasks.reconcile_cluster(cluster.pk) is None, "held until it runs out"
    time.sleep(0.6)
    assert tasks.reconcile_cluster(cluster.pk) is not None
    assert SimulatedPod.objects.count() == 1


def test_a_reconcile_that_breaks_shows_why_on_the_cluster_and_frees_its_lock(org, monkeypatch):
    cluster = sim("one")

    def broken(cluster, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(tasks, "cluster_reconcile", broken)
    with pytest.raises(RuntimeError):
        tasks.reconcile_cluster(cluster.pk)
    cluster.refresh_from_db()
    assert cluster.last_error == "reconcile failed: RuntimeError: a bug"
    with tasks.reconcile_lease(cluster.pk) as held:
        assert held, "the next run may start"


def test_disabled_and_missing_clusters_are_skipped(db):
    cluster = sim("off", enabled=False)
    assert tasks.reconcile_cluster(cluster.pk) is None
    assert tasks.sync_inventory(cluster.pk) is None
    assert tasks.reconcile_cluster(99999) is None


def test_reconcile_all_reconciles_each_cluster_and_leaves_the_others_pods_alone(
    org, django_capture_on_commit_callbacks
):
    first, second = sim("first"), sim("second")
    for cluster in (first, second):
        tasks.sync_inventory(cluster.pk)
    on_first = make_workload(org.project_a, org.researcher, "a")
    on_second = make_workload(org.project_a, org.researcher, "b")
    admit(on_first, Node.objects.get(cluster=first), pods=[{"gpu_indices": [0]}])
    admit(on_second, Node.objects.get(cluster=second), pods=[{"gpu_indices": [0]}])
    with django_capture_on_commit_callbacks(execute=True):
        tasks.reconcile_all()
    pods = sorted(SimulatedPod.objects.values_list("cluster__name", "workload_id"))
    assert pods == [("first", on_first.pk), ("second", on_second.pk)]


def test_an_unreachable_cluster_is_marked_by_inventory_sync(db, settings):
    from cryptography.fernet import Fernet

    from clusters.crypto import kubeconfig_encrypt

    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()
    config = (
        "apiVersion: v1\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    cluster = make_cluster(
        "gone",
        Backend.KUBERNETES,
        kubeconfig_encrypted=kubeconfig_encrypt(config),
        config={"retries": 2, "backoff_s": 0.01, "timeout_s": 0.5, "connect_timeout_s": 0.5},
    )
    assert tasks.sync_inventory(cluster.pk) is None
    cluster.refresh_from_db()
    assert cluster.reachable is False and "gone" in cluster.last_error
