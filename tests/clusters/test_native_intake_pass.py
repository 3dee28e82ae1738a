"""One intake pass queues many groups with what it read once for all (clusters/native.py
`Intake`): names taken, Jobs read in parallel, and each group still gets its own answer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from kubernetes import client as k8s

from clusters.backends.kubernetes import KubernetesBackend
from clusters.native import native_sync
from clusters.reconcile import cluster_reconcile
from portal.models import AuditLog
from scheduling.cycle import cycle_run
from scheduling.models import WorkloadEvent
from scheduling.models import WorkloadState as S
from tests.clusters.kube import kube  # noqa: F401 - the fixture
from tests.clusters.test_kubernetes_native import (  # noqa: F401 - the fixture
    NS,
    job_body,
    native_workloads,
    pod_body,
    setup,
)

pytestmark = pytest.mark.timeout(60)


def test_groups_of_one_name_queued_in_one_pass_get_names_of_their_own(kube, setup, org):  # noqa: F811
    kube.require_fake()
    cluster, core = setup

    k8s.BatchV1Api(core.api_client).create_namespaced_job(NS, job_body("train", 2))
    core.create_namespaced_pod(NS, pod_body("train"))
    core.create_namespaced_pod(NS, pod_body("solo"))
    cluster_reconcile(cluster)
    by_owner = {w.spec["native"]["owner"]["kind"]: w for w in native_workloads()}
    assert set(by_owner) == {"Job", "Pod"}
    job, pod = by_owner["Job"], by_owner["Pod"]
    assert job.pods == 2  # the Job's parallelism, read for the pass
    names = sorted(w.name for w in native_workloads())
    # The older one keeps the name; the other has a piece of its uid added.
    assert names[0] == "solo" and "train" in names[1:]
    other = job if job.name != "train" else pod
    assert other.name.startswith("train-") and len(other.name) == len("train-") + 6


def _bind_one(kube, setup):  # noqa: F811
    """A pod queued and given GPUs; the API requests of the pass that binds it."""
    fake = kube.require_fake()
    cluster, core = setup
    core.create_namespaced_pod(NS, pod_body("trainer"))
    cluster_reconcile(cluster)
    cycle_run()
    fake.requests.clear()
    cluster_reconcile(cluster)
    (workload,) = native_workloads()
    pod = fake.pod(NS, "trainer")
    assert workload.allocations.get().node.name == pod["spec"]["nodeName"]
    assert workload.state in (S.ADMITTED, S.RUNNING)
    reasons = [e["reason"] for e in fake.events(NS) if e["involvedObject"]["name"] == "trainer"]
    assert reasons.count("Scheduled") == 1  # one event, as kube-scheduler writes
    assert ("POST", f"/api/v1/namespaces/{NS}/pods/trainer/binding") in fake.requests
    return fake, cluster, pod


def test_without_a_watch_a_pod_bound_by_our_binding_is_read_back_once(kube, setup, org):  # noqa: F811
    """201 to our Binding, no watch in this process: the pod is read back once, as its new
    version is what the next pass's watch (in another process) must have seen: a
    Binding's answer carries none."""
    fake, cluster, pod = _bind_one(kube, setup)
    assert fake.requests.count(("GET", f"/api/v1/namespaces/{NS}/pods/trainer")) == 1
    cluster.refresh_from_db()
    assert int(cluster.watch_state["native"]) >= int(pod["metadata"]["resourceVersion"])


def test_with_a_watch_the_pass_waits_for_it_to_show_the_binding_instead(kube, setup, org):  # noqa: F811
    """With this process's watch running, the pass reads nothing back: it ends once the
    watch shows the pod on its node, and what it requires of the next pass's watch is
    at least the binding's version."""
    cluster, _ = setup
    cluster.config["watch"] = True
    cluster.save()
    fake, cluster, pod = _bind_one(kube, setup)
    assert ("GET", f"/api/v1/namespaces/{NS}/pods/trainer") not in fake.requests
    cluster.refresh_from_db()
    assert int(cluster.watch_state["native"]) >= int(pod["metadata"]["resourceVersion"])


def _intake_statements(cluster, make) -> tuple[int, int]:
    """SQL statements of one intake pass after `make()` created its pods; workloads it
    queued."""
    before = len(native_workloads())
    make()
    with CaptureQueriesContext(connection) as queries:
        errors = native_sync(cluster, KubernetesBackend(cluster))
    assert errors == []
    return len(queries), len(native_workloads()) - before


def test_an_intake_pass_costs_statements_that_do_not_grow_with_its_groups(kube, setup, org):  # noqa: F811
    """The workloads of one pass, their first events and their audit rows are written
    together: 20 groups (bare pods and Jobs of two) cost what 2 do, give or take a few
    statements, not a few per workload."""
    fake = kube.require_fake()  # its Job controller makes the Jobs' pods before the pass
    cluster, core = setup
    batch = k8s.BatchV1Api(core.api_client)

    def groups(prefix: str, count: int):
        def make():
            for index in range(count):
                if index % 2:
                    batch.create_namespaced_job(NS, job_body(f"{prefix}-job-{index}", 2))
                else:
                    core.create_namespaced_pod(NS, pod_body(f"{prefix}-pod-{index}"))
            fake.run_controllers()

        return make

    few, queued_few = _intake_statements(cluster, groups("few", 2))
    many, queued_many = _intake_statements(cluster, groups("many", 20))
    assert (queued_few, queued_many) == (2, 20)
    assert many <= few + 6, (few, many)
    events = WorkloadEvent.objects.filter(workload__name__startswith="many-", reason="Submitted")
    assert events.count() == 20
    audits = AuditLog.objects.filter(action="workload.submit", object_repr__contains="many-")
    assert audits.count() == 20
    assert len({w.version for w in native_workloads()}) == 22  # each row its own stamp
