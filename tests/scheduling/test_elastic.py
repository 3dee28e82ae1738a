"""Elastic workloads through the service, API, form and cycle: the range is accepted and
checked, the job starts at its minimum, grows, gives extra pods back first, and each
size change is on its timeline with the pods told their rank and world size."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusters.metrics.models import GpuSample
from clusters.podspecs import pod_specs_for
from clusters.reconcile import cluster_reconcile
from portal.errors import ValidationFailed
from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload, WorkloadPolicy
from tests import factories as f
from tests.scheduling.conftest import make_nodes


def _pods(workload) -> list[int]:
    """The pods it runs with (not those it gave back, still going away)."""
    running = workload.allocations.filter(releasing=False)
    return sorted(running.values_list("pod_index", flat=True))


def test_an_elastic_training_job_starts_within_quota_and_grows_with_idle_gpus(org, cluster, submit):
    job = submit(org.researcher, org.project_a, "elastic", gpus=1, min_pods=2, max_pods=8)
    assert (job.elastic, job.min_pods, job.pods) == (True, 2, 8)
    cycle_run()
    job.refresh_from_db()
    # All 8 GPUs are idle: it starts at 2 (within quota) and grows in the same cycle.
    assert job.state == "admitted" and _pods(job) == list(range(8))


@pytest.fixture
def sixteen(org, cluster):
    """16 GPUs: each department's deserved 8 fits, so a project may reclaim a whole GPU."""
    return [*cluster, *make_nodes(org.pool, 2, 4)]


def test_reclaim_takes_extra_pods_and_writes_the_resize_on_the_timeline(org, sixteen, submit):
    job = submit(org.researcher, org.project_a, "elastic", gpus=1, min_pods=2, max_pods=16)
    cycle_run()
    other = submit(org.outsider, org.project_b, "needs2", gpus=2)
    cycle_run()
    job.refresh_from_db()
    other.refresh_from_db()
    assert _pods(job) == list(range(14)) and job.state == "admitted"  # the newest pods go
    event = job.events.get(type="resized")
    assert event.reason == "Shrunk"
    assert "From 16 to 14 pods (range 2..16): room for nlp/needs2" in event.message
    assert "restart from their checkpoint" in event.message
    assert job.restarting and job.resized_at is not None
    # The freed GPUs are still held by pods going away: the beneficiary waits for them.
    assert other.state == "pending"
    assert sorted(job.allocations.filter(releasing=True).values_list("pod_index", flat=True)) == [
        14,
        15,
    ]
    cycle_run()
    other.refresh_from_db()
    assert other.state == "pending"  # the cluster has not confirmed the pods are gone
    cluster_reconcile(sixteen[0].cluster)  # the simulated backend deletes them
    assert not job.allocations.filter(releasing=True).exists()
    cycle_run()
    other.refresh_from_db()
    job.refresh_from_db()
    assert other.state == "admitted" and _pods(job) == list(range(14))


def test_each_pod_is_told_its_rank_and_the_current_world_size(org, cluster, submit):
    job = submit(org.researcher, org.project_a, "elastic", gpus=2, min_pods=1, max_pods=3)
    cycle_run()
    allocations = list(PodAllocation.objects.filter(workload=job).select_related("workload"))
    specs = pod_specs_for(allocations, cluster[0].cluster)
    assert [(s.env["GPUPOOL_RANK"], s.env["GPUPOOL_WORLD_SIZE"]) for s in specs] == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]
    assert {s.env["WORLD_SIZE"] for s in specs} == {"6"}  # the rendezvous, 2 GPUs a pod


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("training", {"min_pods": 5, "max_pods": 3}, "min_pods"),
        ("distributed", {"min_pods": 4, "max_pods": 2}, "min_pods"),
        ("inference", {"min_replicas": 3, "max_replicas": 2, "ports": [8000]}, "min_replicas"),
        ("training", {"min_pods": 2}, "min_pods"),
        ("training", {"max_pods": 0}, "max_pods"),
        ("training", {"max_pods": 1001}, "max_pods"),
    ],
)
def test_a_bad_range_is_refused_naming_the_field(org, cluster, submit, kind, spec, field):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "bad", kind=kind, gpus=1, **spec)
    assert field in refused.value.errors


def test_a_maximum_above_the_policy_limit_names_the_maximum(org, cluster, submit):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=4)
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "big", gpus=1, min_pods=1, max_pods=6)
    assert list(refused.value.errors) == ["max_pods"]
    with pytest.raises(ValidationFailed) as refused:
        submit(
            org.researcher, org.project_a, "svc", kind="inference", gpus=1, ports=[8000],
            min_replicas=1, max_replicas=5,
        )  # fmt: skip
    assert list(refused.value.errors) == ["max_replicas"]


def test_the_api_accepts_the_range_and_shows_the_size(client_as, org, cluster):
    client = client_as(org.researcher)
    body = {
        "project": "ml-vision", "kind": "inference", "name": "svc", "image": "img",
        "gpus": 1, "ports": [8000], "min_replicas": 1, "max_replicas": 3,
    }  # fmt: skip
    created = client.post("/api/v1/workloads/", body, content_type="application/json")
    assert created.status_code == 201, created.content
    cycle_run()
    shown = client.get(f"/api/v1/workloads/{created.json()['id']}/").json()
    assert shown["elastic"] and shown["size"] == {"current": 3, "min": 1, "max": 3}
    bad = client.post(
        "/api/v1/workloads/",
        {**body, "name": "svc2", "min_replicas": 4},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "min_replicas" in bad.json()


def test_the_form_shows_a_bad_range_next_to_its_field(client_as, org, cluster):
    client = client_as(org.researcher)
    post = {
        "project": org.project_a.pk, "name": "e", "image": "img", "gpu_request": "whole",
        "gpus": "1", "cpu": "1", "memory_mib": "1024", "min_pods": "4", "max_pods": "2",
    }  # fmt: skip
    response = client.post("/workloads/new/training/", post)
    assert response.status_code == 200
    assert "min_pods" in response.context["form"].errors
    ok = client.post("/workloads/new/training/", {**post, "min_pods": "1"})
    assert ok.status_code == 302
    cycle_run()
    page = client.get(ok["Location"])
    assert b"elastic: 4 of 1..2 pods" not in page.content  # 2 pods at most
    assert b"elastic: 2 of 1..2 pods" in page.content


def test_a_job_that_handles_resizing_keeps_its_pods_running(org, sixteen, submit):
    job = submit(
        org.researcher, org.project_a, "self", gpus=1, min_pods=2, max_pods=16, handles_resize=True
    )
    cycle_run()
    submit(org.outsider, org.project_b, "needs2", gpus=2)
    cycle_run()
    job.refresh_from_db()
    assert not job.restarting
    assert "restart" not in job.events.get(type="resized").message


def test_outsiders_cannot_see_an_elastic_job(client_as, org, cluster, submit):
    job = submit(org.researcher, org.project_a, "elastic", gpus=1, min_pods=2, max_pods=8)
    assert client_as(org.outsider).get(f"/api/v1/workloads/{job.pk}/").status_code == 404
    assert f.Role  # the personas come from tests.factories


def _load(workload, util: float, at) -> None:
    for a in workload.allocations.all():
        for index in a.gpu_indices:
            GpuSample.objects.create(
                ts=at, node_id=a.node_id, gpu_index=index, util_pct=util, workload_id=workload.pk
            )


def test_a_service_scales_up_on_gpu_load_with_a_cool_down_and_back_down(org, cluster, submit):
    svc = submit(
        org.researcher, org.project_a, "svc", kind="inference", gpus=1, ports=[8000],
        min_replicas=1, max_replicas=4, scale_target=50, scale_cooldown_s=600,
    )  # fmt: skip
    t0 = timezone.now()
    cycle_run(t0)
    assert _pods(svc) == [0]  # no load seen yet: it runs at its minimum
    _load(svc, 100, t0)
    cycle_run(t0 + dt.timedelta(seconds=60))
    svc.refresh_from_db()
    assert _pods(svc) == [0, 1] and svc.spec["wanted_replicas"] == 2
    _load(svc, 100, t0 + dt.timedelta(seconds=90))
    cycle_run(t0 + dt.timedelta(seconds=120))  # within the cool-down: no change
    assert _pods(svc) == [0, 1]
    _load(svc, 10, t0 + dt.timedelta(seconds=700))
    GpuSample.objects.filter(util_pct=100).delete()
    cycle_run(t0 + dt.timedelta(seconds=800))
    svc.refresh_from_db()
    assert _pods(svc) == [0]
    event = svc.events.filter(type="resized").last()
    assert event.reason == "ScaledDown" and "under the target of 50.0%" in event.message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"scale_target": 0}, "scale_target"),
        ({"scale_target": 101}, "scale_target"),
        ({"scale_target": 50, "scale_metric": "requests_per_replica"}, "scale_metric"),
        ({"scale_cooldown_s": 60}, "scale_target"),
    ],
)
def test_a_bad_scaling_rule_is_refused_naming_the_field(org, cluster, submit, spec, field):
    with pytest.raises(ValidationFailed) as refused:
        submit(
            org.researcher, org.project_a, "svc", kind="inference", gpus=1, ports=[8000],
            min_replicas=1, max_replicas=4, **spec,
        )  # fmt: skip
    assert field in refused.value.errors


def test_only_an_elastic_service_scales_on_load(org, cluster, submit):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "t", gpus=1, scale_target=50)
    assert "scale_target" in refused.value.errors


def test_the_form_takes_a_scaled_service_and_a_clone_keeps_its_range(client_as, org, cluster):
    client = client_as(org.researcher)
    post = {
        "project": org.project_a.pk, "name": "svc", "image": "img", "gpu_request": "whole",
        "gpus": "1", "cpu": "1", "memory_mib": "1024", "replicas": "1", "ports": "8000",
        "min_replicas": "1", "max_replicas": "3", "scale_target": "70",
        "scale_cooldown_s": "120",
    }  # fmt: skip
    response = client.post("/workloads/new/inference/", post)
    assert response.status_code == 302, response.context["form"].errors
    svc = Workload.objects.get(name="svc")
    assert (svc.min_pods, svc.pods, svc.spec["scale_target"], svc.spec["scale_cooldown_s"]) == (
        1,
        3,
        70.0,
        120,
    )
    clone = client.get(f"/workloads/{svc.pk}/clone/")
    initial = clone.context["form"].initial
    assert (initial["min_replicas"], initial["max_replicas"], initial["scale_target"]) == (
        1,
        3,
        70.0,
    )
    bad = client.post("/workloads/new/inference/", {**post, "name": "s2", "scale_target": "0"})
    assert "scale_target" in bad.context["form"].errors


def test_the_list_page_shows_the_size_of_elastic_work(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "elastic", gpus=1, min_pods=2, max_pods=6)
    cycle_run()
    page = client_as(org.researcher).get("/workloads/")
    assert b"6 of 2..6 pods" in page.content
    assert client_as(org.outsider).get("/workloads/").content.count(b"of 2..6 pods") == 0
