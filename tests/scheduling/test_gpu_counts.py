"""One way to count a workload's GPUs, the same on every page, report and CLI output
(issue 28): a GPU range 2..4 was 4 GPUs asked on the queue and dashboard while its reason
said 2; a MIG workload was 0.429 GPUs on the home page and "1 x MIG 3g.40gb" elsewhere."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from clusters.metrics.selectors import pending_demand
from portal.models import Project
from scheduling.models import Workload, WorkloadState

pytestmark = pytest.mark.django_db


def test_a_gpu_range_is_the_same_figure_everywhere(client_as, org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "ranged", min_gpus=2, max_gpus=4)
    client = client_as(org.researcher)
    for page in ("/workloads/", "/workloads/queue/", "/"):
        assert ">2..4<" in client.get(page).content.decode().replace(" ", ""), page
    assert "<div>2..4 (elastic" in client.get(f"/workloads/{wl.pk}/").content.decode()
    api = APIClient()
    api.force_authenticate(org.researcher)
    assert api.get(f"/api/v1/workloads/{wl.pk}/").json()["gpus_requested"] == "2..4"
    # The dashboard's pending demand counts what it waits for: its minimum.
    demand = pending_demand(Project.objects.all())
    assert demand["total"] == 2.0 and demand["per_project"] == [("ml-vision", 2.0)]


def test_a_running_mig_workload_is_named_as_asked_on_the_home_page(client_as, org, submit):
    wl = submit(org.researcher, org.project_a, "sliced", gpu_request="mig", mig_profile="3g.40gb")
    Workload.objects.filter(pk=wl.pk).update(state=WorkloadState.RUNNING)
    client = client_as(org.researcher)
    for page in ("/", "/workloads/"):
        assert "1 x MIG 3g.40gb" in client.get(page).content.decode(), page
    assert "0.429" not in client.get("/").content.decode()
