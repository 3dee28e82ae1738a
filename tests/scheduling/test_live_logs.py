"""Live logs: the workload page follows one pod's log (a fragment it polls), offers the
pods of multi-pod work and a download; the API serves one pod and the state; `gpupool logs
-f` prints new lines until the workload ends."""

from __future__ import annotations

import pytest

from scheduling.cli import new_lines
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadState
from tests.scheduling.test_cli import gp, logged_in  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


class GrowingLogs:
    """A cluster's log stream as the backends give it (`pod_logs` returns the last
    `tail_lines` lines): each read finds one more line per pod, and after `ends_after`
    reads the workload has ended."""

    def __init__(self, workload_id: int, ends_after: int = 99) -> None:
        self.reads = 0
        self.workload_id, self.ends_after = workload_id, ends_after

    def pod_logs(self, name: str, namespace: str, *, tail_lines: int = 500) -> str:
        self.reads += 1
        if self.reads >= self.ends_after:
            Workload.objects.filter(pk=self.workload_id).update(state=WorkloadState.SUCCEEDED)
        lines = [f"{name} step {i}" for i in range(self.reads)]
        return "\n".join(lines[-tail_lines:])


@pytest.fixture
def running(org, cluster, submit, monkeypatch):
    job = submit(org.researcher, org.project_a, "ddp", kind="distributed", gpus=1, workers=3)
    cycle_run()
    job.refresh_from_db()
    assert job.cluster is not None and job.pods == 3
    job.logs = GrowingLogs(job.pk)
    monkeypatch.setattr("clusters.selectors.get_backend", lambda cluster: job.logs)
    return job


def test_the_page_offers_each_pod_follows_the_running_one_and_downloads(client_as, org, running):
    client = client_as(org.researcher)
    page = client.get(f"/workloads/{running.pk}/logs/?pod=2").content.decode()
    assert page.count("<option") == 3 and 'value="2" selected' in page
    assert "logs/fragment/?pod=2" in page and "data-follow checked" in page
    fragment = client.get(f"/workloads/{running.pk}/logs/fragment/?pod=2&tail=1").content.decode()
    assert 'data-following="1"' in fragment and "step" in fragment
    download = client.get(f"/workloads/{running.pk}/logs/download/?pod=1")
    assert download["Content-Type"].startswith("text/plain")
    assert download["Content-Disposition"] == 'attachment; filename="ml-vision-ddp-pod1.log"'
    assert "-1-" in download.content.decode() or "step" in download.content.decode()
    Workload.objects.filter(pk=running.pk).update(state=WorkloadState.SUCCEEDED)
    fragment = client.get(f"/workloads/{running.pk}/logs/fragment/").content.decode()
    assert 'data-following="0"' in fragment and "final output" in fragment


@pytest.mark.parametrize("query", ["pod=3", "pod=-1", "pod=x", "tail=0", "tail=10001"])
def test_a_pod_or_tail_out_of_range_is_a_400(client_as, org, running, query):
    client = client_as(org.researcher)
    for path in ("", "fragment/", "download/"):
        response = client.get(f"/workloads/{running.pk}/logs/{path}?{query}")
        assert response.status_code == 400, (path, query)
    api = client.get(f"/api/v1/workloads/{running.pk}/logs/?{query}")
    assert api.status_code == 400 and query.split("=")[0] in api.json()


def test_others_cannot_read_or_download_the_log(client_as, org, running):
    client = client_as(org.outsider)
    for path in ("", "fragment/", "download/"):
        assert client.get(f"/workloads/{running.pk}/logs/{path}").status_code == 404, path
    assert client.get(f"/api/v1/workloads/{running.pk}/logs/").status_code == 404


def test_the_api_serves_one_pod_and_the_state(client_as, org, running):
    body = client_as(org.researcher).get(f"/api/v1/workloads/{running.pk}/logs/?pod=1").json()
    assert [p["pod"] for p in body["pods"]] == [1]
    assert body["state"] in ("admitted", "running") and body["unavailable"] == ""


def test_logs_follow_prints_each_new_line_once_until_the_workload_ends(logged_in, running):  # noqa: F811
    running.logs.ends_after = 3 * 4  # three pods are read per poll: the 4th poll sees the end
    out = logged_in("logs", str(running.pk), "-f", "--interval", "1")
    lines = out.splitlines()
    for pod in range(3):
        mine = [line for line in lines if line.startswith(f"[pod {pod}] ")]
        steps = [int(line.rsplit(" ", 1)[1]) for line in mine]
        assert steps == sorted(set(steps)) and len(steps) >= 3, out  # each line once, in order
    assert Workload.objects.get(pk=running.pk).state == WorkloadState.SUCCEEDED


def test_new_lines_takes_what_follows_the_overlap_and_notices_a_gap():
    assert new_lines(None, ["a", "b"]) == (["a", "b"], False)
    assert new_lines(["a", "b"], ["a", "b", "c"]) == (["c"], False)
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == (["d", "e"], False)  # window slid
    assert new_lines(["a", "b"], ["a", "b"]) == ([], False)
    assert new_lines(["x", "x"], ["x", "x", "x"]) == (["x"], False)
    assert new_lines(["a", "b"], ["y", "z"]) == (["y", "z"], True)  # more than the tail came
    assert new_lines([], ["a"]) == (["a"], False)
