"""A text in a number of the inventory or of a placement (issue 27, bad rows): SQLite keeps
`cpu_cores = 'abc'` in a node, `memory_mib = 'abc'` in a GPU, `shared_gpu_index = 'abc'` in
a pod's allocation. Such a value loads as a stand-in (portal.tolerant), so every page and
the API answer; the cycle places nothing on that node while its free capacity is unknown,
and fails the workload whose allocation it is, naming the allocation and the column, while
it schedules everyone else."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from clusters.models import Gpu
from portal.models import ProjectQuota
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload, WorkloadEvent, WorkloadState
from tests.planted import plant_text
from tests.scheduling.test_cycle_poison import api_as  # noqa: F401
from tests.scheduling.test_unreadable_columns import every_read_answers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses the text"),
]


def placed(submit, org, name: str, gpus: int = 2) -> tuple[Workload, PodAllocation]:
    workload = submit(org.researcher, org.project_a, name, gpus=gpus)
    assert cycle_run().ok
    return workload, PodAllocation.objects.get(workload=workload)


def inventory_pages_answer(client_as, api_as, admin) -> None:  # noqa: F811 - the fixture
    for client, name in [(client_as(admin), "cluster_list"), (client_as(admin), "node_list")]:
        assert client.get(reverse(name)).status_code == 200, name
    for name in ("api-nodes", "api-clusters"):
        assert api_as(admin).get(reverse(name)).status_code == 200, name


def node_and_gpu_rows(alloc: PodAllocation) -> dict[str, object]:
    return {"node": alloc.node, "gpu": Gpu.objects.get(node=alloc.node, index=0)}


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("node", "cpu_cores"),
        ("node", "memory_mib"),
        ("node", "foreign_gpus"),
        ("node", "foreign_cpu"),
        ("node", "foreign_memory_mib"),
        ("gpu", "index"),
        ("gpu", "memory_mib"),
        ("node", "labels"),  # JSON of the wrong shape: a list, not an object
        ("node", "topology"),
    ],
)
def test_a_text_in_a_node_or_gpu_keeps_work_off_that_node_only(
    org,
    cluster,
    submit,
    client_as,
    api_as,  # noqa: F811 - the fixture
    row,
    column,
):
    first, alloc = placed(submit, org, "first")
    bad_node = alloc.node
    value = '["rack-1"]' if column in ("labels", "topology") else "abc"
    assert "text" in plant_text(node_and_gpu_rows(alloc)[row], **{column: value})
    later = submit(org.outsider, org.project_b, "later", gpus=2)
    every_read_answers(org, client_as, api_as, first, later)
    inventory_pages_answer(client_as, api_as, org.platform_admin)

    run = cycle_run()

    # Bin packing would fill the used node's 2 free GPUs; it takes nothing while its
    # capacity is unknown, and the other node takes the job.
    assert run.ok and run.quarantined == 0, run.error
    assert Workload.objects.get(pk=later.pk).state == WorkloadState.ADMITTED
    assert PodAllocation.objects.get(workload=later).node_id != bad_node.pk
    assert Workload.objects.get(pk=first.pk).state == WorkloadState.ADMITTED
    every_read_answers(org, client_as, api_as, first, later)


ALLOCATION_COLUMNS = [
    "pod_index",
    "shared_gpu_index",
    "gpu_share",
    "gpu_memory_mib",
    "mig_gpu_index",
    "mig_start",
]


@pytest.mark.parametrize("column", ALLOCATION_COLUMNS)
def test_a_text_in_an_allocation_fails_its_workload_only(
    org,
    cluster,
    submit,
    client_as,
    api_as,  # noqa: F811 - the fixture
    column,
):
    bad, alloc = placed(submit, org, "misplaced")
    assert "text" in plant_text(alloc, **{column: "abc"})
    later = submit(org.outsider, org.project_b, "later", gpus=2)
    every_read_answers(org, client_as, api_as, bad, later)

    run = cycle_run()

    assert run.ok and run.quarantined == 1, run.error
    assert Workload.objects.get(pk=bad.pk).state == WorkloadState.FAILED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    expected = f"its allocation {alloc.pk}: {column} is not a number in the database"
    assert event.reason == "InvalidRequest" and expected in event.message, event.message
    assert Workload.objects.get(pk=later.pk).state == WorkloadState.ADMITTED
    assert PodAllocation.objects.get(workload=later).node_id != alloc.node_id
    every_read_answers(org, client_as, api_as, bad, later)


@pytest.mark.parametrize("value", ['["0"]', '{"0": 1}', "[-1]", '"0"'])
def test_gpu_indices_of_the_wrong_shape_fail_their_workload_only(org, cluster, submit, value):
    bad, alloc = placed(submit, org, "misplaced")
    plant_text(alloc, gpu_indices=value)
    later = submit(org.outsider, org.project_b, "later", gpus=2)

    run = cycle_run()

    assert run.ok and run.quarantined == 1, run.error
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert "gpu_indices is not a list of GPU indices" in event.message, event.message
    assert Workload.objects.get(pk=later.pk).state == WorkloadState.ADMITTED


@pytest.mark.parametrize("column", ["gpus", "gpus_limit", "over_quota_weight"])
def test_a_text_in_a_quota_leaves_that_quota_out_and_fails_no_cycle(
    org, cluster, submit, client_as, column
):
    quota = ProjectQuota.objects.filter(project=org.project_a).first()
    assert quota is not None
    assert "text" in plant_text(quota, **{column: "abc"})
    mine = submit(org.researcher, org.project_a, "mine", gpus=1)
    theirs = submit(org.outsider, org.project_b, "theirs", gpus=1)

    run = cycle_run()

    assert run.ok, run.error
    states = Workload.objects.filter(pk__in=[mine.pk, theirs.pk]).values_list("state", flat=True)
    assert set(states) == {WorkloadState.ADMITTED}  # idle GPUs: over quota, as with no quota
    admin = client_as(org.platform_admin)
    for name, pk in (("project_quotas", org.project_a.pk), ("project_detail", org.project_a.pk)):
        assert admin.get(reverse(name, args=[pk])).status_code == 200, name
