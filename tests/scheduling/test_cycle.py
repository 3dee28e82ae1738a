"""The cycle against the database: snapshot, decisions, reasons, runtime limits, records."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster
from portal.models import DepartmentQuota
from scheduling.cycle import cycle_run
from scheduling.lifecycle import workload_pods_released, workload_transition
from scheduling.models import CycleRun, PodAllocation, Workload, WorkloadState
from scheduling.selectors import workload_why
from tests.scheduling.conftest import make_nodes, outgrown

pytestmark = pytest.mark.django_db
S = WorkloadState


def fresh(wl: Workload) -> Workload:
    wl.refresh_from_db()
    return wl


@pytest.fixture
def tight(org, cluster):
    """Each department deserves half of the 8 GPUs, so borrowing is visible."""
    DepartmentQuota.objects.update(gpus=4)
    return cluster


def held_gpus() -> list[tuple[str, int]]:
    return sorted(
        (a.node.name, int(i))
        for a in PodAllocation.objects.select_related("node")
        for i in a.gpu_indices
    )


def test_an_admission_writes_pod_allocations_and_an_admitted_event(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=2)
    run = cycle_run()
    wl = fresh(wl)
    assert wl.state == S.ADMITTED and wl.pending_reason == ""
    assert list(wl.allocations.values_list("pod_index", "node__name", "gpu_indices")) == [
        (0, "a100-node-0", [0, 1])
    ]
    assert wl.events.last().message == "Placed in pool a100 on a100-node-0."
    assert wl.cluster.name == "sim"  # kept for its logs after the pods are gone
    assert (run.ok, run.admitted, run.evicted, run.workloads, run.nodes) == (True, 1, 0, 1, 2)


def test_a_gang_is_admitted_whole_across_nodes(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "ddp", kind="distributed", workers=2, gpus=4)
    cycle_run()
    assert sorted(fresh(wl).allocations.values_list("node__name", flat=True)) == [
        "a100-node-0",
        "a100-node-1",
    ]


def test_a_workload_that_cannot_fit_keeps_a_readable_pending_reason(org, cluster, submit):
    outgrown(submit, org.researcher, org.project_a, "big", gpus=6)
    cycle_run()
    wl = Workload.objects.get(name="big")
    assert wl.state == S.PENDING
    assert wl.pending_reason == ("Needs 6 GPUs on one node; largest free block in pool a100 is 4")


def test_over_quota_work_is_reclaimed_for_the_owner_once_its_pods_are_gone(org, tight, submit):
    # vision borrows language's idle GPUs: both of its 4-GPU jobs run on 8 GPUs.
    first = submit(org.researcher, org.project_a, "first", gpus=4)
    second = submit(org.researcher, org.project_a, "second", gpus=4)
    cycle_run()
    assert {fresh(first).state, fresh(second).state} == {S.ADMITTED}
    # language's owner asks: one borrowed job is preempted, the owner waits for its pods.
    owner = submit(org.outsider, org.project_b, "owner", gpus=4)
    run = cycle_run()
    victims = [wl for wl in (fresh(first), fresh(second)) if wl.state == S.PREEMPTED]
    assert len(victims) == 1 and run.evicted == 1
    victim = victims[0]
    event = victim.events.last()
    assert (event.type, event.reason) == ("preempted", "Preempted:reclaim")
    # The event names the real cause, the project and the numbers.
    assert event.message == (
        "Reclaimed for project nlp's guaranteed quota: nlp/owner needs 4 GPUs in pool a100; "
        "nlp holds 0 of its deserved 4."
    )
    assert fresh(owner).state == S.PENDING
    assert "being freed by preempted pods" in fresh(owner).pending_reason
    # Reconciliation confirms the pods are gone: the victim requeues, the owner runs.
    workload_pods_released(victim)
    assert (fresh(victim).state, fresh(victim).restart_count) == (S.PENDING, 1)
    cycle_run()
    assert fresh(owner).state == S.ADMITTED
    assert fresh(victim).state == S.PENDING and fresh(victim).pending_reason
    assert len(held_gpus()) == len(set(held_gpus())) == 8


def test_a_requeued_victim_keeps_its_place_ahead_of_work_submitted_after_it(org, tight, submit):
    """As the engine's replay keeps a victim's submit_time: stamped again when its pods
    went, it went behind later work and the next cycle planned a different queue."""
    first = submit(org.researcher, org.project_a, "first", gpus=4)
    second = submit(org.researcher, org.project_a, "second", gpus=4)
    cycle_run()
    submit(org.outsider, org.project_b, "owner", gpus=4)
    cycle_run()
    victim = next(wl for wl in (fresh(first), fresh(second)) if wl.state == S.PREEMPTED)
    queued = victim.queued_at
    later = submit(org.researcher, org.project_a, "later", gpus=4)
    workload_pods_released(victim)
    assert fresh(victim).queued_at == queued < fresh(later).queued_at
    run = cycle_run()
    assert run.pending_order == [victim.pk, later.pk]


def test_no_new_evictions_start_while_preempted_pods_are_still_going_away(org, tight, submit):
    for name in ("a1", "a2"):
        submit(org.researcher, org.project_a, name, gpus=4)
    cycle_run()
    submit(org.outsider, org.project_b, "owner", gpus=4)
    cycle_run()
    # The victim's pods are still there; more cycles must not evict a second victim.
    cycle_run()
    cycle_run()
    states = sorted(Workload.objects.filter(project=org.project_a).values_list("state", flat=True))
    assert states == [S.ADMITTED, S.PREEMPTED]


def test_trials_beyond_a_sweeps_parallelism_wait_with_a_reason(org, cluster, submit):
    sweep = submit(
        org.researcher,
        org.project_a,
        "sweep",
        kind="hpo",
        gpus=1,
        search={"method": "grid", "parameters": {"lr": [1, 2, 3]}, "parallelism": 2},
    )
    cycle_run()
    trials = list(sweep.children.order_by("pk"))
    assert [t.state for t in trials] == [S.ADMITTED, S.ADMITTED, S.PENDING]
    assert trials[2].pending_reason == "Sweep sweep runs at most 2 trials at once"
    assert fresh(sweep).state == S.RUNNING
    for trial in trials[:2]:
        workload_transition(trial, S.SUCCEEDED, reason="Completed")
        workload_pods_released(trial)
    cycle_run()
    assert fresh(trials[2]).state == S.ADMITTED
    workload_transition(fresh(trials[2]), S.FAILED, reason="Error")
    cycle_run()
    sweep = fresh(sweep)
    assert sweep.state == S.SUCCEEDED
    assert sweep.events.last().message == "2 of 3 trials succeeded."


def test_a_started_sweep_no_longer_says_what_it_waited_for(org, cluster, submit):
    """An admitted or running workload's `pending_reason` is what its pods wait for (the
    reconcile's: clusters.reconcile._record_waits), shown as its why: a sweep leaves the
    queue's reason behind when its trials start."""
    sweep = submit(org.researcher, org.project_a, "sweep", kind="hpo", gpus=1,
                   search={"method": "grid", "parameters": {"lr": [1]}})  # fmt: skip
    Workload.objects.filter(pk=sweep.pk).update(pending_reason="Waiting for its trials")
    assert workload_why(fresh(sweep)) == "Waiting for its trials"
    cycle_run()
    sweep = fresh(sweep)
    assert sweep.state == S.RUNNING
    assert (sweep.pending_reason, workload_why(sweep)) == ("", "")


def test_a_stopped_trial_holds_its_sweeps_slot_until_its_pods_are_gone(org, cluster, submit):
    sweep = submit(
        org.researcher,
        org.project_a,
        "sweep",
        kind="hpo",
        gpus=1,
        search={"method": "grid", "parameters": {"lr": [1, 2]}, "parallelism": 1},
    )
    cycle_run()
    first, second = sweep.children.order_by("pk")
    workload_transition(fresh(first), S.STOPPED, reason="Stopped")
    cycle_run()
    # Its pod is still terminating: the next trial would make two at once.
    assert fresh(second).state == S.PENDING
    workload_pods_released(fresh(first))
    cycle_run()
    assert fresh(second).state == S.ADMITTED


def test_a_workload_past_its_max_runtime_is_stopped_with_the_reason(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, max_runtime_s=60)
    cycle_run()
    assert fresh(wl).state == S.ADMITTED
    cycle_run(now=timezone.now() + timedelta(seconds=30))
    assert fresh(wl).state == S.ADMITTED
    run = cycle_run(now=timezone.now() + timedelta(seconds=61))
    wl = fresh(wl)
    assert (wl.state, run.stopped) == (S.STOPPED, 1)
    event = wl.events.last()
    assert (event.reason, event.message) == (
        "MaxRuntimeExceeded",
        "Stopped after its maximum runtime of 60 s.",
    )
    # Its GPU stays held until reconciliation confirms the pod is gone.
    assert wl.allocations.count() == 1


def test_a_sweeps_max_runtime_limits_each_trial_not_the_whole_sweep(org, cluster, submit):
    sweep = submit(org.researcher, org.project_a, "sweep", kind="hpo", gpus=1, max_runtime_s=60,
                   search={"method": "grid", "parameters": {"lr": [1]}})  # fmt: skip
    cycle_run()
    [trial] = sweep.children.all()
    assert (fresh(sweep).state, fresh(trial).state, trial.max_runtime_s) == (
        S.RUNNING,
        S.ADMITTED,
        60,
    )
    # The sweep has been going for longer than one trial may run (earlier trials).
    long_ago = timezone.now() - timedelta(seconds=600)
    Workload.objects.filter(pk=sweep.pk).update(admitted_at=long_ago, started_at=long_ago)
    run = cycle_run()
    assert (fresh(sweep).state, fresh(trial).state, run.stopped) == (S.RUNNING, S.ADMITTED, 0)
    run = cycle_run(now=timezone.now() + timedelta(seconds=61))
    assert (fresh(trial).state, run.stopped) == (S.STOPPED, 1)
    assert fresh(trial).events.last().reason == "MaxRuntimeExceeded"


def test_a_requeued_workloads_max_runtime_counts_from_its_new_start(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, max_runtime_s=60)
    cycle_run()
    workload_transition(fresh(wl), S.RUNNING, reason="Started")
    workload_transition(fresh(wl), S.PREEMPTED, reason="Preempted:reclaim")
    workload_pods_released(fresh(wl))
    wl = fresh(wl)
    assert (wl.state, wl.restart_count, wl.started_at, wl.admitted_at) == (S.PENDING, 1, None, None)
    # Admitted again two minutes later; its pods are still starting (image pull).
    later = timezone.now() + timedelta(seconds=120)
    cycle_run(now=later)
    assert fresh(wl).state == S.ADMITTED
    Workload.objects.filter(pk=wl.pk).update(admitted_at=later)
    run = cycle_run(now=later + timedelta(seconds=30))
    assert (fresh(wl).state, run.stopped) == (S.ADMITTED, 0)
    run = cycle_run(now=later + timedelta(seconds=61))
    assert (fresh(wl).state, run.stopped) == (S.STOPPED, 1)


def test_the_cycle_keeps_fair_shares_for_the_queue_page(org, cluster, submit):
    submit(org.researcher, org.project_a, "job", gpus=4)
    run = cycle_run()
    row = next(s for s in run.shares if (s["name"], s["resource"]) == ("ml-vision", "gpu"))
    assert (row["pool"], row["allocated"]) == ("a100", 4.0)
    assert row["fair_share"] >= 4.0


def test_a_failing_cycle_is_recorded_with_its_error_and_changes_nothing(
    org, cluster, submit, monkeypatch
):
    wl = submit(org.researcher, org.project_a, "job", gpus=1)

    def broken(*args, **kwargs):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr("scheduling.cycle.schedule", broken)
    run = cycle_run()
    assert run.ok is False and "engine exploded" in run.error
    assert CycleRun.objects.get(pk=run.pk).ok is False
    assert fresh(wl).state == S.PENDING


def test_the_cycle_reads_the_database_in_a_fixed_number_of_queries(
    org, submit, django_assert_max_num_queries
):
    make_nodes(org.pool, 20, 8)
    for i in range(30):
        submit(org.researcher, org.project_a, f"job-{i}", gpus=1)
    cycle_run()  # admits all 30: the next cycle sees 30 running workloads
    # 30 more that fit on no node: the cycle only reads, decides and saves reasons.
    for i in range(30):
        outgrown(submit, org.researcher, org.project_a, f"wait-{i}", gpus=16)
    # 29: the versions of every workload, allocation, GPU and MIG instance, and the
    # clusters and pools, since rows are kept between cycles (three more than before), and
    # one query asking for nominations to admit (scheduling/nominations.py).
    with django_assert_max_num_queries(29):
        run = cycle_run()
    assert (run.workloads, run.admitted, run.pending) == (60, 0, 30)


def test_pods_stuck_on_an_unreachable_cluster_do_not_hold_back_reclaim(org, tight, submit):
    # A stopped job whose pod sits on another cluster, not yet confirmed gone.
    far = make_nodes(org.pool, 1, 4, cluster_name="far")[0]
    stuck = submit(org.dept_admin, org.project_a2, "stuck", gpus=4)
    workload_transition(stuck, S.STOPPED, reason="StoppedByUser")
    PodAllocation.objects.create(workload=stuck, pod_index=0, node=far, gpu_indices=[0, 1, 2, 3])
    for name in ("a1", "a2"):
        submit(org.researcher, org.project_a, name, gpus=4)
    cycle_run()
    submit(org.outsider, org.project_b, "owner", gpus=4)
    # While that cluster answers, its pod is on its way out: no eviction starts meanwhile.
    cycle_run()
    states = Workload.objects.filter(name__in=["a1", "a2"]).values_list("state", flat=True)
    assert sorted(states) == [S.ADMITTED, S.ADMITTED]
    # Once it stops answering, the pod may never be confirmed: reclaim goes ahead.
    Cluster.objects.filter(name="far").update(reachable=False)
    cycle_run()
    states = Workload.objects.filter(name__in=["a1", "a2"]).values_list("state", flat=True)
    assert sorted(states) == [S.ADMITTED, S.PREEMPTED]


def _reclaim_cycle_statements(org, submit, victims: int) -> tuple[int, int]:
    """vision borrows all 8 GPUs with one-GPU jobs; language's owner asks for `victims`
    GPUs: the cycle's evictions and its statements."""
    Workload.objects.all().delete()
    for i in range(8):
        submit(org.researcher, org.project_a, f"borrow-{victims}-{i}", gpus=1)
    cycle_run()
    submit(org.outsider, org.project_b, f"owner-{victims}", gpus=victims)
    with CaptureQueriesContext(connection) as queries:
        run = cycle_run()
    return run.evicted, len(queries)


def test_a_cycle_writes_its_evictions_in_statements_that_do_not_grow_with_their_count(
    org, tight, submit
):
    one, few = (_reclaim_cycle_statements(org, submit, n) for n in (1, 4))
    assert (one[0], few[0]) == (1, 4)
    assert one[1] == few[1]
