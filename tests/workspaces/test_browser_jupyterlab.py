"""The researcher's daily path in a real browser, against a real server process served as
`make demo` serves it (portal.serve, with the ports' origin on the next socket): launch
JupyterLab from the form, open it through the proxy (on the ports' origin, where a
notebook's scripts cannot act as its viewer on the portal), run a cell; a stranger is refused.

The server runs in another process, so it must see this test's database: the PostgreSQL
test database (run under tests/services.py). The cycle and reconciliation run in this
process through their tasks, as a worker would run them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.factories import PASSWORD
from tests.workspaces.helpers import (
    drive_until_running,
    free_port,
    kill_group,
    local_cluster,
    stop_and_reap,
    wait_until,
)
from workspaces.models import Environment, Workspace

pytestmark = [
    pytest.mark.browser,
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(900),
]
# JupyterLab's first load on two busy cores can take minutes.
LAB_TIMEOUT_MS = int(os.environ.get("LAB_TIMEOUT_MS", "240000"))


def _test_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


@dataclass(frozen=True)
class Served:
    portal: str
    ports: str  # GPUPOOL_PORTS_ORIGIN: where JupyterLab runs


@pytest.fixture
def asgi_server(tmp_path):
    """portal.serve (uvicorn: Django + the workspace proxy) on a free port, and the ports'
    origin on another, as `make demo` runs them."""
    if connection.vendor != "postgresql" or "DATABASE_URL" not in os.environ:
        pytest.skip(
            "the server process needs the PostgreSQL test database: run under tests.services"
        )
    port, ports_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "GPUPOOL_VAR_DIR": str(tmp_path / "server-var"),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        # A development server, as `make demo` runs: static files from their folders.
        "DEBUG": "1",
        "SITE_URL": url,
        "GPUPOOL_PORTS_ORIGIN": f":{ports_port}",
    }
    log = (tmp_path / "uvicorn.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "portal.serve",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: _answers(url, proc, tmp_path), 90, "uvicorn to answer")
        yield Served(url, f"http://127.0.0.1:{ports_port}")
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)
        log.close()


def _answers(url: str, proc: subprocess.Popen, tmp_path) -> bool:
    if proc.poll() is not None:
        raise AssertionError((tmp_path / "uvicorn.log").read_text()[-3000:])
    try:
        return httpx.get(f"{url}/accounts/login/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _log_in(context, url: str, username: str):
    tab = context.new_page()
    tab.goto(f"{url}/accounts/login/")
    tab.fill("#id_username", username)
    tab.fill("#id_password", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(re.compile(r"^(?!.*login).*$"))
    return tab


def _cookie_header(context) -> str:
    return "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())


def _server_passwords(*users) -> None:
    """The tests hash with MD5 for speed; the server process only knows the real hashers."""
    hasher = PBKDF2PasswordHasher()
    for user in users:
        user.password = hasher.encode(PASSWORD, hasher.salt())
        user.save(update_fields=["password"])


@pytest.fixture(autouse=True)
def _local_pods(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()


def test_a_researcher_runs_a_cell_in_jupyterlab_and_a_stranger_gets_403(
    org, chromium, asgi_server, settings
):
    _server_passwords(org.researcher, org.outsider)
    cluster = local_cluster()
    Environment.objects.create(
        name="JupyterLab", image="quay.io/jupyter/minimal-notebook",
        command=[sys.executable, "-m", "jupyter", "lab"], description="Python 3 notebooks",
    )  # fmt: skip
    rita = chromium.new_context()
    rita.set_default_timeout(30_000)
    page = _log_in(rita, asgi_server.portal, "rita")
    page.goto(f"{asgi_server.portal}/workspaces/new/")
    page.select_option("#id_project", label="ml-vision")
    page.click("label.env-card:has-text('JupyterLab')")
    page.fill("#id_name", "my-lab")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/workspaces/\d+/$"))
    workspace_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    try:
        drive_until_running(workspace_id, cluster)
        # The page polls its status; the button appears once Jupyter answers.
        page.wait_for_selector("#open-lab", timeout=LAB_TIMEOUT_MS)
        assert "Running" in page.inner_text("#workspace-state")
        with rita.expect_page() as opened:
            page.click("#open-lab")
        lab = opened.value
        lab.set_default_timeout(LAB_TIMEOUT_MS)
        # The portal's link sends the browser to the ports' origin (307).
        lab.wait_for_url(re.compile(rf"^{asgi_server.ports}/workspaces/{workspace_id}/lab/"))
        try:
            _run_print_in_a_new_notebook(lab)
        except Exception:
            lab.screenshot(path=str(settings.VAR_DIR / "lab.png"))
            log = settings.VAR_DIR / "workloads" / str(workspace_id) / "pod-0.log"
            print(log.read_text()[-6000:], f"screenshot: {settings.VAR_DIR / 'lab.png'}")
            raise
        token = Workspace.objects.get(pk=workspace_id).token
        assert token not in lab.content() and token not in page.content()
        _a_stranger_gets_403(chromium, asgi_server, workspace_id, lab, rita)
    finally:
        rita.close()
        stop_and_reap(workspace_id, cluster)


def _run_print_in_a_new_notebook(lab) -> None:
    lab.click(".jp-LauncherCard[data-category='Notebook']")
    # A cell run before the kernel's session exists is silently dropped: wait for it.
    lab.get_by_text("Python 3 (ipykernel) | Idle").wait_for()
    editor = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click()
    lab.keyboard.type("print(6*7)")
    lab.keyboard.press("Shift+Enter")
    output = lab.locator(".jp-OutputArea-output", has_text="42").first
    output.wait_for()
    assert output.inner_text().strip() == "42"


def _a_stranger_gets_403(chromium, served: Served, workspace_id: int, lab, rita) -> None:
    base = f"/workspaces/{workspace_id}/lab/"
    kernels = lab.request.get(f"{served.ports}{base}api/kernels").json()
    ws_url = (
        served.ports.replace("http://", "ws://") + f"{base}api/kernels/{kernels[0]['id']}/channels"
    )
    # The owner's session opens the kernel's WebSocket through the proxy...
    owner = {"Cookie": _cookie_header(rita), "Origin": served.ports}
    with connect(ws_url, additional_headers=owner) as ws:
        assert ws.protocol.state.name == "OPEN"
    otto = chromium.new_context()
    try:
        tab = _log_in(otto, served.portal, "otto")
        response = tab.goto(f"{served.portal}{base}tree")
        # Another project's researcher may not see the workspace: 404, as its page says
        # (a 403 told him it exists); on the ports' origin, nothing of the portal's...
        assert (response.status, tab.url) == (404, f"{served.ports}{base}tree")
        assert tab.inner_text("body").strip() == "Not found."
        # ...and the same handshake is refused (a WebSocket refused before it is accepted
        # is answered HTTP 403, whatever the reason).
        stranger = {"Cookie": _cookie_header(otto), "Origin": served.ports}
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url, additional_headers=stranger)
        assert refused.value.response.status_code == 403
    finally:
        otto.close()
