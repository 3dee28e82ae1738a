"""List-then-watch: the fake API server's watch semantics (as strict as the real one's for
what GPUPool uses), and the backend's per-cluster cache kept current by the watch."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.kubernetes.watch import set_change_listener, watch_get, watches_stop
from clusters.models import Cluster
from clusters.reconcile import cluster_reconcile
from scheduling.models import WorkloadState as S
from tests.clusters.conftest import admit
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - fixture
from tests.clusters.test_kubernetes_backend import setup, training  # noqa: F401 - fixtures
from tests.clusters.test_local_backend import wait_until


@pytest.fixture(autouse=True)
def _no_watches_left(kube):  # noqa: F811 - stops before the server does
    yield
    set_change_listener(None)
    watches_stop()


@pytest.fixture
def watched(kube, setup):  # noqa: F811
    """The fake server, and its cluster observed through the watch (the default)."""
    fake = kube.require_fake()
    cluster, nodes = setup
    del cluster.config["watch"]  # the harness asks for the list; this is the default
    cluster.save()
    return fake, cluster, nodes


def _watch(fake, query: str, resource: str = "pods") -> tuple[int, list[dict]]:
    """A raw watch request: the status and the events, once the server ends the stream."""
    url = f"{fake.url}/api/v1/{resource}?watch=true&{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, [json.loads(line) for line in answer.read().splitlines()]
    except urllib.error.HTTPError as exc:
        return exc.code, [json.loads(exc.read())]


def _pod(name: str, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {"app": "x"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


@pytest.fixture
def fake(kube):  # noqa: F811
    fake = kube.require_fake()
    backend = KubernetesBackend(kube.cluster("raw"))
    backend.ensure_namespace("w")
    fake.api = backend.api
    return fake


# --- the fake server's strictness ----------------------------------------------------------
def test_a_watch_from_a_version_sends_only_what_changed_after_it(fake):
    fake.api.create_namespaced_pod("w", _pod("before"))
    version = fake.last_rv
    fake.api.create_namespaced_pod("w", _pod("after"))
    fake.api.delete_namespaced_pod("before", "w")
    status, events = _watch(fake, f"resourceVersion={version}&timeoutSeconds=0")
    assert status == 200
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after"),
        ("DELETED", "before"),
    ]
    # Each event carries the object's version at that change, in increasing order.
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > version


def test_a_watch_without_a_version_begins_with_what_exists(fake):
    fake.api.create_namespaced_pod("w", _pod("there", {"app": "x"}))
    fake.api.create_namespaced_pod("w", _pod("other", {"app": "y"}))
    _, events = _watch(fake, "labelSelector=app%3Dx&timeoutSeconds=0")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "there")]
    _, events = _watch(fake, "resourceVersion=0&timeoutSeconds=0")
    assert {e["object"]["metadata"]["name"] for e in events} == {"there", "other"}


def test_a_watch_from_a_version_older_than_the_window_gets_410_expired(fake):
    fake.event_window = 3
    old = fake.last_rv
    for i in range(5):
        fake.api.create_namespaced_pod("w", _pod(f"p{i}"))
    status, events = _watch(fake, f"resourceVersion={old}&timeoutSeconds=1")
    assert status == 200  # the error comes as an event, as from the real watch cache
    assert [e["type"] for e in events] == ["ERROR"]
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")
    assert "too old resource version" in events[0]["object"]["message"]


def test_a_watch_from_a_version_the_server_has_not_reached_gets_504(fake):
    status, events = _watch(fake, f"resourceVersion={fake.last_rv + 100}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 504)]
    assert "Too large resource version" in events[0]["object"]["message"]


def test_bookmarks_come_only_when_asked_and_carry_only_a_resource_version(fake):
    fake.bookmark_interval_s = 0.2
    version = fake.last_rv
    fake.add_node("gpu-c")  # a change to another resource moves the version on
    _, plain = _watch(fake, f"resourceVersion={version}&timeoutSeconds=1")
    assert plain == []
    _, marked = _watch(fake, f"resourceVersion={version}&timeoutSeconds=1&allowWatchBookmarks=true")
    assert marked and {e["type"] for e in marked} == {"BOOKMARK"}
    assert marked[-1]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(fake.last_rv)},
    }


def test_timeout_seconds_ends_the_watch_and_a_bad_value_is_refused(fake):
    started = time.monotonic()
    status, _ = _watch(fake, f"resourceVersion={fake.last_rv}&timeoutSeconds=1")
    assert status == 200 and 0.9 < time.monotonic() - started < 3
    for bad in ("timeoutSeconds=soon", "timeoutSeconds=-1", "resourceVersion=abc"):
        status, body = _watch(fake, bad)
        assert (status, body[0]["reason"]) == (400, "BadRequest"), bad


def test_a_label_change_moves_an_object_into_or_out_of_a_watch(fake):
    fake.api.create_namespaced_pod("w", _pod("p", {"app": "x"}))
    version = fake.last_rv
    fake.api.patch_namespaced_pod("p", "w", {"metadata": {"labels": {"app": "y"}}})
    fake.api.patch_namespaced_pod("p", "w", {"metadata": {"annotations": {"a": "1"}}})
    fake.api.patch_namespaced_pod("p", "w", {"metadata": {"labels": {"app": "x"}}})
    _, events = _watch(fake, f"labelSelector=app%3Dx&resourceVersion={version}&timeoutSeconds=0")
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]
    _, events = _watch(fake, f"resourceVersion={version}&timeoutSeconds=0")
    assert [e["type"] for e in events] == ["MODIFIED"] * 3


def test_a_watcher_left_behind_by_the_window_is_cut_and_then_gets_410(fake):
    """The real server closes a watch that cannot keep up; resuming from its last version
    is then refused with 410, and the client must list again."""
    fake.event_window = 2
    version = fake.last_rv
    with fake.lock:  # events pile up faster than the watch below is served
        for i in range(4):
            fake._store("pods", "w", _pod(f"q{i}") | {"kind": "Pod"}, "ADDED")
        fake.objects["pods"][("w", "q0")]["metadata"]["namespace"] = "w"
    status, events = _watch(fake, f"resourceVersion={version}&timeoutSeconds=1")
    assert [e["object"]["code"] for e in events if e["type"] == "ERROR"] == [410]


# --- the backend's watch cache ---------------------------------------------------------------
def test_the_watch_is_the_default_and_a_pass_reads_its_cache_not_a_list(watched, org):
    fake, cluster, nodes = watched
    workload = training(org, "watched")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    backend = KubernetesBackend(cluster)
    cluster_reconcile(cluster, backend=backend)
    assert backend.observed_by == "list"  # the first pass of this process lists...
    listed = fake.list_calls["pods"]
    pod = fake.pod("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"))
    cluster.refresh_from_db()
    # ...and keeps the version of what it wrote, for the next pass in any process.
    assert int(cluster.watch_state["pods"]) >= int(pod["metadata"]["resourceVersion"])
    for _ in range(3):
        second = KubernetesBackend(cluster)
        cluster_reconcile(cluster, backend=second)
        assert second.observed_by == "watch"
    assert fake.list_calls["pods"] == listed
    workload.refresh_from_db()
    assert workload.state == S.RUNNING


def test_a_pod_that_finishes_is_seen_through_the_watch_and_asks_for_a_reconcile(watched, org):
    fake, cluster, nodes = watched
    asked: list[int] = []
    set_change_listener(asked.append)
    workload = training(org, "quick")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    assert asked == []  # its own creates ask for nothing
    fake.finish("gp-ml-vision", k8s_name(cluster, f"gp-{workload.pk}-0"), exit_code=3)
    wait_until(lambda: asked == [cluster.pk])
    backend = KubernetesBackend(Cluster.objects.get(pk=cluster.pk))
    cluster_reconcile(backend.cluster, backend=backend)
    assert backend.observed_by == "watch"
    workload.refresh_from_db()
    assert (workload.state, workload.exit_code) == (S.FAILED, 3)


def test_a_pass_lists_when_the_cache_has_not_seen_a_write_made_elsewhere(watched, org):
    """Read-your-writes across worker processes: the Cluster row says what was written;
    a cache that cannot show it in time is not trusted."""
    _, cluster, nodes = watched
    cluster.config.update(watch_wait_s=0.2)
    cluster.save()
    admit(training(org, "one"), nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    cluster.refresh_from_db()
    backend = KubernetesBackend(Cluster.objects.get(pk=cluster.pk))
    backend.pod_statuses()
    assert backend.observed_by == "watch"  # caught up with its own writes: trusted
    ahead = int(cluster.watch_state["pods"]) + 1000
    Cluster.objects.filter(pk=cluster.pk).update(watch_state={"pods": str(ahead)})
    backend = KubernetesBackend(Cluster.objects.get(pk=cluster.pk))
    backend.pod_statuses()
    assert backend.observed_by == "list"


def test_an_expired_watch_lists_again_and_the_cache_follows_the_cluster(watched):
    fake, cluster, _ = watched
    backend = KubernetesBackend(cluster)
    backend.pod_statuses()
    watch = watch_get(cluster.pk, _fingerprint_of(backend))
    lists = fake.list_calls["pods"]
    fake.event_window = 3
    fake.down = True  # the watch is cut; meanwhile more changes than the window holds
    wait_until(lambda: not watch.pods.cache.connected)
    for i in range(5):
        fake.add_node(f"extra-{i}")
    with fake.lock:
        pod = {"apiVersion": "v1", "kind": "Pod", **_pod("made-meanwhile", _managed(backend))}
        pod["metadata"]["namespace"] = "gp-ml-vision"
        fake._store("pods", "gp-ml-vision", pod, "ADDED")
    fake.down = False
    names = lambda: {p["metadata"]["name"] for p in watch.pods.cache.items.values()}  # noqa: E731
    wait_until(lambda: "made-meanwhile" in names())
    # Resumed, got 410, listed once: the watch of GPUPool's pods and that of the pods that
    # name its scheduler each (the second may resume a moment later).
    wait_until(lambda: fake.list_calls["pods"] >= lists + 2)
    assert fake.list_calls["pods"] == lists + 2


def test_bookmarks_move_the_cache_on_without_changes_of_its_own(watched):
    fake, cluster, _ = watched
    fake.bookmark_interval_s = 0.1
    backend = KubernetesBackend(cluster)
    backend.pod_statuses()
    watch = watch_get(cluster.pk, _fingerprint_of(backend))
    fake.add_node("gpu-z")  # not a pod: no pod event, only a bookmark tells the version
    wait_until(lambda: watch.pods.cache.version == fake.last_rv)


def test_the_periodic_resync_lists_though_the_watch_is_healthy(watched):
    fake, cluster, _ = watched
    cluster.config.update(resync_s=0)
    cluster.save()
    before = fake.list_calls["pods"]  # the inventory's list of what others hold
    for _ in range(3):
        backend = KubernetesBackend(cluster)
        backend.pod_statuses()
        assert backend.observed_by == "list"
    assert fake.list_calls["pods"] == before + 3 * 2  # GPUPool's pods and the native ones


def test_a_cluster_that_stops_answering_is_unreachable_though_its_cache_is_warm(watched, org):
    fake, cluster, nodes = watched
    workload = training(org, "patient")
    admit(workload, nodes[0], pods=[{"gpu_indices": [0]}])
    cluster_reconcile(cluster)
    fake.down = True
    result = cluster_reconcile(cluster, backend=KubernetesBackend(cluster))
    assert result.reachable is False
    workload.refresh_from_db()
    assert workload.state in (S.ADMITTED, S.RUNNING)


def _managed(backend: KubernetesBackend) -> dict:
    """The labels of a workload pod of this installation and Cluster record."""
    return {**backend.owner.labels, "gpupool.io/role": "workload"}


def _fingerprint_of(backend: KubernetesBackend) -> str:
    from clusters.backends.kubernetes import _fingerprint

    return _fingerprint(backend)


def test_a_reconcile_asked_for_while_one_runs_runs_again_after_it(db, monkeypatch, kube):  # noqa: F811
    from django.core.cache import cache

    from clusters import tasks

    cluster = kube.cluster("busy")
    passes: list[int] = []

    def counted(cluster, **_):
        passes.append(cluster.pk)
        return _Result()

    monkeypatch.setattr(tasks, "cluster_reconcile", counted)
    with tasks.reconcile_lease(cluster.pk):  # a pass is running elsewhere
        assert tasks.reconcile_cluster(cluster.pk) is None
    assert passes == []
    tasks.reconcile_cluster(cluster.pk)  # the running one ends...
    assert passes == [cluster.pk, cluster.pk]  # ...and the asked-for pass follows (eager)
    # A burst of watch events makes one reconcile.
    cache.delete(f"gpupool:reconcile-soon:{cluster.pk}")
    for _ in range(5):
        tasks.reconcile_soon(cluster.pk)
    assert passes == [cluster.pk] * 3


class _Result:
    created = deleted = pods_read = allocations_read = 0
    errors: list = []
    full = True


@pytest.mark.django_db(transaction=True)
def test_bench_watch_times_both_ways_of_observing_and_leaves_no_rows():
    from io import StringIO

    from django.core.management import call_command

    from scheduling.models import Workload

    out = StringIO()
    call_command("bench_watch", "--pods", "24", "--passes", "2", "--workers", "4", stdout=out)
    result = json.loads(out.getvalue())
    assert result["created"] == 24
    # Pods, services and the pods that name GPUPool's scheduler.
    assert (result["poll"]["observed_by"], result["poll"]["requests_per_pass"]) == (["list"], 3)
    assert (result["watch"]["observed_by"], result["watch"]["requests_per_pass"]) == (["watch"], 1)
    assert result["watch"]["bytes_per_pass"] < result["poll"]["bytes_per_pass"] / 10
    assert result["poll"]["changes"] == result["watch"]["changes"] == 0
    assert 0 <= result["watch_reaction_s"] < 5
    assert Cluster.objects.count() == 0 and Workload.objects.count() == 0


def test_bench_watch_refuses_a_pod_count_out_of_bounds(db):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--pods"):
        call_command("bench_watch", "--pods", "0")
