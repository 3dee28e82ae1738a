"""Nominations (scheduling/nominations.py): an admission held back while its GPUs are
being freed is kept on the row and admitted there first once they are free, stamped with
the time of the cycle that placed it; one whose request changed meanwhile is dropped."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone

from clusters.models import Node
from portal.models import DepartmentQuota
from scheduling import adapters
from scheduling.cycle import (
    OvercommitRefused,
    capacity_check,
    capacity_fitting,
    nominations_apply,
    run_locked,
)
from scheduling.engine import types as t
from scheduling.lifecycle import workload_pods_released
from scheduling.models import PodAllocation, Workload, WorkloadState

pytestmark = pytest.mark.django_db
S = WorkloadState


def _reclaimed(org, submit) -> tuple[Workload, list[Workload], datetime]:
    """vision fills the 8 GPUs; nlp's 2-GPU job reclaims two of them: the cycle evicts
    and nominates the job on the GPUs its victims hold. The job and the victims."""
    DepartmentQuota.objects.update(gpus=4)
    jobs = [submit(org.researcher, org.project_a, f"v{i}", gpus=1) for i in range(8)]
    run_locked(timezone.now())
    owner = submit(org.outsider, org.project_b, "owner", gpus=2)
    placed_at = run_locked(timezone.now()).started_at
    victims = [wl for wl in jobs if Workload.objects.get(pk=wl.pk).state == S.PREEMPTED]
    owner.refresh_from_db()
    assert len(victims) == 2 and owner.state == S.PENDING and owner.nominated
    return owner, victims, placed_at


def test_a_nominated_job_is_admitted_where_it_was_placed_stamped_with_that_cycles_time(
    org, cluster, submit
):
    owner, victims, placed_at = _reclaimed(org, submit)
    wanted = {(int(p["node_id"]), tuple(p["gpus"])) for p in owner.nominated["pods"]}
    held = {
        (a.node_id, tuple(a.gpu_indices))
        for a in PodAllocation.objects.filter(workload__in=victims)
    }
    assert {(n, g) for n, gpus in wanted for g in gpus} <= {
        (n, g) for n, gpus in held for g in gpus
    }
    run = run_locked(timezone.now())  # the victims' pods are still there: it waits
    owner.refresh_from_db()
    assert owner.state == S.PENDING and owner.nominated and run.admitted == 0
    for victim in victims:
        workload_pods_released(Workload.objects.get(pk=victim.pk))
    run = run_locked(timezone.now())
    owner.refresh_from_db()
    assert owner.state == S.ADMITTED and owner.nominated is None and run.admitted >= 1
    assert owner.admitted_at == placed_at  # as the engine's replay has it started
    got = {(a.node_id, tuple(a.gpu_indices)) for a in owner.allocations.all()}
    assert got == wanted


def test_a_nomination_whose_request_changed_is_dropped(org, cluster, submit):
    owner, victims, _ = _reclaimed(org, submit)
    Workload.objects.filter(pk=owner.pk).update(gpus=1)
    for victim in victims:
        workload_pods_released(Workload.objects.get(pk=victim.pk))
    run_locked(timezone.now())
    owner.refresh_from_db()
    assert owner.nominated is None or owner.state == S.ADMITTED
    assert owner.allocations.count() <= 1  # placed for its new request, if at all


def _pods(node, *specs) -> tuple[t.PodPlacement, ...]:
    """Pods on `node`: an int is a whole GPU, a (GPU, share) pair a share of one."""
    return tuple(
        t.PodPlacement(i, str(node.pk), gpus=(s,))
        if isinstance(s, int)
        else t.PodPlacement(i, str(node.pk), shared_gpu=s[0], share=s[1], gpu_memory_mib=1024)
        for i, s in enumerate(specs)
    )


def test_capacity_fitting_takes_each_admission_whole_or_not_at_all(cluster):
    node = cluster[0]
    first = t.Admission("1", _pods(node, 0, (1, 0.5)))
    clash = t.Admission("2", _pods(node, 2, 0))  # GPU 2 is free, GPU 0 is not: none taken
    after = t.Admission("3", _pods(node, 2, (1, 0.5)))  # so GPU 2 is still free here
    over = t.Admission("4", _pods(node, (1, 0.25)))  # GPU 1 is full by now
    assert capacity_fitting([first, clash, after, over]) == [first, after]
    with pytest.raises(OvercommitRefused):
        capacity_check([first, clash])


def test_capacity_fitting_leaves_what_pods_gpupool_did_not_bind_hold(cluster):
    node = cluster[0]  # four GPUs
    Node.objects.filter(pk=node.pk).update(foreign_gpus=2)
    node.refresh_from_db()
    nodes = {adapters.engine_node_id(node.pk): node}
    two = t.Admission("1", _pods(node, 0, 1))
    third = t.Admission("2", _pods(node, 2))  # a GPU nobody holds, but others hold two
    assert capacity_fitting([two, third], nodes) == [two]
    assert capacity_fitting([two, third]) == [two, third]  # where foreign use is not given


def test_a_nomination_waits_while_pods_gpupool_did_not_bind_hold_its_room(org, cluster, submit):
    owner, victims, _ = _reclaimed(org, submit)
    [node_id] = {int(p["node_id"]) for p in owner.nominated["pods"]}
    for victim in victims:
        workload_pods_released(Workload.objects.get(pk=victim.pk))
    # Meanwhile the default scheduler bound a pod there that holds the GPUs they freed.
    Node.objects.filter(pk=node_id).update(foreign_gpus=2)
    assert nominations_apply().admitted == 0
    Node.objects.filter(pk=node_id).update(foreign_gpus=0)  # it finished
    assert nominations_apply().admitted == 1


def test_waiting_nominations_cost_the_cycle_a_few_queries_however_many(
    org, cluster, submit, django_assert_max_num_queries
):
    DepartmentQuota.objects.update(gpus=4)
    for i in range(8):
        submit(org.researcher, org.project_a, f"v{i}", gpus=1)
    run_locked(timezone.now())
    for i in range(4):
        submit(org.outsider, org.project_b, f"o{i}", gpus=1)
    run_locked(timezone.now())
    assert Workload.objects.filter(nominated__isnull=False).count() == 4
    # Their GPUs are still held: none is admitted. Read, nodes, given-back GPUs, the GPU
    # rows and their allocations: 5 queries, not a few per nomination.
    with django_assert_max_num_queries(5):
        assert nominations_apply().admitted == 0


def test_a_nominated_trial_holds_its_sweeps_slot_while_it_waits(org, cluster, submit):
    # A trial nominated onto GPUs being freed for it is admitted there at their release
    # (sweep trials are nominated too): while it waits, the sweep's other trials do not
    # take its slot, or the release would run more trials than the sweep's parallelism.
    search = {"method": "grid", "parameters": {"lr": [1, 2]}, "parallelism": 1}
    sweep = submit(org.researcher, org.project_a, "sweep", kind="hpo", gpus=1, search=search)
    first, second = sweep.children.order_by("pk")
    Workload.objects.filter(pk=first.pk).update(nominated={"request": "kept", "pods": []})
    pending = list(Workload.objects.filter(pk__in=[first.pk, second.pk]).order_by("-pk"))
    admit, throttled, _ = adapters._pending_workloads(pending)
    assert [wl.pk for wl in admit] == [first.pk]
    assert throttled == {str(second.pk): "sweep sweep runs at most 1 trials at once"}
