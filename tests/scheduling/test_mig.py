"""Dynamic MIG through the database: submit, cycle, simulated nodes, reuse, pages, API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from clusters.backends.simulated import description_parse
from clusters.inventory import inventory_sync
from clusters.models import Cluster, Gpu, MigInstance, NodePool, SimulatedPod
from clusters.reconcile import cluster_reconcile
from portal.models import DepartmentQuota, ProjectQuota
from scheduling.cycle import cycle_run
from scheduling.lifecycle import workload_pods_released, workload_transition
from scheduling.models import Workload, WorkloadState
from scheduling.selectors import gpus_allocated

pytestmark = pytest.mark.django_db
S = WorkloadState
DESCRIPTION = """
nodes:
  - {name: h100-0, gpus: 2, gpu_model: NVIDIA H100 80GB HBM3, gpu_memory_mib: 81920,
     mig_gpus: 1, labels: {gpupool.io/node-pool: a100}}
stop_delay_s: 0
"""


@pytest.fixture
def sim(org):
    cluster = Cluster.objects.create(
        name="sim", backend="simulated", config=description_parse(DESCRIPTION)
    )
    inventory_sync(cluster)
    return cluster


def fresh(wl: Workload) -> Workload:
    wl.refresh_from_db()
    return wl


def mig(submit, org, name, profile="", memory=0, **spec):
    return submit(
        org.researcher,
        org.project_a,
        name,
        gpu_request="mig",
        mig_profile=profile,
        gpu_memory_mib=memory,
        **spec,
    )


def finish(wl: Workload) -> None:
    wl = fresh(wl)
    workload_transition(wl, S.SUCCEEDED, reason="Done")
    workload_pods_released(fresh(wl))


def instances() -> list[tuple[str, int, bool]]:
    return [(i.profile, i.start, bool(i.uuid)) for i in MigInstance.objects.order_by("start")]


def test_the_inventory_keeps_mig_mode_per_gpu(sim):
    assert list(Gpu.objects.order_by("index").values_list("index", "mig_enabled")) == [
        (0, False),
        (1, True),
    ]


def test_an_instance_is_made_on_demand_reused_after_its_workload_and_the_pod_sees_it(
    sim, org, submit
):
    first = mig(submit, org, "a", "3g.40gb")
    cycle_run()
    alloc = fresh(first).allocations.get()
    assert (alloc.mig_gpu_index, alloc.mig_profile, alloc.mig_start) == (1, "3g.40gb", 4)
    assert instances() == [("3g.40gb", 4, False)]  # wanted; the node has not made it yet
    cluster_reconcile(sim)
    assert instances() == [("3g.40gb", 4, True)]
    device = MigInstance.objects.get().uuid
    assert device.startswith("MIG-")
    pod = SimulatedPod.objects.get(workload_id=first.pk)
    assert (pod.env["NVIDIA_VISIBLE_DEVICES"], pod.env["CUDA_VISIBLE_DEVICES"]) == (device,) * 2
    assert float(gpus_allocated(fresh(first))) == pytest.approx(3 / 7, abs=1e-3)
    finish(first)
    assert instances() == [("3g.40gb", 4, True)]  # kept for the next of that shape
    second = mig(submit, org, "b", "", memory=30000)  # by memory: 3g.40gb is the smallest
    cycle_run()
    alloc = fresh(second).allocations.get()
    assert (alloc.mig_profile, alloc.mig_start) == ("3g.40gb", 4)
    assert MigInstance.objects.get().uuid == device  # the same instance, not a new one


def test_an_idle_instance_is_repartitioned_only_when_nothing_else_fits(sim, org, submit):
    small = mig(submit, org, "small", "1g.10gb")
    cycle_run()
    finish(small)
    other = mig(submit, org, "other", "1g.10gb")
    cycle_run()
    assert fresh(other).allocations.get().mig_start == fresh_start("1g.10gb")
    finish(other)
    whole = mig(submit, org, "big", "7g.80gb")
    cycle_run()
    assert (fresh(whole).allocations.get().mig_profile, instances()) == (
        "7g.80gb",
        [("7g.80gb", 0, False)],
    )


def fresh_start(profile: str) -> int:
    return MigInstance.objects.get(profile=profile).start


def test_a_pool_that_may_not_be_repartitioned_keeps_its_idle_instances(sim, org, submit):
    NodePool.objects.update(mig_repartition=False)
    small = mig(submit, org, "small", "1g.10gb")
    cycle_run()
    finish(small)
    big = mig(submit, org, "big", "7g.80gb")
    cycle_run()
    assert fresh(big).state == S.PENDING
    assert "MIG" in fresh(big).pending_reason
    assert [i[:2] for i in instances()] == [("1g.10gb", fresh_start("1g.10gb"))]


def test_an_instance_in_use_is_never_destroyed(sim, org, submit):
    mig(submit, org, "small", "1g.10gb")
    cycle_run()
    big = mig(submit, org, "big", "7g.80gb")
    cycle_run()
    assert fresh(big).state == S.PENDING
    assert len(instances()) == 1


def test_mig_slices_count_in_quota_as_their_part_of_the_gpu(sim, org, submit):
    DepartmentQuota.objects.update(gpus=1)
    ProjectQuota.objects.update(gpus=1, gpus_limit=1)
    a = mig(submit, org, "a", "4g.40gb")  # 4/7
    b = mig(submit, org, "b", "3g.40gb")  # 3/7: 7/7 together, within 1 GPU
    c = mig(submit, org, "c", "1g.10gb")  # 1/7 more would pass the limit
    cycle_run()
    assert [fresh(w).state for w in (a, b, c)] == [S.ADMITTED, S.ADMITTED, S.PENDING]


# -- bad input ---------------------------------------------------------------------------


@pytest.fixture
def api(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    return client


def body(**extra):
    return {"project": "ml-vision", "kind": "training", "name": "m", "image": "img", **extra}


def test_a_profile_the_gpu_model_lacks_is_a_400_naming_the_field(sim, api):
    response = api.post(
        "/api/v1/workloads/", body(gpu_request="mig", mig_profile="3g.20gb"), format="json"
    )
    assert response.status_code == 400
    assert "mig_profile" in response.json()
    assert "offers profile 3g.20gb" in response.json()["mig_profile"][0]


def test_mig_on_a_pool_without_mig_is_a_400_naming_the_pool_field(sim, api, org):
    Gpu.objects.update(mig_enabled=False)
    response = api.post(
        "/api/v1/workloads/",
        body(gpu_request="mig", mig_profile="1g.10gb", node_pools=["a100"]),
        format="json",
    )
    assert response.status_code == 400
    assert "no MIG-enabled GPU" in response.json()["node_pools"][0]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpu_request": "mig"}, "mig_profile"),  # neither a profile nor memory
        ({"gpu_request": "whole", "gpus": 1, "mig_profile": "1g.10gb"}, "mig_profile"),
        ({"gpu_request": "mig", "mig_profile": "x" * 17}, "mig_profile"),
    ],
)
def test_a_malformed_mig_request_names_its_field(sim, api, extra, field):
    response = api.post("/api/v1/workloads/", body(**extra), format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_a_good_mig_request_is_accepted_and_shown(sim, api):
    response = api.post(
        "/api/v1/workloads/", body(gpu_request="mig", mig_profile="2g.20gb"), format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["mig_profile"] == "2g.20gb"
    cycle_run()
    wl = api.get(f"/api/v1/workloads/{response.json()['id']}/").json()
    (alloc,) = wl["allocations"]
    assert (alloc["mig_gpu_index"], alloc["mig_profile"]) == (1, "2g.20gb")
    assert alloc["enforced_limits"] == {
        "mechanism": "mig",
        "profile": "2g.20gb",
        "gpu_memory_mib": 20480,
        "compute_slices": 2,
    }


def test_the_nodes_page_draws_each_instance_and_its_holder(sim, org, submit, client_as):
    wl = mig(submit, org, "drawn", "3g.40gb")
    cycle_run()
    cluster_reconcile(sim)
    idle = mig(submit, org, "gone", "1g.10gb")
    cycle_run()
    finish(idle)
    page = client_as(org.researcher).get("/clusters/nodes/").content.decode()
    assert f'3g.40gb: <a href="/workloads/{wl.pk}/">ml-vision/drawn</a>' in page
    assert "1g.10gb: idle" in page
    assert "left:50.0%;width:50.0%" in page
    outsider = client_as(org.outsider).get("/clusters/nodes/").content.decode()
    assert "3g.40gb: another project" in outsider
