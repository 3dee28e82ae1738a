"""The work a reclaim was for starts at the reconcile that sees its victims gone (issue 25).

A cycle evicts the victims and nominates the work on their GPUs (scheduling/nominations.py).
The reconcile that confirms their pods gone releases the GPUs and, in the same
transaction, admits the nomination there (scheduling.lifecycle.nominated_admit) and makes
its pods in a second pass: one cycle and one reconcile from submit to pod, where the
admission used to wait for the next cycle (a whole cycle's CPU at 1,000 nodes). On
PostgreSQL a reconcile never waits for the nodes' lock a cycle holds: it leaves the
nomination to the cycle.
"""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster, Node, NodePool, SimulatedPod
from clusters.reconcile import cluster_reconcile
from portal.models import DepartmentQuota
from scheduling.cycle import run_locked
from scheduling.models import CycleRun, Workload, WorkloadState

pytestmark = pytest.mark.django_db(transaction=True)
S = WorkloadState


@pytest.fixture(autouse=True)
def _no_tasks(monkeypatch):
    """The test drives every cycle and reconcile itself."""
    from clusters.tasks import reconcile_cluster
    from scheduling.tasks import run_cycle

    for task in (run_cycle, reconcile_cluster):
        monkeypatch.setattr(task, "delay", lambda *args, **kwargs: None)
        monkeypatch.setattr(task, "apply_async", lambda *args, **kwargs: None)


@pytest.fixture
def reclaimed(org, submit):
    """One simulated node of 8 GPUs; ml-vision runs 8 one-GPU jobs, 4 of them over its
    quota; nlp's 2-GPU job arrives within its quota: the cycle evicts 2 and nominates it."""
    cluster = Cluster.objects.create(
        name="sim", backend=Backend.SIMULATED, node_pool_label="gpupool.io/node-pool",
        config={"groups": [{"prefix": "n", "count": 1, "gpus": 8,
                            "labels": {"gpupool.io/node-pool": "a100"}}]},
    )  # fmt: skip
    inventory_sync(cluster)
    assert NodePool.objects.get(name="a100").nodes.count() == 1
    DepartmentQuota.objects.update(gpus=4)
    for i in range(8):
        submit(org.researcher, org.project_a, f"v{i}", gpus=1)
    run_locked(timezone.now())
    cluster_reconcile(cluster)
    owner = submit(org.outsider, org.project_b, "owner", gpus=2)
    run_locked(timezone.now())
    owner.refresh_from_db()
    assert owner.state == S.PENDING and owner.nominated
    assert Workload.objects.filter(state=S.PREEMPTED).count() == 2
    return cluster, owner


def test_the_reconcile_that_frees_the_gpus_admits_the_work_and_makes_its_pods(reclaimed):
    cluster, owner = reclaimed
    wanted = {(int(p["node_id"]), tuple(p["gpus"])) for p in owner.nominated["pods"]}
    cycles = CycleRun.objects.count()
    result = cluster_reconcile(cluster)
    owner.refresh_from_db()
    assert CycleRun.objects.count() == cycles  # no cycle ran in between
    assert owner.state in (S.ADMITTED, S.RUNNING) and owner.nominated is None
    assert {(a.node_id, tuple(a.gpu_indices)) for a in owner.allocations.all()} == wanted
    pods = SimulatedPod.objects.filter(cluster=cluster, workload_id=owner.pk)
    assert pods.count() == 1 and result.released == 2
    # The victims went back to the queue; nothing holds a GPU twice.
    assert Workload.objects.filter(state=S.PENDING).count() == 2
    held = [i for pod in SimulatedPod.objects.all() for i in pod.gpu_indices]
    assert len(held) == len(set(held)) == 8
    # The next cycle finds the work running: it evicts and admits nothing more.
    run = run_locked(timezone.now())
    assert (run.admitted, run.evicted) == (0, 0)


# The targeted pass's one read of every allocation (clusters.reconcile._INDEX), whatever
# the database (SQLite's reads name each column again, as it guards their types).
INDEX_READ = re.compile(r'^SELECT "scheduling_podallocation"\."workload_id"( AS "\w+")?, ')
ONLY = re.compile(r'"scheduling_podallocation"\."workload_id" IN \(([^)]*)\)')
# A pass's read of the rows it wrote, by primary key, as it keeps them for the next
# (clusters.reconcile._fold_own_writes): not a comparison.
OWN = re.compile(r'"scheduling_podallocation"\."id" IN \(')


def test_the_second_pass_reads_only_the_workloads_the_first_acted_on(reclaimed, org, submit):
    cluster, owner = reclaimed
    victims = set(Workload.objects.filter(state=S.PREEMPTED).values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        result = cluster_reconcile(cluster)
    reads = [
        q["sql"]
        for q in queries
        if INDEX_READ.match(q["sql"]) and '."endpoint"' in q["sql"] and not OWN.search(q["sql"])
    ]
    assert len(reads) == 2 and not ONLY.search(reads[0])  # the first pass: every allocation
    [ids] = ONLY.findall(reads[1])
    assert {int(i) for i in ids.split(",")} == victims | {owner.pk}
    assert result.released == 2 and result.created == 1  # the owner's pod, by the second
    assert SimulatedPod.objects.filter(workload_id=owner.pk).count() == 1


def test_the_reconciles_admission_is_counted_on_the_cycle_that_nominated_it(
    reclaimed, client_as, org
):
    cluster, _ = reclaimed
    nominating = CycleRun.objects.order_by("-pk").first()
    assert (nominating.admitted, nominating.evicted) == (0, 2)
    cluster_reconcile(cluster)
    counts = dict(CycleRun.objects.values_list("pk", "admitted_at_release"))
    assert counts == {pk: int(pk == nominating.pk) for pk in counts}
    client = client_as(org.platform_admin)
    page = client.get("/workloads/cycles/").content.decode()
    assert page.count("+1 at release</span>") == 1
    rows = {row["id"]: row for row in client.get("/api/v1/cycles/").json()}
    assert rows[nominating.pk]["admitted_at_release"] == 1
    # The cycle after finds it running and admits nothing: counted once, where decided.
    run_locked(timezone.now())
    assert sum(CycleRun.objects.values_list("admitted_at_release", flat=True)) == 1


@pytest.mark.services
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs PostgreSQL's row locks: run under `python -m tests.services -- pytest ...`",
)
def test_a_reconcile_leaves_the_nomination_to_the_cycle_holding_the_nodes(reclaimed):
    cluster, owner = reclaimed
    locked, done = threading.Event(), threading.Event()

    def cycle_holding_the_nodes() -> None:
        try:
            with transaction.atomic():
                list(Node.objects.select_for_update().values_list("pk", flat=True))
                locked.set()
                done.wait(timeout=60)
        finally:
            connection.close()

    holder = threading.Thread(target=cycle_holding_the_nodes)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        cluster_reconcile(cluster)  # returns while the lock is held: it does not wait
        owner.refresh_from_db()
        assert owner.state == S.PENDING and owner.nominated  # released, left to the cycle
        assert Workload.objects.filter(state=S.PREEMPTED).count() == 0
    finally:
        done.set()
        holder.join(timeout=60)
    run = run_locked(timezone.now())
    owner.refresh_from_db()
    assert owner.state == S.ADMITTED and run.admitted >= 1
    # admitted by a cycle, counted there, not as admitted at release
    assert not CycleRun.objects.filter(admitted_at_release__gt=0).exists()


def test_an_admission_the_capacity_check_refuses_leaves_the_reconcile_whole(reclaimed, monkeypatch):
    # A nomination the final per-GPU check refuses (the fitting step made to pass it while
    # other work holds one of its GPUs) is left to the cycle; the release and the rest of
    # the pass stand.
    import scheduling.cycle
    from scheduling.models import PodAllocation

    cluster, owner = reclaimed
    first = owner.nominated["pods"][0]
    holder = Workload.objects.filter(state=S.RUNNING).first()
    PodAllocation.objects.create(
        workload=holder, pod_index=9, node_id=int(first["node_id"]), gpu_indices=[first["gpus"][0]]
    )
    monkeypatch.setattr(scheduling.cycle, "capacity_fitting", lambda admissions, nodes: admissions)
    result = cluster_reconcile(cluster)
    owner.refresh_from_db()
    assert owner.state == S.PENDING and owner.nominated  # waits for the cycle
    assert result.released == 2 and not result.errors
    assert Workload.objects.filter(state=S.PREEMPTED).count() == 0
