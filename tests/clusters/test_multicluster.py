"""Several clusters feed one pool view: the cycle places a workload in the first of its
preferred pools, whichever cluster that pool is in, and each cluster runs only its own pods."""

from __future__ import annotations

import pytest

from clusters.backends import get_backend
from clusters.backends.simulated import description_parse
from clusters.inventory import inventory_sync
from clusters.models import Backend, NodePool
from clusters.reconcile import cluster_reconcile
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_submit
from tests import factories as f
from tests.clusters.conftest import make_cluster

S = WorkloadState
EAST = "nodes: [{name: east-0, gpus: 2, labels: {gpupool.io/node-pool: h100}}]"
WEST = "nodes: [{name: west-0, gpus: 4, labels: {gpupool.io/node-pool: a100}}]"


@pytest.fixture
def clusters(org):
    east = make_cluster("east", Backend.SIMULATED, config=description_parse(EAST))
    west = make_cluster("west", Backend.SIMULATED, config=description_parse(WEST))
    for cluster in (east, west):
        inventory_sync(cluster)
    h100 = NodePool.objects.get(name="h100")
    f.make_department_quota(org.dept_a, h100, gpus=2)
    f.make_project_quota(org.project_a, h100, gpus=2)
    return east, west


def submit(org, name: str, pools: list[str]) -> Workload:
    return workload_submit(
        actor=org.researcher,
        project=org.project_a,
        kind="training",
        name=name,
        image="pytorch/pytorch:2.3",
        command=["python", "train.py"],
        gpus=2,
        node_pools=pools,
    )


def placed(workload: Workload) -> tuple[str, str, str]:
    workload.refresh_from_db()
    node = workload.allocations.select_related("node__cluster", "node__pool").get().node
    return node.cluster.name, node.pool.name, workload.state


def test_pools_of_two_clusters_are_filled_in_each_workloads_preference_order(clusters, org):
    east, west = clusters
    # The a100 pool of the fixtures was adopted by the cluster whose nodes carry its label.
    assert NodePool.objects.get(name="a100").cluster == west
    assert NodePool.objects.get(name="h100").cluster == east
    first = submit(org, "first", ["h100", "a100"])
    cycle_run()
    assert placed(first) == ("east", "h100", S.ADMITTED)
    second = submit(org, "second", ["h100", "a100"])  # h100 is full: the next pool it allows
    third = submit(org, "third", ["a100"])
    cycle_run()
    assert placed(second)[:2] == ("west", "a100")
    assert placed(third)[:2] == ("west", "a100")
    for cluster in (east, west):
        cluster_reconcile(cluster)
    pods = {c.name: sorted(get_backend(c).pod_statuses()) for c in (east, west)}
    assert pods == {
        "east": [f"gp-{first.pk}-0"],
        "west": sorted([f"gp-{second.pk}-0", f"gp-{third.pk}-0"]),
    }
    assert {placed(w)[2] for w in (first, second, third)} == {S.RUNNING}


def test_the_workload_list_page_csv_and_api_filter_by_cluster(clusters, org, client_as):
    east_job = submit(org, "east-job", ["h100"])
    west_job = submit(org, "west-job", ["a100"])
    submit(org, "waiting", ["h100"])  # never placed: on no cluster
    cycle_run()
    client = client_as(org.researcher)
    page = client.get("/workloads/?cluster=east")
    assert [row["name"] for row in page.context["rows"]] == ["east-job"]
    assert b'<select id="f-cluster" name="cluster">' in page.content
    csv = client.get(f"/workloads/?cluster={clusters[1].pk}&format=csv").content.decode()
    assert "west-job" in csv and "east-job" not in csv
    api = client.get("/api/v1/workloads/?cluster=west").json()
    rows = api["results"] if isinstance(api, dict) else api
    assert [row["id"] for row in rows] == [west_job.pk]
    assert east_job.pk != west_job.pk
