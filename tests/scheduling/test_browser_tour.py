"""A researcher's day in a real browser, at a laptop's width and a phone's: the home page,
a training job launched from the sectioned form, its page and its log, a workspace's
JupyterLab link, the usage report. Each page is screenshotted into var/artifacts/tour/
(kept for people to look at) and must fit its viewport: no element wider than the window.

JupyterLab itself is opened through the proxy in tests/workspaces/test_browser_jupyterlab.py;
here the link to it is checked (this test's server speaks WSGI, not the proxy's ASGI)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from clusters.models import Backend, Cluster, Node
from clusters.tasks import reconcile_cluster
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy
from tests import factories as f
from tests.scheduling.test_browser_workloads import log_in
from tests.workspaces.helpers import jupyter_server, make_running_workspace
from workspaces.models import Workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts" / "tour"
WIDTHS = {"laptop": 1280, "phone": 390}
# Elements wider than the window, or reaching past its right edge. A hidden one measures 0;
# one parked wholly off to the left (plotly's text-measuring svg) is not on the page.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width + 1) out.push("page scrolls sideways");
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if ((box.width === 0 && box.height === 0) || box.right <= 0) continue;
    if (box.width > width + 1 || box.right > width + 1 || box.left < -1) {
      const id = el.id ? "#" + el.id : "";
      const cls = el.classList.length ? "." + [...el.classList].join(".") : "";
      const where = `${Math.round(box.left)}..${Math.round(box.right)}`;
      out.push(`${el.tagName.toLowerCase()}${id}${cls} ${where}`);
    }
  }
  return out.slice(0, 20);
}"""


@pytest.fixture
def tour_page(chromium, request):
    width = WIDTHS[request.param]
    context = chromium.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    tab.tour_name = request.param
    yield tab
    context.close()


def look(page, step: str) -> None:
    """Screenshot the page as an artifact and assert that nothing overflows the window."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_load_state("load")
    page.screenshot(path=str(ARTIFACTS / f"{page.tour_name}-{step}.png"), full_page=True)
    assert page.evaluate(OVERFLOWING) == [], f"{step} overflows at {page.tour_name} width"


@pytest.mark.parametrize("tour_page", list(WIDTHS), indirect=True)
def test_a_researchers_day_fits_the_screen(live_server, tour_page, org, cluster, submit, tmp_path):
    with running_lab(org, tmp_path) as workspace:
        tour(tour_page, live_server, org, submit, workspace)


@contextlib.contextmanager
def running_lab(org, tmp_path):
    """A running workspace whose tool is a real Jupyter server on loopback."""
    workspace = make_running_workspace(owner=org.researcher, project=org.project_a, name="lab")
    with jupyter_server(workspace.pk, tmp_path) as server:
        workspace.workload.allocations.update(endpoint=server.endpoint)
        Workspace.objects.filter(pk=workspace.pk).update(token=server.token)
        yield workspace


def tour(page, live_server, org, submit, workspace) -> None:
    url = live_server.url
    submit(org.researcher, org.project_a, "yesterdays-run", gpus=1)
    cycle_run()
    log_in(page, live_server, "rita")

    # 1. Home: my work with the workspace's Open button, my project, the launch buttons.
    page.goto(f"{url}/")
    assert page.is_visible(f"#my-work [data-workload='{workspace.pk}'] a:text('Open')")
    assert page.is_visible("#my-projects [data-project='ml-vision']")
    look(page, "1-home")

    # 2. Launch training from the sectioned form; the advanced parts start folded.
    page.click("#launch a:text('New training')")
    page.wait_for_url("**/workloads/new/training/")
    legends = page.locator("#workload-form legend").all_text_contents()
    assert legends == ["General", "Environment", "Compute", "Data", "Scheduling"]
    assert page.is_hidden("#row-args") and page.is_visible("#row-image")
    assert "local machine does not use the image" not in page.text_content("#row-image")
    look(page, "2-launch-form")
    page.fill("#id_name", "resnet")
    page.fill("#id_image", "pytorch/pytorch:2.3")
    page.fill("#id_command", "python train.py")
    page.fill("#id_gpus", "2")
    page.check("#row-node_pools input[value=a100]")
    page.click("#workload-form button[type=submit]")
    page.wait_for_url(re.compile(r"/workloads/\d+/$"))
    workload = Workload.objects.get(name="resnet")
    assert (workload.gpus, workload.node_pools) == (2, ["a100"])

    # 3. The scheduler places it on the simulated cluster; its page and its log say so.
    cycle_run()
    reconcile_cluster(Cluster.objects.get(name="sim").pk)
    page.reload()
    page.wait_for_function("document.querySelector('#workload-state').textContent !== 'pending'")
    assert page.is_visible(".badge-simulated")
    look(page, "3-workload")
    page.click("a:text('Logs')")
    page.wait_for_url(f"**/workloads/{workload.pk}/logs/")
    assert "[simulated]" in page.content()
    look(page, "4-logs")

    # 4. The workspace form is in sections too; the workspace's page links to its
    # JupyterLab through the proxy.
    page.goto(f"{url}/workspaces/new/")
    legends = page.locator("#launch-form legend").all_text_contents()
    assert legends == ["General", "Environment", "Compute", "Data", "Scheduling"]
    look(page, "5-workspace-form")
    page.goto(f"{url}/workspaces/{workspace.pk}/")
    assert page.get_attribute("#open-lab", "href") == f"/workspaces/{workspace.pk}/lab/"
    look(page, "6-workspace")

    # 5. The usage report.
    page.goto(f"{url}/reports/usage/")
    assert page.is_visible("h1")
    look(page, "7-usage-report")


def test_the_form_follows_the_chosen_project_and_pools(live_server, page, org, cluster):
    """The limits beside the fields are the chosen project's; the simulated duration shows
    while a simulated pool may be chosen and hides when only a real one is ticked."""
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=2)
    local = Cluster.objects.create(name="here", backend=Backend.LOCAL)
    Node.objects.create(
        cluster=local, name="box", pool=f.make_pool("cpu"), cpu_cores=8, memory_mib=8192
    )
    log_in(page, live_server, "admin")
    page.goto(f"{live_server.url}/workloads/new/training/")
    limit = f"#row-gpus .limit[data-project='{org.project_a.pk}']"
    page.select_option("#id_project", str(org.project_a2.pk))
    assert page.is_hidden(limit)
    page.select_option("#id_project", str(org.project_a.pk))
    assert "At most 2 GPUs per workload" in page.text_content(limit)
    assert page.is_visible(limit)
    assert page.is_visible("#row-duration_s")
    page.check("#row-node_pools input[value=cpu]")
    assert page.is_hidden("#row-duration_s")
    page.check("#row-node_pools input[value=a100]")
    assert page.is_visible("#row-duration_s")


def test_a_sweeps_trials_show_for_random_search_only(live_server, page, org, cluster):
    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/workloads/new/hpo/")
    assert page.is_hidden("#row-trials")
    page.select_option("#id_search_method", "random")
    assert page.is_visible("#row-trials")
