"""Native pods are bound `bind_workers` at a time (KubernetesBackend._bind_into): a Binding
that fails is that pod's error alone, the others are bound with their events, the
database records only what was bound, and the threads never outnumber the setting."""

from __future__ import annotations

import threading
import time

import pytest

from clusters.backends.kubernetes import BIND_WORKERS
from clusters.backends.kubernetes import native as kube_native
from clusters.reconcile import cluster_reconcile
from clusters.stored import cluster_problem
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import (  # noqa: F401 - the fixture
    NS,
    native_workloads,
    pod_body,
    setup,
)

pytestmark = pytest.mark.timeout(60)


def _queued_and_admitted(cluster, core, count: int) -> list[str]:
    """`count` bare 1-GPU pods, queued by a pass and given GPUs by a cycle."""
    names = [f"solo-{index}" for index in range(count)]
    for name in names:
        core.create_namespaced_pod(NS, pod_body(name))
    cluster_reconcile(cluster)
    cycle_run()
    admitted = PodAllocation.objects.filter(workload__spec__has_key="native").count()
    assert admitted == count, admitted
    return names


def _scheduled(fake, name: str) -> int:
    return sum(
        1
        for event in fake.events(NS)
        if event["involvedObject"]["name"] == name and event["reason"] == "Scheduled"
    )


def _recorded(name: str) -> str:
    """The allocation's record of the pod (its uid once bound)."""
    (workload,) = [w for w in native_workloads() if w.name == name]
    return workload.allocations.get().backend_ref


def test_a_failed_binding_among_many_is_that_pods_error_alone(kube, setup, org):  # noqa: F811
    """One pod deleted while the pass binds (404) and one bound meanwhile by another
    scheduler (409, then read back: not ours): each is its pod's error, unbound and not
    recorded; the ten others are bound, each with its PodScheduled condition and one
    Scheduled event. The next pass binds the one whose Binding was lost."""
    fake = kube.require_fake()
    cluster, core = setup
    names = _queued_and_admitted(cluster, core, 12)
    gone, taken = names[3], names[7]
    fake.inject("404", path=f"/api/v1/namespaces/{NS}/pods/{gone}/binding")
    fake.inject("409", path=f"/api/v1/namespaces/{NS}/pods/{taken}/binding")
    result = cluster_reconcile(cluster)
    assert any(f"pod {NS}/{gone} is gone" in e for e in result.errors), result.errors
    assert any(f"pod {NS}/{taken} was bound to" in e for e in result.errors), result.errors
    assert len(result.errors) == 2, result.errors
    for name in names:
        pod = fake.pod(NS, name)
        if name in (gone, taken):
            assert not pod["spec"].get("nodeName")
            assert _scheduled(fake, name) == 0
            assert _recorded(name) == ""
            continue
        assert pod["spec"]["nodeName"] in ("gpu-a", "gpu-b"), name
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions["PodScheduled"] == "True"
        assert _scheduled(fake, name) == 1
        assert _recorded(name) == pod["metadata"]["uid"]
    cluster_reconcile(cluster)  # each fault was one answer: now both are bound
    for name in (gone, taken):
        assert fake.pod(NS, name)["spec"]["nodeName"]
        assert _scheduled(fake, name) == 1
        assert _recorded(name) == fake.pod(NS, name)["metadata"]["uid"]


def _bind_watched(monkeypatch, pause_s: float) -> dict:
    """native.bind, counting how many run at once and on which threads."""
    seen = {"now": 0, "most": 0, "threads": set()}
    lock = threading.Lock()
    bind = kube_native.bind

    def counted(backend, spec):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["threads"].add(threading.current_thread().name)
        try:
            time.sleep(pause_s)  # long enough for every thread to be in flight
            return bind(backend, spec)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(kube_native, "bind", counted)
    return seen


@pytest.mark.parametrize(("setting", "most"), [({"bind_workers": 3}, 3), ({}, BIND_WORKERS)])
def test_bindings_in_flight_never_outnumber_bind_workers(
    kube,  # noqa: F811
    setup,  # noqa: F811
    org,
    monkeypatch,
    setting,
    most,
):
    fake = kube.require_fake()
    cluster, core = setup
    cluster.config.update(setting)
    cluster.save()
    names = _queued_and_admitted(cluster, core, 12)
    seen = _bind_watched(monkeypatch, pause_s=0.2)
    result = cluster_reconcile(cluster)
    assert result.errors == []
    assert seen["most"] == most
    assert len(seen["threads"]) == most
    assert all(name.startswith("bind") for name in seen["threads"])
    assert all(fake.pod(NS, name)["spec"].get("nodeName") for name in names)


def test_an_unreachable_server_while_binding_fails_the_pass_not_one_pod(kube, setup, org):  # noqa: F811
    """What is no pod's own error (the server stopped answering) reaches the pass from the
    threads: the cluster is unreachable, and nothing is recorded as bound."""
    fake = kube.require_fake()
    cluster, core = setup
    cluster.config["retries"] = 1
    cluster.save()
    _queued_and_admitted(cluster, core, 4)
    bind = kube_native.bind

    def down_first(backend, spec):
        fake.down = True  # before any Binding reaches it
        return bind(backend, spec)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kube_native, "bind", down_first)
        result = cluster_reconcile(cluster)
    assert not result.reachable
    assert not any(p["spec"].get("nodeName") for p in fake.pods())
    assert not PodAllocation.objects.exclude(backend_ref="").exists()
    cluster.refresh_from_db()
    assert cluster.last_error


@pytest.mark.parametrize(
    ("value", "problem"),
    [(1, False), (64, False), (0, True), (65, True), (2.5, True), ("8", True), (True, True)],
)
def test_bind_workers_is_a_whole_number_from_1_to_64(value, problem):
    from clusters.models import Backend, Cluster

    cluster = Cluster(name="c", backend=Backend.KUBERNETES, config={"bind_workers": value})
    found = cluster_problem(cluster)
    assert ("bind_workers" in found) is problem, found


def test_a_pod_bound_by_our_binding_reads_as_the_pod_the_server_made():
    """`native.bound` (what a 201 changed) is what reading the bound pod whole gives."""
    pod = pod_body("p")
    pod["metadata"].update(namespace=NS, uid="u-1", annotations={"team": "ml"})
    pod["status"] = {
        "phase": "Pending",
        "nominatedNodeName": "gpu-b",
        "conditions": [{"type": "PodScheduled", "status": "False", "message": "waiting"}],
    }
    listed = kube_native.native_pod(pod)
    assert listed.scheduled_message == "waiting"
    annotations = {kube_native.BOUND_BY: "i.c", kube_native.POD_NAME: "gp-1-0"}
    made = kube_native.bound(listed, "gpu-a", annotations)
    assert made == kube_native.native_pod(kube_native.bound_copy(pod, "gpu-a", annotations))
    assert made.node_name == "gpu-a" and made.scheduled_message == ""
    assert listed.node_name == "" and kube_native.BOUND_BY not in listed.annotations
