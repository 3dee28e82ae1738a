"""Dashboard, heat map, fragments, tokens, chart partials and /metrics, against each persona."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.template import Context, RequestContext, Template
from django.test import RequestFactory
from django.utils import timezone

from clusters.metrics.models import (
    AllocationInterval,
    GpuUsage,
    NodeToken,
    PoolUsage,
    ProjectUsage,
    Resolution,
)
from clusters.metrics.rollup import rollup_minutes
from clusters.metrics.services import samples_ingest
from clusters.metrics.workload_chart import workload_series
from clusters.models import NodePool
from scheduling.models import CycleRun, CycleState, WorkloadState
from tests.conftest import PERSONAS
from tests.metrics.helpers import allocate, every, make_node, make_workload, sample

pytestmark = pytest.mark.django_db
EVERYONE_PAGES = [
    "/dashboard/",
    "/dashboard/?range=7d",
    "/dashboard/?range=30d",
    "/dashboard/fragment/now/",
    "/dashboard/fragment/chart/",
    "/nodes/heatmap/",
    "/nodes/heatmap/?range=24h",
    "/reports/usage/",
    "/reports/usage/?period=last_month&group=user",
    "/reports/usage.csv",
]


@pytest.fixture
def live(org, settings):
    """Now: a 4-GPU node; rita's `busy` holds GPUs 0-1 at 50 %, otto's `sleepy` holds GPU 2
    at 0 % for six minutes; a pending 4-GPU job in ml-vision."""
    settings.GPUPOOL_METRICS_ROLLUP_LAG_S = 0
    now = timezone.now()
    node = make_node(org.pool)
    busy = make_workload(org.project_a, org.researcher, "busy")
    sleepy = make_workload(org.project_b, org.outsider, "sleepy")
    make_workload(org.project_a, org.researcher, "waiting", gpus=2, pods=2,
                  state=WorkloadState.PENDING)  # fmt: skip
    allocate(busy, node, [0, 1], at=now - dt.timedelta(minutes=7))
    allocate(sleepy, node, [2], at=now - dt.timedelta(minutes=7))
    times = every(now - dt.timedelta(minutes=6), now, 10)
    samples_ingest(
        [sample(node, g, ts, 50.0) for ts in times for g in (0, 1)]
        + [sample(node, 2, ts, 0.0) for ts in times]
    )
    rollup_minutes(now=now)
    return node, busy, sleepy


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("url", EVERYONE_PAGES)
def test_every_signed_in_persona_can_open_the_metrics_pages(live, org, client_as, persona, url):
    assert client_as(getattr(org, persona)).get(url).status_code == 200


@pytest.mark.parametrize("url", [*EVERYONE_PAGES, "/reports/prices/", "/nodes/tokens/"])
def test_anonymous_visitors_are_sent_to_sign_in(client, url):
    response = client.get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("persona", ["dept_admin", "researcher", "outsider"])
def test_only_platform_admins_manage_node_tokens(org, client_as, persona):
    assert client_as(getattr(org, persona)).get("/nodes/tokens/").status_code == 403


def test_the_dashboard_counts_gpus_now_and_lists_idle_workloads_in_scope(live, org, client_as):
    page = client_as(org.platform_admin).get("/dashboard/fragment/now/").content.decode()
    assert 'data-metric="total">4<' in page
    assert 'data-metric="allocated">3<' in page
    assert 'data-metric="used">1.0<' in page  # two GPUs at 50 %
    assert 'data-metric="pending">4 GPUs<' in page
    assert "sleepy" in page and "node-1/gpu2" in page and "busy" not in page

    researcher_view = client_as(org.researcher).get("/dashboard/fragment/now/").content.decode()
    assert "sleepy" not in researcher_view  # otto's workload, another department
    outsider_view = client_as(org.outsider).get("/dashboard/").content.decode()
    assert "sleepy" in outsider_view and "ml-vision" not in outsider_view


def test_the_dashboard_counts_busy_unallocated_gpus_apart_from_allocated_ones(live, org, client_as):
    node, _, _ = live
    now = timezone.now()
    samples_ingest([sample(node, 3, ts, 80.0) for ts in every(now - dt.timedelta(minutes=1), now)])
    page = client_as(org.platform_admin).get("/dashboard/fragment/now/").content.decode()
    assert 'data-metric="used">1.0<' in page  # still only the two allocated GPUs at 50 %
    assert 'data-metric="used_unallocated">0.8<' in page  # GPU 3: nobody holds it
    # Utilisation of allocated: 1.0 busy of 3 allocated GPUs, GPU 3's 0.8 not counted in it.
    assert '<td class="num">33 %</td>' in page


def test_the_overview_chart_is_built_from_pool_rollups(live, org, client_as):
    figure = client_as(org.researcher).get("/dashboard/fragment/chart/").json()
    names = [trace["name"] for trace in figure["data"]]
    assert names[:3] == ["GPUs", "Allocated", "Used"]
    minutes = PoolUsage.objects.filter(resolution=Resolution.MINUTE, pool_id=org.pool.pk).count()
    assert len(figure["data"][0]["x"]) == minutes > 0
    assert max(figure["data"][1]["y"]) == 3.0  # three GPUs held through whole minutes
    assert set(figure["data"][0]["y"]) == {4.0}


def test_the_dashboard_page_hands_the_figure_over_and_loads_local_plotly(live, org, client_as):
    page = client_as(org.researcher).get("/dashboard/").content.decode()
    assert '<script id="overview-figure" type="application/json">' in page
    assert "/static/vendor/plotly/plotly-cartesian-" in page and "cdn" not in page.lower()
    assert 'data-src="/dashboard/fragment/now/' in page


def test_the_heat_map_has_a_row_per_gpu_with_its_utilisation(live, org, client_as):
    page = client_as(org.platform_admin).get("/nodes/heatmap/").content.decode()
    start = page.index('<script id="heatmap-figure" type="application/json">')
    figure = json.loads(page[page.index(">", start) + 1 : page.index("</script>", start)])
    trace = figure["data"][0]
    assert trace["y"] == [f"sim/node-1/gpu{i}" for i in range(4)]
    assert {v for v in trace["z"][0] if v is not None} == {50.0}
    assert {v for v in trace["z"][2] if v is not None} == {0.0}
    assert all(v is None for v in trace["z"][3])  # GPU 3 sent no samples


def test_a_platform_admin_issues_a_token_shown_once_then_revokes_it(live, org, client_as):
    node, _, _ = live
    client = client_as(org.platform_admin)
    page = client.post("/nodes/tokens/", {"issue": node.pk}).content.decode()
    token = NodeToken.objects.get(node=node)
    assert 'id="issued-token">gpn_' in page
    assert token.prefix in page
    assert token.prefix in client.get("/nodes/tokens/").content.decode()
    assert "gpn_" not in client.get("/nodes/tokens/").content.decode().replace(token.prefix, "")

    client.post("/nodes/tokens/", {"revoke": token.pk})
    token.refresh_from_db()
    assert token.revoked_at is not None


def render_tag(tag: str, user, **objects) -> str:
    request = RequestFactory().get("/somewhere/")
    request.user = user
    template = Template("{% load metrics_charts %}" + tag)
    return template.render(RequestContext(request, objects))


def test_the_project_chart_partial_shows_allocation_quota_and_use_to_viewers_only(live, org):
    html = render_tag("{% project_usage_chart project %}", org.researcher, project=org.project_a)
    assert "usage-chart-" in html and "Deserved quota" in html and "plotly-cartesian-" in html
    assert ProjectUsage.objects.filter(project_id=org.project_a.pk).exists()
    hidden = render_tag("{% project_usage_chart project %}", org.outsider, project=org.project_a)
    assert hidden.strip() == ""


def test_the_department_chart_partial_is_for_its_admins_and_members(live, org):
    tag = "{% department_usage_chart department %}"
    assert "Deserved quota" in render_tag(tag, org.dept_admin, department=org.dept_a)
    assert "Deserved quota" in render_tag(tag, org.researcher, department=org.dept_a)
    assert render_tag(tag, org.outsider, department=org.dept_a).strip() == ""


def test_the_workload_chart_partial_draws_util_and_memory_per_gpu(live, org):
    _, busy, _ = live
    html = render_tag("{% workload_gpu_chart workload %}", org.researcher, workload=busy)
    start = html.index('type="application/json">') + len('type="application/json">')
    figure = json.loads(html[start : html.index("</script>", start)])
    names = [t["name"] for t in figure["data"]]
    assert names == ["node-1/gpu0 util %", "node-1/gpu0 memory MiB",
                     "node-1/gpu1 util %", "node-1/gpu1 memory MiB"]  # fmt: skip
    assert set(figure["data"][0]["y"]) == {50.0}
    assert render_tag("{% workload_gpu_chart workload %}", org.outsider, workload=busy) == "\n"


def test_a_workload_older_than_the_minute_rows_is_drawn_from_hour_rows(org):
    node = make_node(org.pool)
    old = make_workload(org.project_a, org.researcher, "old", state=WorkloadState.SUCCEEDED)
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(days=40)
    allocate(old, node, [0], at=start)
    AllocationInterval.objects.filter(workload_id=old.pk).update(
        ended_at=start + dt.timedelta(days=2)
    )
    # Retention has deleted the minute rows (after 35 days); the hour rows remain.
    GpuUsage.objects.bulk_create(
        GpuUsage(resolution=Resolution.HOUR, bucket=start + dt.timedelta(hours=h), node_id=node.pk,
                 gpu_index=0, util_sum=360 * 80.0, util_max=90, mem_used_sum=360 * 2048.0,
                 mem_total_mib=81920, samples=360)
        for h in range(48)
    )  # fmt: skip
    points = workload_series(old)["node-1/gpu0"]
    assert len(points) == 48 and {p[1:] for p in points} == {(80.0, 2048)}


def test_prometheus_metrics_need_the_token(live, client, settings):
    settings.GPUPOOL_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    settings.GPUPOOL_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_prometheus_metrics_expose_quota_allocation_pending_and_cycles(live, org, client, settings):
    settings.GPUPOOL_METRICS_TOKEN = "s3cret"
    CycleRun.objects.create(started_at=timezone.now(), duration_ms=123.0)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200
    lines = set(response.content.decode().splitlines())
    assert (
        'gpupool_project_quota_gpus{project="ml-vision",department="vision",pool="a100"} 4' in lines
    )
    assert 'gpupool_department_quota_gpus{department="language",pool="a100"} 8' in lines
    assert 'gpupool_project_allocated_gpus{project="ml-vision",pool="a100"} 2' in lines
    assert 'gpupool_project_allocated_gpus{project="nlp",pool="a100"} 1' in lines
    assert 'gpupool_pending_gpus{project="ml-vision"} 4' in lines
    assert 'gpupool_pending_workloads{project="ml-vision"} 1' in lines
    assert 'gpupool_gpus{cluster="sim",pool="a100"} 4' in lines
    assert 'gpupool_gpu_utilization_ratio{node="node-1",gpu="0"} 0.5' in lines
    assert "gpupool_cycle_duration_seconds 0.123" in lines
    assert "# TYPE gpupool_pending_gpus gauge" in lines


def test_prometheus_reports_the_last_cycle_that_ended_not_one_still_running(live, client, settings):
    settings.GPUPOOL_METRICS_TOKEN = "s3cret"
    earlier = timezone.now() - dt.timedelta(seconds=10)
    CycleRun.objects.create(started_at=earlier, duration_ms=250.0, ok=True)
    CycleRun.objects.create(
        started_at=timezone.now(), duration_ms=0, ok=False, state=CycleState.RUNNING
    )
    lines = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert "gpupool_cycle_last_ok 1" in lines.splitlines()
    assert "gpupool_cycle_duration_seconds 0.25" in lines.splitlines()


def test_pending_gpu_memory_requests_count_as_their_share_of_a_gpu(live, org, client_as, settings):
    # Two pods asking 40 GiB each of the pool's 80 GiB GPUs: one GPU of demand, not zero.
    make_workload(org.project_a, org.researcher, "notebooks", gpu_request="memory", gpus=0,
                  gpu_memory_mib=40960, pods=2, state=WorkloadState.PENDING)  # fmt: skip
    page = client_as(org.platform_admin).get("/dashboard/fragment/now/").content.decode()
    assert 'data-metric="pending">5 GPUs<' in page
    settings.GPUPOOL_METRICS_TOKEN = "s3cret"
    metrics = client_as(None).get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert 'gpupool_pending_gpus{project="ml-vision"} 5' in metrics.content.decode()


def test_a_pool_filter_narrows_idle_workloads_and_pending_demand_too(live, org, client_as):
    other = NodePool.objects.create(name="h100", cluster=live[0].cluster)
    node = make_node(other, "h100-1", gpus=1, model="H100")
    idle = make_workload(org.project_b, org.outsider, "idle-h100")
    allocate(idle, node, [0], at=timezone.now() - dt.timedelta(minutes=7))
    now = timezone.now()
    samples_ingest([sample(node, 0, ts, 0.0) for ts in every(now - dt.timedelta(minutes=6), now)])
    make_workload(org.project_b, org.outsider, "wants-h100", gpus=3, node_pools=["h100"],
                  state=WorkloadState.PENDING)  # fmt: skip
    client = client_as(org.platform_admin)

    everything = client.get("/dashboard/fragment/now/").content.decode()
    assert "idle-h100" in everything and 'data-metric="pending">7 GPUs<' in everything
    a100 = client.get(f"/dashboard/fragment/now/?pool={org.pool.pk}").content.decode()
    assert "idle-h100" not in a100 and "sleepy" in a100
    assert 'data-metric="pending">4 GPUs<' in a100  # the job that may run anywhere
    h100 = client.get(f"/dashboard/fragment/now/?pool={other.pk}").content.decode()
    assert "idle-h100" in h100 and "sleepy" not in h100
    assert 'data-metric="pending">7 GPUs<' in h100


def test_the_pages_state_the_idle_window_that_is_configured(org, client_as, settings):
    settings.GPUPOOL_METRICS_IDLE_MINUTES = 10
    client = client_as(org.platform_admin)
    now = client.get("/dashboard/fragment/now/").content.decode()
    assert "No allocated GPU has been idle for 10 minutes." in now
    report = client.get("/reports/usage/").content.decode()
    assert "stayed at ~0 % for 10 minutes." in report


def test_template_context_without_request_is_not_needed_for_figures():
    # The figure partial renders from plain context too (used by the report and heat map).
    html = Template('{% include "metrics/_figure.html" %}').render(
        Context({"figure": {"data": []}, "figure_id": "f1"})
    )
    assert 'id="f1"' in html and 'data-figure="f1"' in html


def test_the_workload_page_lists_the_processes_on_its_gpus_now(live, org):
    from clusters.metrics.workload_chart import current_processes

    node, busy, sleepy = live
    now = timezone.now()
    earlier, latest = now - dt.timedelta(seconds=20), now - dt.timedelta(seconds=10)
    mine = {"pid": 41, "used_mib": 30000, "workload_id": busy.pk}
    stray = {"pid": 77, "used_mib": 500}
    theirs = {"pid": 9, "used_mib": 10, "workload_id": sleepy.pk}
    samples_ingest([
        sample(node, 0, earlier, 50.0, processes=[{**mine, "pid": 40}]),  # gone since
        sample(node, 0, latest, 50.0, processes=[mine, stray, {**theirs, "used_mib": 200}]),
        sample(node, 1, latest, 50.0, processes=[{**mine, "pid": 42, "used_mib": 1000}]),
        sample(node, 2, latest, 0.0, processes=[theirs]),
    ])  # fmt: skip
    found = [(p["gpu"], p["pid"], p["used_mib"], p["whose"]) for p in current_processes(busy)]
    assert found == [
        ("node-1/gpu0", 41, 30000, "this workload"),
        ("node-1/gpu1", 42, 1000, "this workload"),
        ("node-1/gpu0", 77, 500, "not GPUPool's"),
        ("node-1/gpu0", 9, 200, "another workload"),
    ]
    html = render_tag("{% workload_gpu_chart workload %}", org.researcher, workload=busy)
    assert 'id="gpu-processes"' in html and "30000 MiB" in html
    assert render_tag("{% workload_gpu_chart workload %}", org.outsider, workload=busy) == "\n"
    # Nothing held now (it finished): no process table.
    AllocationInterval.objects.filter(workload_id=busy.pk).update(ended_at=now)
    assert current_processes(busy) == []
