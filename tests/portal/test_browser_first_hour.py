"""The first hour, in Chromium at a laptop's width and a phone's (issue 28): an admin onboards a
department and a project and invites a user; she sets a password, logs in, launches a
JupyterLab and runs `print(6*7)` in it, submits jobs from the CLI and follows one's log,
and reads the usage report.

It fails on any request to another host, on a portal page wider than the window, and on a
failed item shown without its reason. Each portal page is screenshotted into
var/artifacts/first-hour/. The server is uvicorn (the proxy in front of Django) in another
process, on the PostgreSQL test database (run under tests/services.py); the cycle and
reconciliation run in this process, as a worker would run them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from clusters.tasks import reconcile_cluster
from portal.models import Department, Project
from scheduling.models import FINISHED_STATES, Workload
from scheduling.selectors import workload_why
from scheduling.tasks import run_cycle
from tests.factories import PASSWORD
from tests.scheduling.test_browser_tour import OVERFLOWING
from tests.workspaces import test_browser_jupyterlab as jupyterlab
from tests.workspaces.helpers import drive_until_running, local_cluster, stop_and_reap, wait_until
from tests.workspaces.test_browser_jupyterlab import asgi_server  # noqa: F401 - a fixture
from workspaces.models import Environment

# As the JupyterLab test's: a real uvicorn server on the PostgreSQL test database.
pytestmark = jupyterlab.pytestmark

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "artifacts" / "first-hour"
WIDTHS = [1280, 390]
NEW_PASSWORD = "a-long-new-passphrase-42"
# A failed item must say why: in a row (lists, the home page) its own reason; an event its
# message (the last column); on an item's own page, a reason somewhere on it.
FAILED_WITHOUT_REASON = """() => {
  const out = [];
  for (const badge of document.querySelectorAll(".badge.state-failed")) {
    const row = badge.closest("tr, li");
    const event = row && row.closest("table.events");
    const found = event ? [row.lastElementChild] : (row || document).querySelectorAll(".reason");
    const reasons = [...found].filter(r => r.textContent.trim());
    if (!reasons.length) out.push((row || badge).textContent.trim().slice(0, 120));
  }
  return out;
}"""


class Tour:
    """One browser tab at one width, against the server at `url`; every request it makes
    to another host is kept in `foreign`."""

    def __init__(self, chromium, url: str, width: int, ports: str = "") -> None:
        self.url, self.width = url, width
        # The portal's own hosts: its origin, and the ports' origin JupyterLab runs on.
        self.own = {urlsplit(url).netloc} | ({urlsplit(ports).netloc} if ports else set())
        self.context = chromium.new_context(viewport={"width": width, "height": 900})
        self.context.set_default_timeout(30_000)
        self.foreign: list[str] = []
        self.context.on("request", self._seen)
        self.page = self.context.new_page()

    def _seen(self, request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc not in self.own:
            self.foreign.append(request.url)

    def go(self, path: str) -> None:
        self.page.goto(f"{self.url}{path}")

    def look(self, step: str) -> None:
        """Screenshot the portal page; it fits the window and every failed item says why."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.wait_for_load_state("load")
        shot = ARTIFACTS / f"{self.width}-{step}.png"
        self.page.screenshot(path=str(shot), full_page=True)
        overflowing = self.page.evaluate(OVERFLOWING)
        assert overflowing == [], f"{step} overflows at {self.width} px: {overflowing}"
        assert self.page.evaluate(FAILED_WITHOUT_REASON) == [], f"{step}: failed without why"

    def log_in(self, username: str, password: str) -> None:
        self.go("/accounts/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("text=Welcome")

    def create_with_quota(self, path: str, kind: str, name: str, pool, gpus: str) -> None:
        """Create a department or a project from its form, then save its quota in `pool`
        on the quota form it leads to."""
        self.go(path)
        self.page.fill("#id_name", name)
        self.page.click(f"text=Create {kind}")
        self.page.fill(f"#id_pool-{pool.pk}-gpus", gpus)
        self.page.click("text=Save quotas")
        self.page.wait_for_selector(f"text=Quotas of {name} saved.")

    def log_out(self) -> None:
        # The header's log-out button, folded into a menu on a phone's width or not.
        self.page.evaluate("document.querySelector(\"form[action='/accounts/logout/']\").submit()")
        self.page.wait_for_selector("#id_username")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_first_hour_as_admin_and_researcher(
    org,
    chromium,
    asgi_server,  # noqa: F811 - the fixture imported above
    width,
    tmp_path,
    settings,
):
    # The server's var/: where this process's reconciliation keeps local pods' logs is where
    # the server reads them.
    settings.VAR_DIR = tmp_path / "server-var"
    settings.VAR_DIR.mkdir(exist_ok=True)
    jupyterlab._server_passwords(org.platform_admin)
    cluster = local_cluster(org.pool.name)
    Environment.objects.create(
        name="JupyterLab", image="quay.io/jupyter/minimal-notebook",
        command=[sys.executable, "-m", "jupyterlab"], description="Python 3 notebooks",
    )  # fmt: skip
    tour = Tour(chromium, asgi_server.portal, width, ports=asgi_server.ports)
    page = tour.page
    try:
        # 1. The admin onboards a department and a project, and invites Nia into it.
        tour.log_in("admin", PASSWORD)
        tour.look("1-admin-home")
        tour.create_with_quota("/departments/new/", "department", "Robotics", org.pool, "4")
        tour.look("2-department")
        department = Department.objects.get(name="Robotics")
        path = f"/projects/new/?department={department.pk}"
        tour.create_with_quota(path, "project", "arm-control", org.pool, "2")
        tour.look("3-project")
        assert Project.objects.filter(name="arm-control", department=department).exists()
        tour.go("/users/invite/")
        page.fill("#id_email", "nia@example.com")
        page.fill("#id_first_name", "Nia")
        page.select_option("#id_project", label="arm-control")
        page.click("text=Send invitation")
        page.wait_for_selector("text=Invitation sent to nia@example.com.")
        tour.look("4-invited")
        tour.log_out()

        # 2. Nia follows the link in her mail (the server's console backend: its log), sets
        # a password and logs in.
        link = _invitation_link(tmp_path / "uvicorn.log")
        tour.go(urlsplit(link).path)
        page.wait_for_selector("text=Set your password")
        tour.look("5-set-password")
        page.fill("#id_new_password1", NEW_PASSWORD)
        page.fill("#id_new_password2", NEW_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("text=Password set")
        username = _username("nia@example.com")
        tour.log_in(username, NEW_PASSWORD)
        assert "Welcome, Nia" in page.content()
        tour.look("6-nia-home")

        # 3. She launches a JupyterLab and runs print(6*7) in it.
        tour.go("/workspaces/new/")
        page.select_option("#id_project", label="arm-control")
        page.click("label.env-card:has-text('JupyterLab')")
        page.fill("#id_name", "first-lab")
        tour.look("7-launch-workspace")
        page.click("button:has-text('Launch')")
        page.wait_for_url(re.compile(r"/workspaces/\d+/$"))
        workspace_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        try:
            drive_until_running(workspace_id, cluster)
            page.wait_for_selector("#open-lab", timeout=jupyterlab.LAB_TIMEOUT_MS)
            tour.look("8-workspace")
            with tour.context.expect_page() as opened:
                page.click("#open-lab")
            lab = opened.value
            lab.set_default_timeout(jupyterlab.LAB_TIMEOUT_MS)
            # JupyterLab runs on the ports' origin, as in `make demo`.
            lab.wait_for_url(re.compile(rf"^{asgi_server.ports}/workspaces/{workspace_id}/lab/"))
            jupyterlab._run_print_in_a_new_notebook(lab)
            lab.screenshot(path=str(ARTIFACTS / f"{width}-9-jupyterlab.png"))
            lab.close()
        finally:
            stop_and_reap(workspace_id, cluster)

        # 4. From the CLI: a job that prints, its log followed to the end; one that fails,
        # and says why everywhere it shows.
        portal = asgi_server.portal
        cli = _Cli(tmp_path / "cli", portal)
        cli("login", "--url", portal, "--username", username, "--password", NEW_PASSWORD)
        cli("project", "set", "arm-control")
        ok = cli.submitted("hello", "python", "-c", "print(6*7)")
        follow = cli.start("logs", "-f", str(ok))
        _drive_until_done(ok, cluster)
        out, _ = follow.communicate(timeout=120)
        assert follow.returncode == 0 and "42" in out, out
        bad = cli.submitted("broken", "python", "-c", "raise SystemExit(3)")
        failed = _drive_until_done(bad, cluster)
        assert failed.state == "failed" and "exit code 3" in workload_why(failed)
        tour.go("/")
        assert page.is_visible(".badge.state-failed")
        tour.look("10-home-with-a-failure")
        tour.go("/workloads/")
        tour.look("11-workloads")
        tour.go(f"/workloads/{ok}/logs/")
        assert "42" in page.inner_text("main")
        tour.look("12-logs")
        tour.go(f"/workloads/{bad}/")
        tour.look("13-failed-workload")

        # 5. The usage report.
        tour.go("/reports/usage/")
        assert page.is_visible("h1")
        tour.look("14-usage-report")
        assert tour.foreign == []
    finally:
        tour.context.close()


def _invitation_link(log: Path) -> str:
    found = wait_until(
        lambda: re.search(r"http://\S+/accounts/reset/\S+/", log.read_text(errors="replace")),
        30,
        "the invitation in the server's log",
    )
    return found.group(0)


def _username(email: str) -> str:
    from portal.models import User

    return User.objects.get(email=email).username


def _drive_until_done(workload_id: int, cluster, timeout: float = 240) -> Workload:
    """Cycles and reconciliations, as a worker and beat would run them, until it ends."""

    def step() -> Workload | None:
        run_cycle()
        reconcile_cluster(cluster.id)
        workload = Workload.objects.get(pk=workload_id)
        return workload if workload.state in FINISHED_STATES else None

    return wait_until(step, timeout, f"workload {workload_id} to end", interval=1)


class _Cli:
    """This tree's gpupool CLI in processes of its own, its config in `config`."""

    def __init__(self, config: Path, url: str) -> None:
        self.env = {**os.environ, "GPUPOOL_CONFIG_DIR": str(config)}
        for name in ("GPUPOOL_URL", "GPUPOOL_TOKEN"):
            self.env.pop(name, None)
        self.command = [sys.executable, "-m", "scheduling.cli"]

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*self.command, *args], cwd=ROOT, env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def __call__(self, *args: str) -> str:
        out, _ = (proc := self.start(*args)).communicate(timeout=120)
        assert proc.returncode == 0, out
        return out

    def submitted(self, name: str, *command: str) -> int:
        out = self("submit", "training", name, "--image", "python:3.11", "--", *command)
        return int(re.search(r"\(id (\d+)\)", out).group(1))
