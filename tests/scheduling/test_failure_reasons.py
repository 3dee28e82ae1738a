"""Failed work says why wherever it shows (issue 28): the home page, the list, the logs
page, the logs API and `gpupool logs` (which exits 1 for a failed workload); and a launch's
"is queued." banner is not shown above a state that says otherwise.

Before: failed items showed no reason on the home page; the logs page of a failed workload
said only "(no output yet)"; `gpupool logs` printed nothing and exited 0; the workspace page
kept "Workspace nb1 is queued." above "State: Failed".
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from django.utils import timezone
from rest_framework.test import APIClient

from scheduling import services
from scheduling.cli import main
from scheduling.models import WorkloadState
from tests import factories as f

pytestmark = pytest.mark.django_db

WHY = "Its container exited with an error: CUDA out of memory"


@pytest.fixture
def failed(org, submit):
    wl = submit(org.researcher, org.project_a, "doomed", gpus=1)
    wl.state, wl.message, wl.exit_code = WorkloadState.FAILED, WHY, 137
    wl.finished_at = timezone.now()
    wl.save()
    return wl


def test_the_home_page_and_the_list_say_why_it_failed(client_as, org, failed):
    client = client_as(org.researcher)
    expected = f"{WHY} (exit code 137)"
    for page in ("/", "/home/fragment/", "/workloads/"):
        assert expected in client.get(page).content.decode(), page


def test_the_logs_page_says_why_and_not_that_output_may_come(client_as, org, failed):
    page = client_as(org.researcher).get(f"/workloads/{failed.pk}/logs/").content.decode()
    assert f"Failed: {WHY} (exit code 137)" in page
    assert "(no output yet)" not in page


def test_the_logs_api_and_cli_say_why_and_the_cli_exits_1(
    org, failed, live_server, tmp_path, monkeypatch
):
    client = APIClient()
    client.force_authenticate(org.researcher)
    body = client.get(f"/api/v1/workloads/{failed.pk}/logs/").json()
    assert body["why"] == f"{WHY} (exit code 137)"
    monkeypatch.setenv("GPUPOOL_CONFIG_DIR", str(tmp_path))
    runner = CliRunner()
    login = ["login", "--url", live_server.url, "--username", "rita", "--password", f.PASSWORD]
    assert runner.invoke(main, login).exit_code == 0
    result = runner.invoke(main, ["logs", str(failed.pk)])
    assert result.exit_code == 1
    assert f"Failed: {WHY} (exit code 137)" in result.output


def test_the_queued_banner_goes_once_the_workload_left_the_queue(client_as, org, cluster):
    client = client_as(org.researcher)
    form = {"project": org.project_a.pk, "name": "quick", "image": "img",
            "gpu_request": "whole", "gpus": "1", "cpu": "1", "memory_mib": "1024"}  # fmt: skip
    response = client.post("/workloads/new/training/", form)
    assert response.status_code == 302
    from scheduling.models import Workload

    wl = Workload.objects.get(name="quick")
    wl.state, wl.message = WorkloadState.FAILED, WHY
    wl.save()
    page = client.get(response.url).content.decode()
    assert "quick is queued." not in page and WHY in page
    # While it is still queued, the banner says so.
    response = client.post("/workloads/new/training/", {**form, "name": "waiting"})
    assert "waiting is queued." in client.get(response.url).content.decode()


def test_work_stopped_by_someone_says_who_on_the_home_page_list_and_api(client_as, org, submit):
    """A stop from the portal or the CLI keeps its message on the row (it was only in the
    event: the home page and the lists said nothing)."""
    wl = submit(org.researcher, org.project_a, "halted", gpus=1)
    services.workload_stop(actor=org.dept_admin, workload=wl)
    client = client_as(org.researcher)
    for page in ("/", "/home/fragment/", "/workloads/"):
        assert "By dana." in client.get(page).content.decode(), page
    api = APIClient()
    api.force_authenticate(org.researcher)
    assert api.get(f"/api/v1/workloads/{wl.pk}/").json()["why"] == "By dana."
