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


def test_the_demos_mig_instances_are_drawn_on_the_nodes_page_with_their_holders(
    live_server, page, settings, tmp_path
):
    """The demo (clusters/demo.py, scheduling/demo.py) after one cycle and one reconcile:
    hgx-0's GPU 4 holds a 3g.40gb and 1g.10gb instances, each with its workload. With
    GPUPOOL_SCREENSHOT set, the page is saved there (docs/img/mig-nodes.png)."""
    import io
    import os

    from clusters import demo as clusters_demo
    from clusters.reconcile import cluster_reconcile
    from portal import demo as portal_demo
    from portal.models import User
    from scheduling import demo
    from scheduling.cycle import cycle_run

    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    for seed in (portal_demo.seed, clusters_demo.seed, demo.seed):
        seed(out)
    cycle_run()
    cluster_reconcile(Cluster.objects.get(name="sim"))
    alice = User.objects.get(username="alice")
    alice.set_password(PASSWORD)
    alice.save()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/clusters/nodes/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    bar = page.locator(".mig-bar").first
    bar.wait_for()
    texts = sorted(" ".join(t.split()) for t in page.locator(".mig-instance").all_inner_texts())
    assert texts == [
        "1g.10gb: another project",  # bob's embed-mig: alice does not see his project
        "1g.10gb: ml-vision/tok-sweep-mig-trial-0",
        "1g.10gb: ml-vision/tok-sweep-mig-trial-1",
        "3g.40gb: ml-vision/eval-mig",
    ]
    if os.environ.get("GPUPOOL_SCREENSHOT"):
        page.locator("text=hgx-0").first.scroll_into_view_if_needed()
        page.screenshot(path=os.environ["GPUPOOL_SCREENSHOT"], full_page=True)
