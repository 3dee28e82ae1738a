"""Say what is simulated: its clusters, nodes, workloads, charts and reports carry a badge
or a notice naming the simulated cluster; pages without one say nothing of it."""

from __future__ import annotations

import pytest

from clusters.models import Cluster
from scheduling.cycle import cycle_run

pytestmark = pytest.mark.django_db

NOTICE = "Simulated cluster <strong>sim</strong> in"


@pytest.mark.parametrize(
    ("url", "what"),
    [("/dashboard/", "these charts"), ("/nodes/heatmap/", "this heat map"),
     ("/reports/usage/", "this report")],
)  # fmt: skip
def test_charts_and_reports_name_the_simulated_cluster(client_as, org, cluster, url, what):
    page = client_as(org.researcher).get(url).content.decode()
    assert f"{NOTICE} {what}: nothing runs there" in page


def test_without_a_simulated_cluster_no_page_mentions_one(client_as, org, cluster):
    Cluster.objects.filter(name="sim").update(backend="local")
    for url in ("/dashboard/", "/nodes/heatmap/", "/reports/usage/", "/clusters/nodes/"):
        assert "badge-simulated" not in client_as(org.researcher).get(url).content.decode()


def test_clusters_and_nodes_carry_the_badge(client_as, org, cluster):
    clusters = client_as(org.platform_admin).get("/clusters/").content.decode()
    assert clusters.count("badge-simulated") == 1
    nodes = client_as(org.researcher).get("/clusters/nodes/").content.decode()
    assert nodes.count("badge-simulated") == 2  # two nodes, both simulated


def test_a_workload_placed_on_the_simulated_cluster_says_so(client_as, org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "sim-run", gpus=1)
    page = client_as(org.researcher).get(f"/workloads/{wl.pk}/").content.decode()
    assert "badge-simulated" not in page  # pending: placed nowhere yet
    cycle_run()
    page = client_as(org.researcher).get(f"/workloads/{wl.pk}/").content.decode()
    assert "badge-simulated" in page
