"""A platform admin registers a simulated cluster in the browser and looks at its nodes."""

from __future__ import annotations

import pytest

from clusters.models import Cluster, Node
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESCRIPTION = """groups:
  - {prefix: dgx, count: 2, gpus: 8, gpu_model: NVIDIA A100-SXM4-80GB,
     labels: {gpupool.io/node-pool: a100}, spread: {gpupool.io/rack: [r1, r2]}}
"""


def test_an_admin_registers_a_simulated_cluster_tests_it_and_sees_its_gpus(live_server, page, org):
    page.goto(f"{live_server.url}/clusters/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.click("text=Register a cluster")
    page.fill("#id_name", "sim")
    page.select_option("#id_backend", "simulated")
    page.fill("#id_topology_labels", "gpupool.io/rack")
    page.fill("#id_description", DESCRIPTION)
    page.click("button:has-text('Register')")
    page.wait_for_selector("text=Cluster sim registered")
    # Registration synced the nodes already (tasks run eagerly here); syncing again is idempotent.
    page.click("button:has-text('Sync nodes')")
    page.wait_for_selector("text=sim: 2 nodes, 16 GPUs")
    page.click("button:has-text('Test connection')")
    page.wait_for_selector("text=Simulated cluster: 2 nodes, 16 GPUs")
    assert page.locator("text=reachable").first.is_visible()
    page.click("a:has-text('All nodes')")
    page.wait_for_selector("text=0 of 16 GPUs in use")
    assert page.locator("text=rack=r2").count() == 1
    assert Node.objects.filter(cluster=Cluster.objects.get(name="sim")).count() == 2
