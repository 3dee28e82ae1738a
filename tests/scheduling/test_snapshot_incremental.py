"""The cycle's snapshot, read from the rows kept between cycles (scheduling/kept_rows.py),
equals one read from scratch, through random sequences of every kind of write: submits,
edits (save, update, bulk_update), stops, pods going away, the cycle's own admissions,
evictions and pending reasons, reconcile's phase changes, node, GPU, cluster, pool and
quota changes and a project renamed.

Checked to fail when a write path forgets the version: `Versioned.save()` not bumping it
(a transition is missed), `QuerySet.update()` not bumping it, and `column_set` not
writing it (another worker's keep holds a stale pending reason).
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

import scheduling.cycle
from clusters.models import Cluster, Gpu, Node, NodePool
from portal.models import ProjectQuota
from scheduling import adapters, kept_rows
from scheduling.cycle import cycle_run
from scheduling.engine import schedule as rebuilt_schedule
from scheduling.lifecycle import workload_pods_released, workload_transition
from scheduling.models import ACTIVE_STATES, CycleRun, Workload, WorkloadState
from scheduling.services import workload_stop
from tests.scheduling.conftest import make_nodes

pytestmark = pytest.mark.django_db


Keep = tuple[kept_rows.KeptRows, kept_rows.KeptNodes]


def _fields(rows: dict) -> dict:
    return {
        key: {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields}
        for key, row in rows.items()
    }


def _read_with(monkeypatch, keep: Keep) -> adapters.SnapshotRead:
    with monkeypatch.context() as m:
        m.setattr(kept_rows, "KEPT_ROWS", keep[0])
        m.setattr(kept_rows, "KEPT_NODES", keep[1])
        return adapters.read_snapshot()


def assert_same_as_rebuilt(monkeypatch, keep: Keep) -> None:
    """read_snapshot() through the rows kept so far, and through an empty keep."""
    kept = _read_with(monkeypatch, keep)
    fresh = _read_with(monkeypatch, (kept_rows.KeptRows(), kept_rows.KeptNodes()))
    assert kept.snapshot == fresh.snapshot
    assert _fields(kept.workloads) == _fields(fresh.workloads)
    assert _fields(kept.nodes) == _fields(fresh.nodes)
    assert kept.held_elsewhere == fresh.held_elsewhere
    assert kept.held_devices == fresh.held_devices
    assert kept.throttled == fresh.throttled
    assert {k: why for k, (_, why) in kept.unrunnable.items()} == {
        k: why for k, (_, why) in fresh.unrunnable.items()
    }


def _some(rng: random.Random, **filters) -> Workload | None:
    rows = list(Workload.objects.filter(**filters).order_by("pk"))
    return rng.choice(rows) if rows else None


def _submit(rng, org, submit, n):
    owner, project = rng.choice([(org.researcher, org.project_a), (org.outsider, org.project_b)])
    spec = {"gpus": rng.choice([1, 2, 4, 4])}
    if rng.random() < 0.3:
        spec = {"gpus": 0.5, "gpu_request": "fraction"}
    submit(owner, project, f"job-{n}", **spec)


def _stop(rng, *_):
    if wl := _some(rng, state__in=[*ACTIVE_STATES, WorkloadState.PENDING]):
        workload_stop(actor=None, workload=wl, reason="Test", message="stopped")


def _release(rng, *_):
    states = [WorkloadState.STOPPED, WorkloadState.PREEMPTED]
    if wl := _some(rng, state__in=states, allocations__isnull=False):
        workload_pods_released(Workload.objects.get(pk=wl.pk))


def _start(rng, *_):
    if wl := _some(rng, state=WorkloadState.ADMITTED):
        workload_transition(wl, WorkloadState.RUNNING, reason="Started")


def _phase(rng, *_):
    if wl := _some(rng, allocations__isnull=False):
        wl.allocations.update(phase=rng.choice(["Running", "Pending", ""]))


def _edit(rng, *_):
    if wl := _some(rng, state=WorkloadState.PENDING):
        wl.priority = rng.choice([0, 25, 75])
        wl.save(update_fields=["priority"])


def _update(rng, *_):
    if wl := _some(rng):
        Workload.objects.filter(pk=wl.pk).update(preemptible=not wl.preemptible)


def _bulk(rng, *_):
    rows = list(Workload.objects.filter(state=WorkloadState.PENDING).order_by("pk")[:3])
    for wl in rows:
        wl.memory_mib = rng.choice([1024, 2048, 4096])
    Workload.objects.bulk_update(rows, ["memory_mib"])


def _node(rng, *_):
    node = rng.choice(list(Node.objects.order_by("pk")))
    Node.objects.filter(pk=node.pk).update(schedulable=not node.schedulable)


def _gpu(rng, *_):
    gpu = rng.choice(list(Gpu.objects.order_by("pk")))
    gpu.memory_mib = rng.choice([40960, 81920])
    gpu.save()


def _foreign(rng, *_):
    node = rng.choice(list(Node.objects.order_by("pk")))
    node.foreign_gpus, node.foreign_cpu = rng.choice([0, 1, 3, 5]), rng.choice([0, 8, 64])
    node.save(update_fields=["foreign_gpus", "foreign_cpu"])


def _cluster(rng, *_):
    Cluster.objects.update(reachable=rng.random() < 0.7)


def _pool(rng, org, *_):
    NodePool.objects.filter(pk=org.pool.pk).update(mig_repartition=rng.random() < 0.5)


def _quota(rng, org, *_):
    ProjectQuota.objects.filter(project=org.project_b).update(gpus=rng.choice([2, 4, 8]))


def _rename(rng, org, submit, n):
    project = rng.choice([org.project_a, org.project_b])
    project.name = f"{project.name.split('-v')[0]}-v{n}"
    project.save(update_fields=["name"])


# One random write each, as users, the cycle, reconciliation and admins make them.
STEPS = [_submit, _submit, lambda *_: cycle_run(), lambda *_: cycle_run(), _stop, _release]
STEPS += [_start, _phase, _edit, _update, _bulk, _node, _gpu, _foreign, _cluster, _pool, _quota]
STEPS += [_rename]


@pytest.mark.parametrize("seed", [2, 3, 4, 7])
def test_the_kept_snapshot_equals_a_rebuilt_one_through_random_changes(
    org, submit, monkeypatch, seed
):
    make_nodes(org.pool, 2, 4)
    # Each cycle's decisions next to the engine's from scratch on the same snapshot.
    real, same = scheduling.cycle.schedule, []

    def both(snapshot, config, now):
        kept = real(snapshot, config, now)
        same.append(kept == rebuilt_schedule(snapshot, config, now))
        return kept

    monkeypatch.setattr(scheduling.cycle, "schedule", both)
    rng = random.Random(seed)
    kept_rows.KEPT_ROWS.forget()
    # The rows this process's cycles keep, and those of another worker's process, which
    # sees the cycles' writes only through the database.
    other = (kept_rows.KeptRows(), kept_rows.KeptNodes())
    for n in range(60):
        rng.choice(STEPS)(rng, org, submit, n)
        assert_same_as_rebuilt(monkeypatch, (kept_rows.KEPT_ROWS, kept_rows.KEPT_NODES))
        assert_same_as_rebuilt(monkeypatch, other)
    # The sequence did what it is about: the cycles admitted and gave reasons.
    assert same and all(same)
    assert CycleRun.objects.filter(admitted__gt=0).exists()
    assert Workload.objects.exclude(pending_reason="").exists()


def test_a_steady_cycle_reads_no_workload_row_again(org, submit):
    make_nodes(org.pool, 2, 4)
    for i in range(6):
        submit(org.researcher, org.project_a, f"job-{i}", gpus=2)
    kept_rows.KEPT_ROWS.forget()
    cycle_run()  # admits four, leaves two pending with their reasons
    cycle_run()  # reads again what the first one changed
    reads = kept_rows.KEPT_ROWS.reads
    cycle_run()
    assert kept_rows.KEPT_ROWS.reads == reads
    # One change: that row alone is read again.
    Workload.objects.filter(name="job-5").update(priority=7)
    cycle_run()
    assert kept_rows.KEPT_ROWS.reads == reads + 1


def test_a_failed_cycle_forgets_the_kept_rows(org, submit, monkeypatch):
    make_nodes(org.pool, 1, 4)
    submit(org.researcher, org.project_a, "job", gpus=1)
    cycle_run()
    assert kept_rows.KEPT_ROWS.rows

    def broken(*args, **kwargs):
        raise RuntimeError("engine bug")

    monkeypatch.setattr("scheduling.cycle.schedule", broken)
    assert cycle_run().ok is False
    assert not kept_rows.KEPT_ROWS.rows


def test_a_row_changed_while_the_cycle_runs_is_read_again_not_hidden_by_its_reason(
    org, submit, monkeypatch
):
    make_nodes(org.pool, 1, 4)
    submit(org.researcher, org.project_a, "runs", gpus=4)
    waits = submit(org.outsider, org.project_b, "waits", gpus=2)
    kept_rows.KEPT_ROWS.forget()
    kept_rows.KEPT_NODES.forget()
    cycle_run()  # "runs" takes the node; "waits" gets its reason
    cycle_run()
    real = scheduling.cycle.schedule

    def edited_meanwhile(snapshot, config, now):
        # Another writer commits an edit after the cycle read the row, before its
        # reason is written (the reason changes: a node came).
        Workload.objects.filter(pk=waits.pk).update(priority=42)
        return real(snapshot, config, now)

    monkeypatch.setattr(scheduling.cycle, "schedule", edited_meanwhile)
    before = Workload.objects.get(pk=waits.pk).pending_reason
    make_nodes(org.pool, 1, 1)
    cycle_run()
    # The cycle did not write over the edit: the reason waits for the next cycle.
    assert Workload.objects.get(pk=waits.pk).pending_reason == before
    monkeypatch.setattr(scheduling.cycle, "schedule", real)
    reads = kept_rows.KEPT_ROWS.reads
    assert_same_as_rebuilt(monkeypatch, (kept_rows.KEPT_ROWS, kept_rows.KEPT_NODES))
    assert kept_rows.KEPT_ROWS.rows[waits.pk].wl.priority == 42
    assert kept_rows.KEPT_ROWS.reads == reads + 1


def test_a_cycle_does_not_read_again_the_reasons_it_wrote(org, submit):
    make_nodes(org.pool, 1, 4)
    submit(org.researcher, org.project_a, "runs", gpus=4)
    for i in range(3):
        submit(org.outsider, org.project_b, f"waits-{i}", gpus=2)
    cycle_run()
    cycle_run()
    waiting = Workload.objects.filter(name__startswith="waits-")
    before = set(waiting.values_list("pending_reason", flat=True))
    make_nodes(org.pool, 1, 1)  # every reason changes: one GPU more is free
    cycle_run()
    after = set(waiting.values_list("pending_reason", flat=True))
    assert before and after and not before & after
    reads = kept_rows.KEPT_ROWS.reads
    cycle_run()
    assert kept_rows.KEPT_ROWS.reads == reads


def _engine_node(node: Node) -> tuple[list[str | None], float | None, int | None]:
    read = adapters.read_snapshot()
    [made] = [n for n in read.snapshot.nodes if n.id == adapters.engine_node_id(node.pk)]
    return [g.whole_by for g in made.gpus], made.cpu, made.memory_mib


def test_the_kept_snapshot_sees_a_change_of_foreign_use(org, submit):
    """Pods GPUPool did not bind (Node.foreign_*, written by the inventory sync) take the
    highest-index free GPUs, and their CPU and memory, out of the node the cycle sees."""
    [node] = make_nodes(org.pool, 1, 4)
    kept_rows.KEPT_NODES.forget()
    held = submit(org.researcher, org.project_a, "held", gpus=1)
    cycle_run()  # takes GPU 0
    assert _engine_node(node) == ([str(held.pk), None, None, None], 64.0, 512 * 1024)
    node.foreign_gpus, node.foreign_cpu, node.foreign_memory_mib = 2, Decimal("60"), 1024
    node.save(update_fields=["foreign_gpus", "foreign_cpu", "foreign_memory_mib"])
    free = [str(held.pk), None, adapters.FOREIGN_HOLDER, adapters.FOREIGN_HOLDER]
    assert _engine_node(node) == (free, 4.0, 511 * 1024)
    waits = submit(org.researcher, org.project_a, "waits", gpus=1, cpu=8)
    cycle_run()
    waits.refresh_from_db()
    assert waits.state == WorkloadState.PENDING  # a GPU is free, but not 8 of the 4 cores
    # More held by others than is free: the node is full, never below nothing.
    Node.objects.filter(pk=node.pk).update(foreign_gpus=9, foreign_cpu=100)
    everything = [str(held.pk), *[adapters.FOREIGN_HOLDER] * 3]
    assert _engine_node(node) == (everything, 0.0, 511 * 1024)
