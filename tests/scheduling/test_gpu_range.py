"""A GPU range for single-pod training (scheduling/gpu_range.py): admitted at min_gpus,
grown with idle GPUs of its node, shrunk first on reclaim, each change a restart with the
new GPU count; validated on every entry, shown as current / min / max."""

from __future__ import annotations

import pytest

from clusters.podspecs import pod_specs_for
from clusters.reconcile import cluster_reconcile
from portal.errors import ValidationFailed
from scheduling.adapters import engine_node_id, read_snapshot
from scheduling.cli import gpu_request
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload, WorkloadPolicy
from scheduling.services import workload_stop
from tests.scheduling.conftest import make_nodes


def _gpus(job) -> list[int]:
    [row] = job.allocations.filter(releasing=False)
    return list(row.gpu_indices)


def test_a_gpu_range_starts_within_quota_and_grows_on_its_node(org, cluster, submit):
    job = submit(org.researcher, org.project_a, "ranged", min_gpus=2, max_gpus=4)
    assert (job.elastic, job.min_gpus, job.gpus, job.pods) == (True, 2, 4, 1)
    cycle_run()
    job.refresh_from_db()
    # One pod holding all four GPUs of one node, grown in the admitting cycle.
    assert job.state == "admitted" and len(_gpus(job)) == 4
    assert job.allocations.count() == 1


def test_a_gpu_range_never_spans_two_nodes(org, cluster, submit):
    rigid = submit(org.researcher, org.project_a, "three", gpus=3)
    cycle_run()
    job = submit(org.researcher, org.project_a, "ranged", min_gpus=1, max_gpus=4)
    cycle_run()
    job.refresh_from_db()
    rigid.refresh_from_db()
    [row] = job.allocations.all()
    # 5 GPUs are free (1 beside the rigid job, 4 on the other node): the range takes a
    # whole node's 4, never 1 here and 3 there.
    assert row.node_id != rigid.allocations.get().node_id and len(row.gpu_indices) == 4


@pytest.fixture
def sixteen(org, cluster):
    return [*cluster, *make_nodes(org.pool, 2, 4)]


def test_reclaim_shrinks_a_gpu_range_first_and_restarts_its_pod_with_the_new_count(
    org, sixteen, submit
):
    jobs = [
        submit(org.researcher, org.project_a, f"r{i}", min_gpus=1, max_gpus=4) for i in range(4)
    ]
    cycle_run()
    assert all(len(_gpus(j)) == 4 for j in jobs)
    other = submit(org.outsider, org.project_b, "needs2", gpus=2)
    cycle_run()
    shrunk = [j for j in Workload.objects.filter(pk__in=[j.pk for j in jobs]) if j.restarting]
    assert [j.state for j in Workload.objects.filter(pk__in=[j.pk for j in jobs])] == [
        "admitted"
    ] * 4  # none evicted whole
    [job] = shrunk
    row = job.allocations.get()
    assert len(row.gpu_indices) == 2 and len(row.releasing_gpu_indices) == 2
    event = job.events.get(type="resized")
    assert event.reason == "Shrunk"
    assert "From 4 to 2 GPUs (range 1..4): room for nlp/needs2" in event.message
    # Its given-back GPUs stay held until the old pod is gone.
    given_back = {(engine_node_id(row.node_id), i) for i in row.releasing_gpu_indices}
    assert given_back <= read_snapshot().held_devices
    cycle_run()
    other.refresh_from_db()
    assert other.state == "pending"
    # While the range gives its GPUs back, the cycle does not reclaim for the same work
    # again (it shrank or evicted a second job, and moved the nomination there).
    again = Workload.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    assert [(j.state, j.restarting) for j in again] == [("admitted", j.pk == job.pk) for j in again]
    cluster_reconcile(sixteen[0].cluster)  # deletes the old pod: it starts again with 2
    row.refresh_from_db()
    job.refresh_from_db()
    assert row.releasing_gpu_indices == [] and not job.restarting
    [spec] = pod_specs_for(
        list(PodAllocation.objects.filter(pk=row.pk).select_related("workload")),
        sixteen[0].cluster,
    )
    assert spec.env["GPUPOOL_NUM_GPUS"] == "2"
    # The reconcile that saw the old pod go admitted the job nominated on the GPUs it gave
    # back, and made its pod: no further cycle needed.
    other.refresh_from_db()
    assert other.state == "running" and other.nominated is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"min_gpus": 4, "max_gpus": 2}, "min_gpus"),
        ({"min_gpus": 2}, "min_gpus"),
        ({"max_gpus": 1.5}, "max_gpus"),
        ({"min_gpus": 0, "max_gpus": 2}, "min_gpus"),
        ({"max_gpus": 257}, "max_gpus"),
        ({"max_gpus": 8}, "max_gpus"),  # no node has 8 GPUs: one pod, one node
        ({"max_gpus": 2, "gpu_request": "fraction", "gpus": 0.5}, "max_gpus"),
        ({"max_gpus": 2, "min_pods": 1, "max_pods": 2}, "max_gpus"),
        ({"max_gpus": 2, "handles_resize": True}, "handles_resize"),
    ],
)
def test_a_bad_gpu_range_is_refused_naming_the_field(org, cluster, submit, spec, field):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "bad", **spec)
    assert field in refused.value.errors, refused.value.errors


def test_only_single_pod_training_takes_a_gpu_range(org, cluster, submit):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "d", kind="distributed", gpus=1, max_gpus=2)
    assert "max_gpus" in refused.value.errors


def test_a_gpu_range_above_the_policy_limit_names_the_maximum(org, cluster, submit):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=2)
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "big", min_gpus=1, max_gpus=3)
    assert list(refused.value.errors) == ["max_gpus"]


def test_the_api_form_and_cli_take_a_gpu_range_and_show_the_size(client_as, org, cluster):
    client = client_as(org.researcher)
    body = {
        "project": org.project_a.name, "kind": "training", "name": "api-range", "image": "x",
        "min_gpus": 2, "max_gpus": 4,
    }  # fmt: skip
    made = client.post("/api/v1/workloads/", body, content_type="application/json")
    assert made.status_code == 201, made.content
    cycle_run()
    shown = client.get(f"/api/v1/workloads/{made.json()['id']}/").json()
    assert shown["min_gpus"] == 2 and shown["size"] == {"current": 4, "min": 2, "max": 4}
    bad = client.post(
        "/api/v1/workloads/",
        {**body, "name": "bad", "min_gpus": 5},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "min_gpus" in bad.json()
    assert b"4 of 2..4 GPUs" in client.get("/workloads/").content
    post = {
        "project": org.project_a.pk, "name": "form-range", "image": "x", "gpu_request": "whole",
        "gpus": "1", "cpu": "1", "memory_mib": "1024", "min_gpus": "1", "max_gpus": "2",
        "priority_class": "train",
    }  # fmt: skip
    page = client.post("/workloads/new/training/", post)
    assert page.status_code == 302, page.context["form"].errors
    made = Workload.objects.get(name="form-range")
    assert (made.min_gpus, made.gpus) == (1, 2)
    initial = client.get(f"/workloads/{made.pk}/clone/").context["form"].initial
    assert (initial["min_gpus"], initial["max_gpus"]) == (1, 2)
    bad_form = client.post("/workloads/new/training/", {**post, "name": "f2", "min_gpus": "3"})
    assert "min_gpus" in bad_form.context["form"].errors
    assert gpu_request("2..4", None) == {"gpu_request": "whole", "min_gpus": 2, "max_gpus": 4}
    assert b"of 2..4 GPUs" not in client_as(org.outsider).get("/workloads/").content


def test_a_gpu_range_grows_in_a_later_cycle_with_a_restart(org, cluster, submit):
    blockers = [submit(org.researcher, org.project_a, f"b{i}", gpus=3) for i in range(2)]
    cycle_run()
    job = submit(org.researcher, org.project_a, "ranged", min_gpus=1, max_gpus=4)
    cycle_run()
    assert len(_gpus(job)) == 1
    node = job.allocations.get().node_id
    [beside] = [b for b in blockers if b.allocations.get().node_id == node]
    workload_stop(actor=org.researcher, workload=beside)
    beside.allocations.all().delete()  # the cluster confirmed its pod is gone
    cycle_run()
    job.refresh_from_db()
    assert len(_gpus(job)) == 4 and job.restarting
    event = job.events.get(type="resized")
    assert event.reason == "Grew" and event.message.startswith("From 1 to 4 GPUs (range 1..4)")
