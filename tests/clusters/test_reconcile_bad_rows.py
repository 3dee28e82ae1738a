"""One workload whose stored row no pod can be made of fails alone (issue 27, bad rows).

Values another database writer could leave (`env` a JSON list, `spec.ports` a text, a port
with no number) are written straight into the row beside a good workload; a real pass, on
the simulated backend and on the Kubernetes API server, makes the good one's pod and fails
the bad one saying which field is wrong, instead of stopping the whole cluster's pass."""

from __future__ import annotations

import pytest
from django.db import connection

from clusters.backends.kubernetes import KubernetesBackend
from clusters.backends.simulated import SimulatedBackend
from clusters.models import Node, SimulatedPod
from clusters.reconcile import reconcile_pass
from scheduling.models import PodAllocation, Workload, WorkloadEvent, WorkloadState
from tests.clusters.conftest import admit, make_workload
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture
from tests.clusters.test_reconcile_targeted import sim  # noqa: F401 - the fixture
from tests.planted import plant_text

BAD = {
    "env-list": ({"env": ["A=1"]}, "env is a list, not an object"),
    "ports-text": ({"spec": {"ports": "8080"}}, "spec.ports is a text, not a list"),
    "port-no-number": ({"spec": {"ports": [{"name": "web"}]}}, "spec.ports[0] has no port"),
    "command-number": ({"command": 7}, "command is a number, not a list"),
}


def good_and_bad(org, node, planted: dict) -> tuple[Workload, Workload]:
    """Two admitted workloads; the second's row then rewritten behind the ORM's back."""
    good = make_workload(org.project_a, org.researcher, "good", command=["python", "t.py"])
    bad = make_workload(org.project_a, org.researcher, "bad", command=["python", "t.py"])
    admit(good, node, pods=[{"gpu_indices": [0]}])
    admit(bad, node, pods=[{"gpu_indices": [1]}, {"gpu_indices": [2]}])
    Workload.objects.filter(pk=bad.pk).update(**planted)
    return good, bad


def assert_failed_alone(good: Workload, bad: Workload, field: str) -> None:
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.state in (WorkloadState.ADMITTED, WorkloadState.RUNNING)
    assert bad.state == WorkloadState.FAILED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert event.message.startswith("The pod cannot run") and field in event.message, event.message


@pytest.mark.parametrize("full", [True, False], ids=["full", "targeted"])
@pytest.mark.parametrize("case", BAD)
def test_a_bad_row_fails_alone_on_the_simulated_backend(sim, org, case, full):  # noqa: F811
    planted, field = BAD[case]
    good, bad = good_and_bad(org, Node.objects.get(name="node-0"), planted)

    result = reconcile_pass(sim, SimulatedBackend(sim), full=full)

    assert result.reachable and result.errors == [], result.errors
    assert result.created == 1
    pods = set(SimulatedPod.objects.values_list("workload_id", flat=True))
    assert pods == {good.pk}
    assert_failed_alone(good, bad, field)
    # Failed, it is asked for no pod again; its GPUs are given back by the next pass.
    again = reconcile_pass(sim, SimulatedBackend(sim), full=True)
    assert again.errors == [] and again.released == 1


def test_a_running_workload_whose_row_goes_bad_loses_only_its_own_pods(sim, org):  # noqa: F811
    good, bad = good_and_bad(org, Node.objects.get(name="node-0"), {})
    reconcile_pass(sim, SimulatedBackend(sim), full=True)
    assert SimulatedPod.objects.count() == 3
    Workload.objects.filter(pk=bad.pk).update(env=["A=1"])

    reconcile_pass(sim, SimulatedBackend(sim), full=True)

    assert set(SimulatedPod.objects.values_list("workload_id", flat=True)) == {good.pk}
    assert_failed_alone(good, bad, "env is a list")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["env-list", "ports-text"])
def test_a_bad_row_fails_alone_on_kubernetes(kube, org, case):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    planted, field = BAD[case]
    good, bad = good_and_bad(org, kube.nodes(cluster)[0], planted)

    result = reconcile_pass(cluster, KubernetesBackend(cluster), full=True)

    assert result.reachable and result.errors == [], result.errors
    names = {p["metadata"]["name"] for p in fake.pods()}
    assert k8s_name(cluster, f"gp-{good.pk}-0") in names
    assert not {k8s_name(cluster, f"gp-{bad.pk}-{i}") for i in (0, 1)} & names
    assert_failed_alone(good, bad, field)


# An allocation's own columns: a text SQLite holds in a number (loaded as its stand-in,
# portal.tolerant), GPU indices that are no list of indices, port addresses of the wrong shape.
BAD_ALLOCATION = {
    "pod_index-text": ({"pod_index": "abc"}, "pod_index is not a number"),
    "gpu_share-text": ({"gpu_share": "abc"}, "gpu_share is not a number"),
    "gpu_indices-texts": ({"gpu_indices": '["x"]'}, "gpu_indices is not a list of GPU indices"),
    "gpu_indices-object": ({"gpu_indices": '{"a": 1}'}, "gpu_indices is not a list of GPU"),
    # Where each port answers, as a backend reported it: port name -> address text.
    "ports-list": ({"ports": '["127.0.0.1:8080"]'}, "ports is a list, not an object"),
    "ports-address-number": ({"ports": '{"web": 8080}'}, "ports has an address that is not"),
}


@pytest.mark.parametrize("full", [True, False], ids=["full", "targeted"])
@pytest.mark.parametrize("case", BAD_ALLOCATION)
def test_a_bad_allocation_fails_its_workload_alone(sim, org, case, full):  # noqa: F811
    planted, field = BAD_ALLOCATION[case]
    if ("text" in case or case == "ports-list") and connection.vendor != "sqlite":
        pytest.skip("PostgreSQL refuses it (a text in a number; ports: scheduling 0017's CHECK)")
    good, bad = good_and_bad(org, Node.objects.get(name="node-0"), {})
    plant_text(PodAllocation.objects.filter(workload=bad).first(), **planted)

    result = reconcile_pass(sim, SimulatedBackend(sim), full=full)

    assert result.reachable and result.errors == [], result.errors
    assert set(SimulatedPod.objects.values_list("workload_id", flat=True)) == {good.pk}
    assert_failed_alone(good, bad, field)
    again = reconcile_pass(sim, SimulatedBackend(sim), full=True)  # its GPUs given back
    assert again.errors == [] and again.released == 1, again.errors
    assert not PodAllocation.objects.filter(workload=bad).exists()
