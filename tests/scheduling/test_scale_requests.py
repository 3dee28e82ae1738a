"""Scale-on-requests: the portal's proxy counts requests per workload (scheduling/load.py)
and an elastic service wants ceil(requests per minute / target) replicas, changed at most
once per cool-down (scheduling/autoscale.py)."""

from __future__ import annotations

import datetime as dt
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.cache import cache

from portal.errors import ValidationFailed
from scheduling import load
from scheduling.cli import submission
from scheduling.cycle import cycle_run
from scheduling.load import requests_per_minute
from scheduling.models import Workload
from tests.scheduling.test_elastic import _pods
from tests.workspaces.test_proxy import _session_cookie, call_http

pytestmark = pytest.mark.django_db(transaction=True)


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    """A real HTTP server standing for the service's replica 0."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def service(org, cluster, submit, server):
    cache.clear()  # counters of an earlier test's workload of the same id
    svc = submit(
        org.researcher, org.project_a, "svc", kind="inference", gpus=1, ports=[8000],
        min_replicas=1, max_replicas=4, scale_target_requests=1, scale_cooldown_s=120,
    )  # fmt: skip
    return svc


def _minute(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds - seconds % 60, tz=dt.UTC)


def _call(client, org, svc, count: int, at: float, monkeypatch) -> None:
    """`count` requests by the owner to the service's link, at epoch second `at`."""
    monkeypatch.setattr(load, "clock", lambda: at)
    cookie = _session_cookie(client, org.researcher)
    for _ in range(count):
        assert call_http(f"/workloads/{svc.pk}/ports/http/", cookie)[2] == b"ok"


def test_requests_through_the_proxy_scale_a_service_up_after_the_cool_down(
    client, org, service, server, monkeypatch
):
    t0 = _minute(dt.datetime.now(tz=dt.UTC).timestamp()).timestamp()
    cycle_run(_minute(t0))
    assert _pods(service) == [0]  # no requests yet: its minimum
    service.allocations.update(ports={"http": server})  # as the backend reports it
    # 6 requests in 2 minutes: 3 a minute, 1 per replica a minute wanted: 3 replicas.
    _call(client, org, service, 6, t0 + 10, monkeypatch)
    cycle_run(dt.datetime.fromtimestamp(t0 + 60, tz=dt.UTC))
    assert _pods(service) == [0, 1, 2]
    # 10 more: 5 a minute, but within the cool-down nothing changes.
    _call(client, org, service, 10, t0 + 70, monkeypatch)
    cycle_run(dt.datetime.fromtimestamp(t0 + 100, tz=dt.UTC))
    assert _pods(service) == [0, 1, 2]
    cycle_run(dt.datetime.fromtimestamp(t0 + 180, tz=dt.UTC))  # the cool-down is over
    assert _pods(service) == [0, 1, 2, 3]  # 5 a minute asks for 5: capped at the maximum
    # The same load again: no change, no flapping.
    _call(client, org, service, 10, t0 + 250, monkeypatch)
    for second in (300, 330, 360):
        cycle_run(dt.datetime.fromtimestamp(t0 + second, tz=dt.UTC))
        assert _pods(service) == [0, 1, 2, 3]
    service.refresh_from_db()
    assert service.spec["wanted_replicas"] == 4
    # No requests for a cool-down: back to the minimum, in words on its timeline.
    cycle_run(dt.datetime.fromtimestamp(t0 + 600, tz=dt.UTC))
    assert _pods(service) == [0]
    event = service.events.filter(type="resized").last()
    assert event.reason == "ScaledDown"
    assert "0.0 requests per replica a minute is under the target of 1" in event.message


def test_refused_requests_are_not_counted(client, org, service, server, monkeypatch):
    now = dt.datetime.now(tz=dt.UTC).timestamp()
    cycle_run(dt.datetime.fromtimestamp(now, tz=dt.UTC))
    service.allocations.update(ports={"http": server})
    monkeypatch.setattr(load, "clock", lambda: now)
    outsider = _session_cookie(client, org.outsider)
    assert call_http(f"/workloads/{service.pk}/ports/http/", outsider)[0] == 404  # unseen
    assert call_http(f"/workloads/{service.pk}/ports/http/")[0] != 200
    assert requests_per_minute(service.pk, 120, now) == 0
    _call(client, org, service, 2, now, monkeypatch)
    assert requests_per_minute(service.pk, 120, now) == 1.0


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"scale_target_requests": 0}, "scale_target_requests"),
        ({"scale_target_requests": 60_001}, "scale_target_requests"),
        ({"scale_target_requests": 2.5}, "scale_target_requests"),
        ({"scale_target_requests": "lots"}, "scale_target_requests"),
        ({"scale_cooldown_s": 60}, "scale_target"),
    ],
)
def test_a_bad_requests_target_is_refused_naming_the_field(org, cluster, submit, spec, field):
    with pytest.raises(ValidationFailed) as refused:
        submit(
            org.researcher, org.project_a, "s", kind="inference", gpus=1, ports=[8000],
            min_replicas=1, max_replicas=3, **spec,
        )  # fmt: skip
    assert list(refused.value.errors) == [field]


def test_only_an_elastic_service_scales_on_requests(org, cluster, submit):
    with pytest.raises(ValidationFailed) as refused:
        submit(org.researcher, org.project_a, "s", kind="inference", gpus=1, ports=[8000],
               scale_target_requests=10)  # fmt: skip
    assert "scale_target_requests" in refused.value.errors


def test_the_api_form_and_cli_take_the_requests_target(client_as, org, cluster):
    body = {
        "project": org.project_a.name, "kind": "inference", "name": "api-svc", "image": "x",
        "ports": [{"name": "http", "port": 8000}], "gpus": 1, "min_replicas": 1,
        "max_replicas": 3, "scale_target_requests": 120,
    }  # fmt: skip
    client = client_as(org.researcher)
    made = client.post("/api/v1/workloads/", body, content_type="application/json")
    assert made.status_code == 201, made.content
    assert made.json()["spec"]["scale_target_requests"] == 120
    bad = client.post(
        "/api/v1/workloads/",
        {**body, "name": "api-bad", "scale_target_requests": 0},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "scale_target_requests" in bad.json()
    post = {
        "project": org.project_a.pk, "name": "form-svc", "image": "x", "gpu_request": "whole",
        "gpus": "1", "cpu": "1", "memory_mib": "1024", "ports": "8000", "min_replicas": "1",
        "max_replicas": "3", "scale_target_requests": "90", "priority_class": "inference",
    }  # fmt: skip
    page = client.post("/workloads/new/inference/", post)
    assert page.status_code == 302, page.context["form"].errors
    svc = Workload.objects.get(name="form-svc")
    assert svc.spec["scale_target_requests"] == 90
    clone = client.get(f"/workloads/{svc.pk}/clone/")
    assert clone.context["form"].initial["scale_target_requests"] == 90
    bad_form = client.post(
        "/workloads/new/inference/", {**post, "name": "f2", "scale_target_requests": "0"}
    )
    assert "scale_target_requests" in bad_form.context["form"].errors
    options = {"gpus": "1", "gpu_memory": None, "scale_requests": 30, "scale_cooldown": 90}
    assert submission("inference", options)["scale_target_requests"] == 30


def test_the_workload_page_shows_the_scaling_rule(client_as, org, cluster, submit):
    svc = submit(
        org.researcher, org.project_a, "svc", kind="inference", gpus=1, ports=[8000],
        min_replicas=1, max_replicas=3, scale_target_requests=120, scale_cooldown_s=90,
    )  # fmt: skip
    page = client_as(org.researcher).get(f"/workloads/{svc.pk}/").content.decode()
    assert "scales at 120 requests per replica a minute (cool-down 90 s)" in page
    assert client_as(org.outsider).get(f"/workloads/{svc.pk}/").status_code == 404
