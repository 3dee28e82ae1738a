"""Reconcile passes that pay for what changed (issue 25): a targeted pass compares the
observed pods with one read of the allocations and acts only on the workloads that need
work; the full pass, the rare safety net, rebuilds every spec. Statement counts, never
wall time: the pass's cost is what it asks the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.backends import BackendUnreachable
from clusters.backends.simulated import SimulatedBackend, description_parse
from clusters.inventory import inventory_sync
from clusters.models import Backend, Gpu, Node, SimulatedPod
from clusters.reconcile import cluster_reconcile, reconcile_pass
from scheduling.lifecycle import workload_transition
from scheduling.models import PodAllocation, WorkloadState
from tests.clusters.conftest import admit, make_cluster, make_workload

S = WorkloadState
DESCRIPTION = """
groups:
  - {prefix: node, count: 8, gpus: 8, labels: {gpupool.io/node-pool: a100}}
"""


@pytest.fixture
def sim(db):
    cluster = make_cluster("sim", Backend.SIMULATED, config=description_parse(DESCRIPTION))
    inventory_sync(cluster)
    return cluster


def targeted(cluster):
    return reconcile_pass(cluster, SimulatedBackend(cluster), full=False)


def full(cluster):
    return reconcile_pass(cluster, SimulatedBackend(cluster), full=True)


def run_workloads(org, count: int, *, first: int = 0) -> list:
    """`count` running workloads of every shape the specs tell apart: two-pod gangs on
    whole GPUs, half-GPU sharers (MPS limits), workloads with a checkpoint folder and SSH."""
    workloads = []
    for n in range(first, first + count):
        node = Node.objects.get(name=f"node-{n // 4}")
        index = n % 4 * 2
        if n % 3 == 0:
            pods = [{"gpu_indices": [index]}, {"gpu_indices": [index + 1]}]
            spec = {}
        elif n % 3 == 1:
            pods = [{"shared_gpu_index": index, "gpu_share": 0.5}]
            spec = {"ssh": True}
        else:
            pods = [{"gpu_indices": [index, index + 1]}]
            spec = {"ports": [{"name": "web", "port": 8080}]}
        workload = make_workload(
            org.project_a,
            org.researcher,
            f"w{n}",
            spec=spec,
            pods=len(pods),
            checkpoint_dir=f"/ckpt/w{n}" if n % 2 else "",
        )
        workloads.append(admit(workload, node, pods=pods))
    return workloads


def settle(cluster) -> None:
    """Full passes until nothing moves: every pod created, every workload Running."""
    for _ in range(3):
        full(cluster)


def idle_statements(cluster) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        result = targeted(cluster)
    assert (result.created, result.deleted, result.transitions) == (0, 0, [])
    return [query["sql"] for query in queries.captured_queries]


def viewed(cluster) -> None:
    """A targeted pass on the empty cluster: this process's view of its pods exists from
    here, and every pass after folds what it writes into it (as a worker's view, built by
    its first pass): the passes measured then differ by what they find alone."""
    targeted(cluster)


def test_an_idle_targeted_pass_issues_as_many_statements_for_24_workloads_as_for_3(sim, org):
    viewed(sim)
    run_workloads(org, 3)
    settle(sim)
    few = idle_statements(sim)
    run_workloads(org, 21, first=3)
    settle(sim)
    assert PodAllocation.objects.count() == 32 and SimulatedPod.objects.count() == 32
    assert set(PodAllocation.objects.values_list("workload__state", flat=True)) == {S.RUNNING}
    many = idle_statements(sim)
    assert len(many) == len(few)
    # nothing to do: no workload is locked or loaded, no spec built (the index joins them)
    assert not [sql for sql in many if 'FROM "scheduling_workload"' in sql]


def test_a_targeted_pass_creates_the_pods_of_a_new_admission_and_nothing_else(sim, org):
    run_workloads(org, 6)
    settle(sim)
    before = dict(SimulatedPod.objects.values_list("name", "pk"))
    (new,) = run_workloads(org, 1, first=6)  # a two-pod gang
    result = targeted(sim)
    assert result.created == 2 and result.deleted == 0 and not result.full
    after = dict(SimulatedPod.objects.values_list("name", "pk"))
    made = {f"gp-{new.pk}-0", f"gp-{new.pk}-1"}
    assert after == {**before, **{name: after[name] for name in made}}
    new.refresh_from_db()
    assert new.state == S.RUNNING


def test_after_a_cycle_a_targeted_pass_costs_the_same_statements_beside_3_or_24_workloads(sim, org):
    """Its work follows the pods it creates, not the pods that run: two admissions (three
    pods) cost as many statements beside 3 running workloads as beside 24."""

    def admissions_statements(first: int) -> int:
        run_workloads(org, 2, first=first)
        with CaptureQueriesContext(connection) as queries:
            result = targeted(sim)
        assert result.created == 3 and result.deleted == 0
        return len(queries)

    viewed(sim)
    run_workloads(org, 3)
    settle(sim)
    few = admissions_statements(3)
    run_workloads(org, 24 - 5, first=5)
    settle(sim)
    assert admissions_statements(24) == few


def test_victims_released_and_admissions_started_cost_the_same_statements_for_2_as_for_8(sim, org):
    """The pass after a cycle releases its victims (allocations, usage intervals, requeue)
    and moves its admissions to Running in batches: 2 victims and 2 admissions cost as
    many statements as 8 and 8 (each was a few statements of its own)."""

    def statements(first: int, count: int, node: str) -> int:
        victims = run_workloads(org, count, first=first)  # of every shape
        settle(sim)
        for victim in victims:
            workload_transition(victim, S.PREEMPTED, reason="Reclaim")
        # one GPU each: a spec's own reads (SSH keys, MPS devices) are not what is counted
        admitted = [
            admit(
                make_workload(org.project_a, org.researcher, f"{node}-{i}"),
                Node.objects.get(name=node),
                pods=[{"gpu_indices": [i]}],
            )
            for i in range(count)
        ]
        with CaptureQueriesContext(connection) as queries:
            result = cluster_reconcile(sim, full=False)
        assert (result.released, len(result.transitions)) == (count, count)
        for victim in victims:
            victim.refresh_from_db()
            assert (victim.state, victim.restart_count) == (S.PENDING, 1)
            assert victim.events.filter(type=S.PENDING, reason="Requeued").count() == 1
            assert not victim.allocations.exists()
        for workload in admitted:
            workload.refresh_from_db()
            assert workload.state == S.RUNNING and workload.started_at is not None
            assert workload.events.filter(type=S.RUNNING, reason="Started").count() == 1
        return len(queries)

    viewed(sim)
    assert statements(0, 2, "node-7") == statements(4, 8, "node-6")
    assert_nothing_left_for_the_full_pass(sim)


def assert_nothing_left_for_the_full_pass(cluster) -> None:
    """What a targeted pass leaves, a full pass finds in order: it changes nothing."""
    rows = list(PodAllocation.objects.order_by("pk").values())
    pods = list(SimulatedPod.objects.order_by("pk").values_list("name", "deleting_since"))
    result = full(cluster)
    assert (result.created, result.deleted, result.transitions, result.released) == (0, 0, [], 0)
    assert list(PodAllocation.objects.order_by("pk").values()) == rows
    assert list(SimulatedPod.objects.order_by("pk").values_list("name", "deleting_since")) == pods


def test_a_targeted_pass_repairs_evictions_stops_lost_pods_and_finished_ones(sim, org):
    evicted, stopped, lost, finished, untouched, *_ = run_workloads(org, 6)
    settle(sim)
    workload_transition(evicted, S.PREEMPTED, reason="Reclaim")
    workload_transition(stopped, S.STOPPED, reason="Stopped")
    SimulatedPod.objects.filter(workload_id=lost.pk).delete()  # out of band: nobody told us
    SimulatedPod.objects.filter(workload_id=finished.pk).update(
        duration_s=60, started_at=timezone.now() - timedelta(seconds=61)
    )
    result = cluster_reconcile(sim, full=False)
    assert not result.full
    for workload in (evicted, stopped, lost, finished, untouched):
        workload.refresh_from_db()
    assert (evicted.state, evicted.restart_count) == (S.PENDING, 1)
    assert (lost.state, lost.restart_count) == (S.PENDING, 1)
    said = f"Pod gp-{lost.pk}-0 was deleted outside GPUPool (kubectl delete, a drain)."
    assert lost.events.get(reason="PodLost").message == said
    assert stopped.state == S.STOPPED and finished.state == S.SUCCEEDED
    assert untouched.state == S.RUNNING
    gone = {evicted.pk, stopped.pk, lost.pk, finished.pk}
    assert not SimulatedPod.objects.filter(workload_id__in=gone).exists()
    assert not PodAllocation.objects.filter(workload_id__in=gone).exists()
    assert_nothing_left_for_the_full_pass(sim)


def test_a_targeted_pass_moves_a_state_its_recorded_phases_call_for(sim, org):
    """The phases recorded already, the state not moved (a transition lost after the
    write-back): the comparison of phases alone would see nothing to do."""
    (done,) = run_workloads(org, 1, first=2)
    settle(sim)
    SimulatedPod.objects.update(duration_s=60, started_at=timezone.now() - timedelta(seconds=61))
    done.allocations.update(phase="Succeeded")
    assert not cluster_reconcile(sim, full=False).full  # and its second pass, at once
    done.refresh_from_db()
    assert done.state == S.SUCCEEDED
    assert not SimulatedPod.objects.exists()


def test_a_targeted_pass_deletes_a_pod_nobody_wants_and_records_a_terminating_one(sim, org):
    sim.config["stop_delay_s"] = 30
    sim.save()
    going, *_ = run_workloads(org, 4)
    settle(sim)
    SimulatedPod.objects.create(
        cluster=sim, name="gp-999999-0", namespace="x", workload_id=999999, pod_index=0,
        node_name="node-0", started_at=timezone.now(),
    )  # fmt: skip
    workload_transition(going, S.STOPPED, reason="Stopped")
    targeted(sim)
    assert SimulatedPod.objects.get(name="gp-999999-0").deleting_since is not None
    assert set(going.allocations.values_list("phase", flat=True)) == {"Terminating"}
    assert_nothing_left_for_the_full_pass(sim)


def test_the_full_pass_repairs_what_the_targeted_pass_does_not_look_at(sim, org):
    """A shared GPU's MPS device, lost from its row out of band (the node agents read it):
    the targeted pass compares pods, not that; the next full pass writes it back."""
    run_workloads(org, 3)
    settle(sim)
    gpu = Gpu.objects.get(node__name="node-0", index=2)  # workload 1's half GPU
    device = gpu.mps_device
    assert device
    Gpu.objects.filter(pk=gpu.pk).update(mps_device="")
    targeted(sim)
    gpu.refresh_from_db()
    assert gpu.mps_device == ""
    full(sim)
    gpu.refresh_from_db()
    assert gpu.mps_device == device


def test_the_full_pass_comes_first_then_once_per_period_and_after_an_unreachable_pass(
    sim, org, settings
):
    settings.GPUPOOL_RECONCILE_FULL_EVERY_S = 600
    run_workloads(org, 2)
    assert [cluster_reconcile(sim).full for _ in range(3)] == [True, False, False]
    settings.GPUPOOL_RECONCILE_FULL_EVERY_S = 0  # every pass full
    assert cluster_reconcile(sim).full

    class Unreachable(SimulatedBackend):
        def pod_statuses(self):
            raise BackendUnreachable("gone")

        pod_changes = pod_statuses  # how a targeted pass observes the simulated cluster

    settings.GPUPOOL_RECONCILE_FULL_EVERY_S = 600
    cluster_reconcile(sim)  # claims the period (it was never claimed at 600 s)
    assert not cluster_reconcile(sim).full
    assert not cluster_reconcile(sim, backend=Unreachable(sim)).reachable
    assert cluster_reconcile(sim).full  # back in reach: the full pass first
    assert not cluster_reconcile(sim).full
