"""A targeted pass driven by what changed (issue 25): on the simulated cluster it reads
again only the pods and allocation rows of the buckets whose sums moved (a row made,
deleted or written, in band or not) or whose pods' programs ended, and those its last pass
left work in (clusters.reconcile.Compared, clusters.backends.simulated.PodView). It must
reach what a full pass reaches, whatever changed; and its reads follow the change, not the
cluster. Row counts, never wall time."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from clusters import reconcile
from clusters.backends import simulated
from clusters.backends.simulated import SimulatedBackend
from clusters.models import Cluster, SimulatedPod
from clusters.reconcile import reconcile_pass
from portal import versioned
from scheduling.lifecycle import workload_transition
from scheduling.models import PodAllocation, Workload, WorkloadState
from tests.clusters.test_reconcile_targeted import full, run_workloads, settle, sim, targeted

__all__ = ["sim"]  # the fixture, imported for the tests here
S = WorkloadState


def primed(cluster: Cluster) -> None:
    """Settled, then targeted passes until one reads nothing: what this process keeps of
    the cluster now matches it."""
    settle(cluster)
    for _ in range(4):
        result = targeted(cluster)
        if (result.pods_read, result.allocations_read) == (0, 0):
            return
    raise AssertionError("targeted passes kept reading rows with nothing changing")


def snapshot() -> dict:
    """The database's and the simulated cluster's state, without what differs between two
    runs of the same passes (primary keys of pods made, versions, times)."""
    return {
        "workloads": sorted(
            Workload.objects.values_list("pk", "state", "restarting", "restart_count", "exit_code")
        ),
        "allocations": sorted(
            (
                a.workload_id,
                a.pod_index,
                a.node_id,
                a.phase,
                a.endpoint,
                a.releasing,
                bool(a.backend_ref),
            )
            for a in PodAllocation.objects.all()
        ),
        "pods": sorted(
            (
                p.name,
                p.node_name,
                p.deleting_since is not None,
                tuple(p.gpu_indices),
                p.shared_gpu_index,
            )
            for p in SimulatedPod.objects.all()
        ),
    }


class _Undo(Exception):
    pass


def outcome(cluster: Cluster, *, driven: bool) -> tuple[dict, list]:
    """Passes until nothing moves (targeted ones driven by changes, or full ones), the
    state they reach, and each pass's (pods read, allocations read); then undone."""
    reads = []
    try:
        with transaction.atomic():
            for _ in range(4):
                result = targeted(cluster) if driven else full(cluster)
                reads.append((result.pods_read, result.allocations_read))
            reached = snapshot()
            raise _Undo
    except _Undo:
        return reached, reads


ORPHAN = "gp-999999-0"


def orphan_pod(cluster: Cluster) -> None:
    """A pod of no workload, made behind the pass's back."""
    SimulatedPod.objects.create(
        cluster=cluster,
        name=ORPHAN,
        namespace="default",
        workload_id=999999,
        pod_index=0,
        node_name="node-0",
        started_at=timezone.now(),
    )


def change_at_random(rng: random.Random, cluster: Cluster, org, first: int) -> list[str]:
    """A few changes of every kind a pass must notice, some made behind its back."""
    running = list(Workload.objects.filter(state=S.RUNNING).order_by("pk"))
    done = []
    for workload in rng.sample(running, k=min(len(running), rng.randint(1, 4))):
        kind = rng.choice(["pod deleted", "pod finished", "evicted", "stopped", "phase written"])
        pods = SimulatedPod.objects.filter(cluster=cluster, workload_id=workload.pk)
        if kind == "pod deleted":  # out of band: nobody told the database
            pods.filter(pod_index=0).delete()
        elif kind == "pod finished":  # its program ended, the clock says so
            pods.update(duration_s=1, started_at=timezone.now() - timedelta(seconds=2))
        elif kind == "evicted":
            workload_transition(workload, S.PREEMPTED, reason="Reclaim")
        elif kind == "stopped":
            workload_transition(workload, S.STOPPED, reason="Stopped")
        else:  # a phase recorded wrongly behind the pass's back
            workload.allocations.update(phase="Pending")
        done.append(f"{kind} {workload.pk}")
    if rng.random() < 0.5:  # an admission the cycle made
        (new,) = run_workloads(org, 1, first=first)
        done.append(f"admitted {new.pk}")
    if rng.random() < 0.3:  # a pod nobody wants, made behind the pass's back
        orphan_pod(cluster)
        done.append("orphan pod")
    return done


@pytest.mark.parametrize("seed", range(6))
def test_passes_driven_by_changes_reach_what_full_passes_reach(sim, org, seed):
    rng = random.Random(seed)
    run_workloads(org, 10)
    first = 10
    for _ in range(3):  # changes on changes: what each pass kept is used by the next
        primed(sim)
        changes = change_at_random(rng, sim, org, first)
        first += 1
        by_changes, reads = outcome(sim, driven=True)
        by_full, _ = outcome(sim, driven=False)
        assert by_changes == by_full, changes
        # driven by the changes: the first pass did not compare every allocation
        assert reads[0][1] < PodAllocation.objects.count(), (changes, reads)
        for _ in range(4):  # and on, for the next round's changes
            targeted(sim)


def reads_after_one_admission(org, cluster: Cluster, running: int) -> list[tuple[int, int]]:
    run_workloads(org, running)
    primed(cluster)
    run_workloads(org, 1, first=running)  # a two-pod gang: one bucket of its own
    reads = []
    for _ in range(3):
        result = targeted(cluster)
        reads.append((result.pods_read, result.allocations_read))
    return reads


@pytest.mark.parametrize("running", [3, 24])
def test_after_one_admission_a_pass_reads_its_rows_whatever_runs_beside(sim, org, running):
    """(pods, allocations) read by each pass: the admission's two allocations and nothing
    else; then nothing (the pods it made and the phases it wrote are folded into what it
    keeps). The same beside 3 workloads as beside 24."""
    assert reads_after_one_admission(org, sim, running) == [(0, 2), (0, 0), (0, 0)]


def test_after_a_pass_that_admitted_and_released_many_the_next_reads_nothing(sim, org):
    """A pass's own writes (pods made and deleted, phases recorded, states moved, workloads
    released) are folded into what it keeps: the next pass reads no row, and finds nothing
    to do, as a full pass finds."""
    stopping = run_workloads(org, 6)
    primed(sim)
    for workload in stopping[:3]:
        workload_transition(workload, S.STOPPED, reason="Stopped")
    admitted = run_workloads(org, 8, first=6)
    pods = sum(workload.allocations.count() for workload in admitted)
    busy = targeted(sim)
    assert (busy.created, busy.released, busy.allocations_read) == (pods, 3, pods + 4)
    after = targeted(sim)
    assert (after.pods_read, after.allocations_read) == (0, 0)
    assert (after.created, after.deleted, after.transitions) == (0, 0, [])
    check = full(sim)
    assert (check.created, check.deleted, check.transitions) == (0, 0, [])


class Meddles(SimulatedBackend):
    """Another party writes while the pass runs: after the pass compared, before it makes
    its pods (and then records their phases)."""

    def __init__(self, cluster: Cluster, meddle) -> None:
        super().__init__(cluster)
        self.meddle = meddle

    def _create_all_into(self, report, specs):
        self.meddle()
        super()._create_all_into(report, specs)


@pytest.mark.parametrize("kind", ["workload stopped", "pod deleted"])
def test_a_write_by_another_party_while_a_pass_writes_its_bucket_is_seen(
    sim, org, monkeypatch, kind
):
    """Every row in one bucket: the pass writes the bucket another party writes while it
    runs (a user stops a workload; a pod is deleted out of band). What the pass folds is its
    own writes alone: the next pass still sees the other's and acts on it."""
    monkeypatch.setattr(versioned, "BUCKETS", 1)
    # what this process keeps, by the buckets of this test alone (put back after it)
    monkeypatch.setattr(simulated, "_views", {})
    monkeypatch.setattr(reconcile, "_compared", {})
    other, *_ = run_workloads(org, 4)
    primed(sim)
    new = run_workloads(org, 2, first=4)

    def meddle():
        if kind == "workload stopped":
            workload_transition(other, S.STOPPED, reason="Stopped")
        else:
            SimulatedPod.objects.filter(workload_id=other.pk).delete()

    busy = reconcile_pass(sim, Meddles(sim, meddle), full=False)
    assert busy.created == sum(workload.allocations.count() for workload in new)
    assert busy.transitions == [f"{w.pk}:running" for w in new]
    after = targeted(sim)
    if kind == "pod deleted":  # seen lost: requeued
        assert f"{other.pk}:preempted" in after.transitions, after
    assert after.released == 1, after  # its pods gone, its GPUs given back
    assert not SimulatedPod.objects.filter(workload_id=other.pk).exists()


def test_a_write_by_another_party_after_a_pass_is_seen_in_the_buckets_it_wrote(sim, org):
    """After a pass that made pods and recorded phases (and kept them), another party
    deletes one of those pods and writes a phase behind its back: the next pass reads
    those buckets again, and only them, and puts them right."""
    run_workloads(org, 4)
    primed(sim)
    gang, sharer, _ = run_workloads(org, 3, first=6)  # two pods, one pod, one pod
    targeted(sim)
    SimulatedPod.objects.filter(workload_id=gang.pk, pod_index=0).delete()
    sharer.allocations.update(phase="Pending")
    after = targeted(sim)
    assert (after.pods_read, after.allocations_read) == (1, 3)
    assert after.transitions == [f"{gang.pk}:preempted"]
    assert list(sharer.allocations.values_list("phase", flat=True)) == ["Running"]


def test_a_pod_deleted_out_of_band_or_gone_with_its_node_is_noticed(sim, org):
    lost, *_ = run_workloads(org, 10)
    primed(sim)
    allocations = lost.allocations.count()
    SimulatedPod.objects.filter(workload_id=lost.pk).delete()  # nobody told the database
    result = targeted(sim)
    assert f"{lost.pk}:preempted" in result.transitions
    assert (result.pods_read, result.allocations_read) == (0, allocations)
    primed(sim)
    on_node = PodAllocation.objects.filter(node__name="node-2")
    gone, allocations = set(on_node.values_list("workload_id", flat=True)), on_node.count()
    sim.config = {**sim.config, "down_nodes": ["node-2"]}  # its pods vanish with it
    sim.save()
    result = reconcile_pass(sim, SimulatedBackend(sim), full=False)
    assert {f"{w}:preempted" for w in gone} == set(result.transitions)
    assert (result.pods_read, result.allocations_read) == (0, allocations)


def test_a_pod_whose_program_ends_is_noticed_with_no_row_written(sim, org, monkeypatch):
    """Its phase moves with the clock alone: no sum moves, the pass must still see it."""
    (short,) = run_workloads(org, 1)
    short.spec = {**short.spec, "duration_s": 60}
    short.save()
    run_workloads(org, 4, first=1)
    primed(sim)
    now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: now() + timedelta(seconds=61))
    result = targeted(sim)
    short.refresh_from_db()
    assert short.state == S.SUCCEEDED, result
    assert result.pods_read == 2  # its bucket's two pods, read again


class Refuses(SimulatedBackend):
    """The cluster refuses every pod made or deleted this pass (an admission webhook, an
    API server timing out): nothing is written, no row moves."""

    def _create_all_into(self, report, specs):
        report.errors += [f"create {spec.name}: refused" for spec in specs]

    def _delete_all_into(self, report, doomed):
        report.errors += [f"delete {status.name}: refused" for status, _ in doomed]


def test_work_a_pass_could_not_do_is_compared_again_though_no_row_moved(sim, org):
    run_workloads(org, 4)
    primed(sim)
    (new,) = run_workloads(org, 1, first=4)  # one half-GPU sharer
    orphan_pod(sim)
    refused = reconcile_pass(sim, Refuses(sim), full=False)
    assert (refused.created, refused.deleted, len(refused.errors)) == (0, 0, 2)
    result = targeted(sim)
    assert (result.created, result.deleted, result.allocations_read) == (1, 1, 1)
    new.refresh_from_db()
    assert new.state == S.RUNNING
    assert not SimulatedPod.objects.filter(name=ORPHAN).exists()


def test_pods_a_second_pass_among_some_workloads_saw_move_are_compared_by_the_next(sim, org):
    """A pass among some workloads only (cluster_reconcile's second) reads every moved
    pod's bucket but compares only those workloads: the others' moved pods wait for the
    next pass, which must still compare them."""
    lost, other, *_ = run_workloads(org, 4)
    primed(sim)
    SimulatedPod.objects.filter(workload_id=lost.pk).delete()  # out of band
    among = reconcile_pass(sim, SimulatedBackend(sim), full=False, only={other.pk})
    assert among.transitions == [] and among.pods_read == 0
    result = targeted(sim)
    assert f"{lost.pk}:preempted" in result.transitions
