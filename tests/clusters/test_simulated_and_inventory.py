"""The simulated backend and inventory sync into Node, Gpu and NodePool rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.backends import NodeInfo, PodPhase
from clusters.backends.simulated import SimulatedBackend, description_parse
from clusters.inventory import inventory_store, inventory_sync
from clusters.models import Backend, Cluster, Gpu, Node, NodePool, SimulatedPod
from clusters.reconcile import cluster_reconcile
from portal.errors import ValidationFailed
from scheduling.cycle import cycle_run
from scheduling.lifecycle import workload_transition
from scheduling.models import WorkloadPolicy, WorkloadState
from scheduling.services import workload_submit
from tests.clusters.conftest import admit, make_cluster, make_workload

DESCRIPTION = """
groups:
  - prefix: a100
    count: 4
    gpus: 8
    gpu_model: NVIDIA A100-SXM4-80GB
    gpu_memory_mib: 81920
    labels: {gpupool.io/node-pool: a100}
    spread: {gpupool.io/rack: [rack-1, rack-2]}
nodes:
  - {name: t4-0, gpus: 2, gpu_model: Tesla T4, gpu_memory_mib: 15360,
     labels: {gpupool.io/node-pool: t4}}
"""


@pytest.fixture
def sim(db):
    return make_cluster(
        "sim",
        Backend.SIMULATED,
        config=description_parse(DESCRIPTION),
        topology_labels=["gpupool.io/rack"],
    )


def test_a_description_must_describe_nodes():
    with pytest.raises(ValidationFailed) as err:
        description_parse("groups: []")
    assert err.value.errors == {"description": ["Describe at least one node."]}
    with pytest.raises(ValidationFailed):
        description_parse("groups: [{prefix: x}]")  # no count
    with pytest.raises(ValidationFailed):
        description_parse("[1, 2")


def test_json_descriptions_are_accepted_too():
    config = description_parse('{"nodes": [{"name": "n0", "gpus": 1}]}')
    assert config == {"nodes": [{"name": "n0", "gpus": 1}]}


def test_inventory_sync_creates_nodes_gpus_pools_and_topology(sim, pool):
    result = inventory_sync(sim)
    assert (result.nodes, result.gpus) == (5, 34)
    assert [n.name for n in Node.objects.filter(cluster=sim)] == [
        "a100-0",
        "a100-1",
        "a100-2",
        "a100-3",
        "t4-0",
    ]
    racks = dict(Node.objects.filter(cluster=sim).values_list("name", "topology"))
    assert racks["a100-0"] == racks["a100-1"] == {"rack": "rack-1"}
    assert racks["a100-2"] == racks["a100-3"] == {"rack": "rack-2"}
    # The admin's pool a100 (made before the cluster) is adopted; t4 is created.
    pool.refresh_from_db()
    assert pool.cluster == sim
    assert Node.objects.get(name="a100-0").pool == pool
    assert NodePool.objects.get(name="t4").cluster == sim
    gpu = Gpu.objects.get(node__name="t4-0", index=1)
    assert (gpu.model, gpu.memory_mib, gpu.uuid) == ("Tesla T4", 15360, "GPU-sim-t4-0-1")
    sim.refresh_from_db()
    assert sim.reachable and sim.last_contact_at is not None


def test_inventory_sync_twice_changes_nothing(sim):
    inventory_sync(sim)
    before = list(Node.objects.values_list("id", "name", "pool_id", "schedulable"))
    gpus = list(Gpu.objects.values_list("id", "node_id", "index"))
    inventory_sync(sim)
    assert list(Node.objects.values_list("id", "name", "pool_id", "schedulable")) == before
    assert list(Gpu.objects.values_list("id", "node_id", "index")) == gpus
    assert NodePool.objects.count() == 2


def test_a_vanished_node_is_kept_but_unschedulable_and_a_cordoned_one_too(sim):
    inventory_sync(sim)
    node = Node.objects.get(name="a100-3")
    nodes = SimulatedBackend(sim).list_inventory()
    kept = [n for n in nodes if n.name != "a100-3"]
    cordoned = NodeInfo(name="t4-0", labels=kept[-1].labels, schedulable=False)
    result = inventory_store(sim, [*kept[:-1], cordoned])
    assert result.vanished == 1
    node.refresh_from_db()
    assert (node.schedulable, node.unschedulable_reason) == (False, "gone from the cluster")
    assert Node.objects.get(name="t4-0").schedulable is False
    assert Node.objects.get(name="t4-0").gpus.count() == 0
    assert Node.objects.get(name="a100-0").schedulable is True
    inventory_sync(sim)  # back in the cluster: schedulable again, with no reason left
    node.refresh_from_db()
    assert (node.schedulable, node.unschedulable_reason) == (True, "")


def test_a_sync_clears_an_unreachable_error_but_keeps_a_reconcile_error(sim):
    Cluster.objects.filter(pk=sim.pk).update(reachable=False, last_error="connection refused")
    inventory_sync(Cluster.objects.get(pk=sim.pk))
    sim.refresh_from_db()
    assert (sim.reachable, sim.last_error) == (True, "")
    # The cluster answers, but the last reconcile could not create a pod: still worth showing.
    Cluster.objects.filter(pk=sim.pk).update(last_error="create gp-1-0: 500 Internal Error")
    inventory_sync(Cluster.objects.get(pk=sim.pk))
    sim.refresh_from_db()
    assert (sim.reachable, sim.last_error) == (True, "create gp-1-0: 500 Internal Error")


def test_two_clusters_with_the_same_pool_label_get_separate_pools(sim):
    other = make_cluster("sim2", Backend.SIMULATED, config=description_parse(DESCRIPTION))
    inventory_sync(sim)
    inventory_sync(other)
    assert sorted(NodePool.objects.values_list("name", "cluster__name")) == [
        ("a100", "sim"),
        ("sim2-a100", "sim2"),
        ("sim2-t4", "sim2"),
        ("t4", "sim"),
    ]


def test_a_simulated_workload_runs_for_its_duration_then_succeeds(sim, org):
    inventory_sync(sim)
    node = Node.objects.get(name="a100-0")
    workload = make_workload(org.project_a, org.researcher, "short", spec={"duration_s": 60})
    admit(workload, node, pods=[{"gpu_indices": [0, 1]}])
    cluster_reconcile(sim)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.RUNNING
    assert SimulatedPod.objects.get().gpu_indices == [0, 1]
    cluster_reconcile(sim)
    assert SimulatedPod.objects.count() == 1  # idempotent: not created twice
    SimulatedPod.objects.update(started_at=timezone.now() - timedelta(seconds=61))
    cluster_reconcile(sim)
    workload.refresh_from_db()
    assert workload.state == WorkloadState.SUCCEEDED
    assert workload.allocations.count() == 0
    assert SimulatedPod.objects.count() == 0


def test_a_stopped_simulated_workload_frees_its_gpus_after_the_stop_delay(sim, org):
    sim.config["stop_delay_s"] = 30
    sim.save()
    inventory_sync(sim)
    workload = make_workload(org.project_a, org.researcher, "forever")
    admit(workload, Node.objects.get(name="a100-1"), pods=[{"gpu_indices": [3]}])
    cluster_reconcile(sim)
    workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")
    cluster_reconcile(sim)
    assert workload.allocations.get().phase == "Terminating"  # GPUs still held
    SimulatedPod.objects.update(deleting_since=timezone.now() - timedelta(seconds=31))
    cluster_reconcile(sim)
    assert workload.allocations.count() == 0


def test_a_simulated_pod_stops_within_its_policy_grace_period_in_virtual_seconds(sim, org):
    """The program takes 30 s to exit; project A's policy kills it after 5, project B's
    pods take the full stop delay, and a grace of 0 removes a pod at once."""
    sim.config["stop_delay_s"] = 30
    sim.save()
    inventory_sync(sim)
    WorkloadPolicy.objects.create(project=org.project_a, termination_grace_s=5)
    WorkloadPolicy.objects.create(project=org.project_a2, termination_grace_s=0)
    quick = make_workload(org.project_a, org.researcher, "quick")
    slow = make_workload(org.project_b, org.outsider, "slow")
    killed = make_workload(org.project_a2, org.researcher, "killed")
    for index, workload in enumerate((quick, slow, killed)):
        admit(workload, Node.objects.get(name="a100-1"), pods=[{"gpu_indices": [index]}])
    cluster_reconcile(sim)
    for workload in (quick, slow, killed):
        workload_transition(workload, WorkloadState.STOPPED, reason="Stopped")
    cluster_reconcile(sim)
    assert killed.allocations.count() == 0
    assert [quick.allocations.get().phase, slow.allocations.get().phase] == ["Terminating"] * 2
    SimulatedPod.objects.update(deleting_since=timezone.now() - timedelta(seconds=6))
    cluster_reconcile(sim)
    assert quick.allocations.count() == 0
    assert slow.allocations.get().phase == "Terminating"
    SimulatedPod.objects.update(deleting_since=timezone.now() - timedelta(seconds=31))
    cluster_reconcile(sim)
    assert slow.allocations.count() == 0


def test_simulated_pods_report_running_until_stopped(sim):
    backend = SimulatedBackend(sim)
    from clusters.backends import PodSpec

    status = backend.ensure_pod(
        PodSpec(name="gp-9-0", namespace="ns", workload_id=9, pod_index=0, node_name="a100-0")
    )
    assert status.phase == PodPhase.RUNNING
    assert backend.delete_pod(status, grace_period_s=30) is True
    assert backend.pod_statuses() == {}


def test_simulated_gpus_report_synthetic_utilization_through_the_metrics_path(sim, org):
    from clusters.metrics.models import GpuSample

    inventory_sync(sim)
    node = Node.objects.get(name="a100-2")
    workload = make_workload(org.project_a, org.researcher, "busy")
    admit(workload, node, pods=[{"gpu_indices": [5]}])
    cluster_reconcile(sim)
    samples = GpuSample.objects.filter(node_id=node.pk)
    assert samples.count() == 8  # every GPU of the node, busy or idle
    busy = samples.get(gpu_index=5)
    assert busy.util_pct >= 55 and busy.workload_id == workload.pk and busy.pod_index == 0
    assert all(s.util_pct == 0 for s in samples.exclude(gpu_index=5))
    total = GpuSample.objects.count()
    cluster_reconcile(sim)  # within the sample interval: no second batch
    assert GpuSample.objects.count() == total == 34


def test_the_demo_seed_makes_a_simulated_and_a_local_cluster_and_is_idempotent(pool):
    from io import StringIO

    from clusters import demo

    out = StringIO()
    demo.seed(out)
    demo.seed(out)
    assert sorted(Cluster.objects.values_list("name", "backend")) == [
        ("local", "local"),
        ("sim", "simulated"),
    ]
    sim_nodes = Node.objects.filter(cluster__name="sim")
    assert sim_nodes.count() == 6 and Gpu.objects.filter(node__in=sim_nodes).count() == 48
    assert {tuple(n.topology.items()) for n in sim_nodes} == {
        (("rack", "rack-1"),),
        (("rack", "rack-2"),),
        (("rack", "rack-3"),),
    }
    pools = dict(sim_nodes.values_list("name", "pool__name"))
    assert pools == {**{f"dgx-{i}": "a100" for i in range(4)}, "hgx-0": "h100", "hgx-1": "h100"}
    mig = Gpu.objects.filter(node__in=sim_nodes, mig_enabled=True)
    assert sorted(mig.values_list("node__name", "index")) == [
        (n, i) for n in ("hgx-0", "hgx-1") for i in (4, 5, 6, 7)
    ]
    assert Node.objects.filter(cluster__name="local", pool__name="local").count() == 1
    assert "Cluster sim (simulated): 6 nodes, 48 GPUs." in out.getvalue()


def test_a_preemption_made_while_the_cluster_was_being_called_is_not_overwritten(sim, org):
    """The cycle preempts a workload between the reconcile's read and its write-back: the
    pod reports Running, yet the workload must stay preempted (and its pod go next pass)."""
    from clusters.backends.simulated import SimulatedBackend as Sim

    inventory_sync(sim)
    workload = make_workload(org.project_a, org.researcher, "raced")
    admit(workload, Node.objects.get(name="a100-0"), pods=[{"gpu_indices": [0]}])

    class Racing(Sim):
        def reconcile(self, desired, **graces):
            report = super().reconcile(desired, **graces)
            fresh = type(workload).objects.get(pk=workload.pk)
            workload_transition(fresh, WorkloadState.PREEMPTED, reason="Reclaim")
            return report

    cluster_reconcile(sim, backend=Racing(sim))
    workload.refresh_from_db()
    assert workload.state == WorkloadState.PREEMPTED
    cluster_reconcile(sim)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (WorkloadState.PENDING, 1)
    assert SimulatedPod.objects.count() == 0


def test_a_simulated_node_going_down_requeues_its_work_and_leaves_the_inventory(sim, org):
    inventory_sync(sim)
    workload = make_workload(org.project_a, org.researcher, "unlucky")
    admit(workload, Node.objects.get(name="a100-3"), pods=[{"gpu_indices": [0]}])
    cluster_reconcile(sim)
    sim.config["down_nodes"] = ["a100-3"]
    sim.save()
    cluster_reconcile(sim)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (WorkloadState.PENDING, 1)
    assert workload.events.get(reason="PodLost").message == "Pods lost on a100-3."
    inventory_sync(sim)
    assert Node.objects.get(name="a100-3").schedulable is False


def test_a_node_removed_from_the_description_takes_its_pods_with_it(sim, org):
    inventory_sync(sim)
    workload = make_workload(org.project_a, org.researcher, "orphaned")
    admit(workload, Node.objects.get(name="t4-0"), pods=[{"gpu_indices": [0]}])
    cluster_reconcile(sim)
    sim.config["nodes"] = []  # an admin edits t4-0 out of the cluster
    sim.save()
    cluster_reconcile(sim)
    workload.refresh_from_db()
    assert (workload.state, workload.restart_count) == (WorkloadState.PENDING, 1)
    assert workload.events.get(reason="PodLost").message == "Pods lost on t4-0."
    assert SimulatedPod.objects.count() == 0


SHARED = """
nodes:
  - {name: shared-0, gpus: 4, labels: {gpupool.io/node-pool: a100},
     foreign: {gpus: 3, cpu: 2.5, memory_mib: 4096, pods: [kube-system/dcgm-exporter-0]}}
"""


def test_a_simulated_node_may_hold_foreign_use_and_the_cycle_leaves_it_alone(org):
    cluster = make_cluster("shared", Backend.SIMULATED, config=description_parse(SHARED))
    inventory_sync(cluster)
    node = Node.objects.get(cluster=cluster)
    assert (node.foreign_gpus, float(node.foreign_cpu), node.foreign_memory_mib) == (3, 2.5, 4096)
    assert node.foreign_pods == {"count": 1, "names": ["kube-system/dcgm-exporter-0"]}
    job = workload_submit(
        actor=org.researcher,
        project=org.project_a,
        kind="training",
        name="two",
        image="pytorch/pytorch:2.3",
        command=["python", "train.py"],
        gpus=2,
    )
    cycle_run()
    job.refresh_from_db()
    assert job.pending_reason == "Needs 2 GPUs in pool a100; 1 is free"
