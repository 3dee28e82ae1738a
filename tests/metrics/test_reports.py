"""Usage reports on hand-made data, per scope, with costs and CSV."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest

from clusters.metrics.allocations import allocations_sync
from clusters.metrics.hourly import rollup_hours
from clusters.metrics.models import AllocationInterval
from clusters.metrics.reports import period_for, report_total, usage_report
from clusters.metrics.rollup import rollup_minutes
from clusters.metrics.services import gpu_price_set, samples_ingest
from portal.models import AuditLog, Project
from portal.permissions import visible_projects
from tests.metrics.helpers import T0, allocate, every, make_node, make_workload, sample

pytestmark = pytest.mark.django_db
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = T0.date()
REPORT_URL = f"/reports/usage/?period=custom&start={DAY}&end={DAY}"


@pytest.fixture
def usage(org, settings):
    """- big (ml-detect, by dana): A100 GPUs 0,1,2 for 10 min at 100/50/0 %:
         0.5 GPU-h allocated, 0.25 used, 0.1 idle, 0.1667 over ml-detect's quota of 2.
    - small (ml-vision, by rita): half of A100 GPU 3 from 2:30 at 40 %: 0.0625 h, 0.025 used.
    - chat (nlp, by otto): one H100 for 30 min at 60 %: 0.5 h allocated, 0.3 used.
    Prices: A100 2.00/h, H100 4.00/h."""
    settings.GPUPOOL_METRICS_RAW_DAYS = 100_000
    a100 = make_node(org.pool, "a100-1", model="A100")
    h100 = make_node(org.pool, "h100-1", gpus=1, model="H100")
    big = make_workload(org.project_a2, org.dept_admin, "big")
    small = make_workload(org.project_a, org.researcher, "small")
    chat = make_workload(org.project_b, org.outsider, "chat")
    allocate(big, a100, [0, 1, 2], at=T0)
    allocate(small, a100, shared_gpu_index=3, share=0.5, at=T0 + 2.5 * MIN)
    allocate(chat, h100, [0], at=T0)
    allocations_sync(T0)
    AllocationInterval.objects.exclude(workload_id=chat.pk).update(ended_at=T0 + 10 * MIN)
    AllocationInterval.objects.filter(workload_id=chat.pk).update(ended_at=T0 + 30 * MIN)
    utils = {0: 100.0, 1: 50.0, 2: 0.0, 3: 40.0}
    samples = [sample(a100, g, ts, u) for ts in every(T0, T0 + 10 * MIN) for g, u in utils.items()]
    samples += [sample(h100, 0, ts, 60.0) for ts in every(T0, T0 + 30 * MIN)]
    samples_ingest(samples)
    gpu_price_set(actor=org.platform_admin, gpu_model="A100", price_per_hour=Decimal("2.00"))
    gpu_price_set(actor=org.platform_admin, gpu_model="H100", price_per_hour=Decimal("4.00"))
    rollup_minutes(now=T0 + 62 * MIN)
    return big, small, chat


def report(user, group="project", hours=True):
    if hours:
        rollup_hours()
    start, end = period_for("custom", T0, DAY, DAY)
    rows = usage_report(visible_projects(user), start, end, group)
    return {r.name: row_tuple(r) for r in rows}


def row_tuple(r):
    hours = (r.allocated_h, r.used_h, r.idle_h, r.over_quota_h)
    return (*(round(h, 4) for h in hours), r.cost.quantize(Decimal("0.01")))


def test_the_platform_admin_sees_every_project_with_hours_and_costs(usage, org):
    assert report(org.platform_admin) == {
        "ml-detect": (0.5, 0.25, 0.1, 0.1667, Decimal("1.00")),
        "nlp": (0.5, 0.3, 0.0, 0.0, Decimal("2.00")),
        "ml-vision": (0.0625, 0.025, 0.0, 0.0, Decimal("0.12")),
    }


def test_minute_rows_give_the_same_report_before_the_hour_rollup(usage, org):
    assert report(org.platform_admin, hours=False) == report(org.platform_admin, hours=True)


def test_a_department_admin_sees_only_their_departments_projects(usage, org):
    assert set(report(org.dept_admin)) == {"ml-detect", "ml-vision"}
    assert report(org.dept_admin, "department") == {
        "vision": (0.5625, 0.275, 0.1, 0.1667, Decimal("1.12"))
    }


def test_a_researcher_sees_only_their_project_and_the_outsider_only_theirs(usage, org):
    assert set(report(org.researcher)) == {"ml-vision"}
    assert set(report(org.outsider)) == {"nlp"}


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("user", {"dana": 0.5, "otto": 0.5, "rita": 0.0625}),
        ("gpu_model", {"A100": 0.5625, "H100": 0.5}),
        ("pool", {"a100": 1.0625}),
    ],
)
def test_reports_group_by_user_gpu_model_and_node_pool(usage, org, group, expected):
    assert {name: row[0] for name, row in report(org.platform_admin, group).items()} == expected


def test_the_total_divides_summed_hours_instead_of_averaging_percentages(usage, org):
    start, end = period_for("custom", T0, DAY, DAY)
    total = report_total(usage_report(Project.objects.all(), start, end, "project"))
    # (0.25 + 0.025 + 0.3) / (0.5 + 0.0625 + 0.5) = 54.1 %; the mean of 50, 40, 60 would be 50.
    assert total.utilisation_pct == pytest.approx(54.1176, abs=1e-3)


def test_periods_cover_this_month_last_month_and_whole_custom_days():
    now = dt.datetime(2026, 3, 15, 12, 30, tzinfo=dt.UTC)
    assert period_for("this_month", now) == (dt.datetime(2026, 3, 1, tzinfo=dt.UTC), now)
    assert period_for("last_month", now) == (
        dt.datetime(2026, 2, 1, tzinfo=dt.UTC), dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    )  # fmt: skip
    assert period_for("custom", now, dt.date(2026, 1, 5), dt.date(2026, 1, 6)) == (
        dt.datetime(2026, 1, 5, tzinfo=dt.UTC), dt.datetime(2026, 1, 7, tzinfo=dt.UTC)
    )  # fmt: skip


def test_the_report_page_shows_the_scope_of_each_persona(usage, org, client_as):
    rollup_hours()
    page = client_as(org.researcher).get(REPORT_URL).content.decode()
    assert "ml-vision" in page and "ml-detect" not in page and "nlp" not in page
    page = client_as(org.platform_admin).get(REPORT_URL).content.decode()
    assert all(name in page for name in ("ml-vision", "ml-detect", "nlp"))
    assert 'id="report-figure"' in page


def test_the_csv_has_a_row_per_group_and_a_total(usage, org, client_as):
    rollup_hours()
    response = client_as(org.dept_admin).get(REPORT_URL.replace("usage/", "usage.csv"))
    assert response["Content-Type"] == "text/csv"
    day = f"{DAY:%Y%m%d}"
    assert f'filename="gpu-usage-{day}-{day}-project.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][:4] == ["project", "allocated_gpu_hours", "used_gpu_hours", "utilization_pct"]
    assert rows[1][:7] == ["ml-detect", "0.5000", "0.2500", "50.00", "0.1000", "0.1667", "1.00"]
    assert rows[2][:2] == ["ml-vision", "0.0625"]
    assert rows[3][:4] == ["Total", "0.5625", "0.2750", "48.89"]


def test_an_invalid_custom_period_shows_the_error_and_no_figures(usage, org, client_as):
    rollup_hours()
    response = client_as(org.platform_admin).get("/reports/usage/?period=custom&start=2026-03-05")
    page = response.content.decode()
    assert response.status_code == 200
    assert "needs a start and an end" in page
    assert "The report cannot be shown" in page
    # Not this month's figures under a period the user did not ask for.
    assert 'id="usage-table"' not in page and 'id="report-figure"' not in page
    assert "ml-detect" not in page and "Download CSV" not in page
    page = client_as(org.platform_admin).get(REPORT_URL).content.decode()
    assert 'id="usage-table"' in page and "ml-detect" in page


def test_the_csv_of_a_period_ending_before_it_starts_is_refused_with_the_reason(
    usage, org, client_as
):
    url = "/reports/usage.csv?period=custom&start=2026-03-05&end=2026-03-01"
    response = client_as(org.platform_admin).get(url)
    assert response.status_code == 400
    assert "end: The end comes before the start." in response.content.decode()
    assert "attachment" not in response.get("Content-Disposition", "")
    page = client_as(org.platform_admin).get(url.replace("usage.csv", "usage/"))
    assert "The end comes before the start." in page.content.decode()


def test_each_bad_field_of_the_report_form_says_what_is_wrong(usage, org, client_as):
    url = "/reports/usage/?period=custom&start=2026-02-31&end=2026-03-01&group=colour"
    page = client_as(org.platform_admin).get(url).content.decode()
    assert "Enter a valid date." in page
    assert "Select a valid choice. colour is not one of the available choices." in page


def test_csv_names_that_look_like_formulas_stay_text(usage, org, client_as):
    org.dept_a.name = "=HYPERLINK(1)"
    org.dept_a.save()
    rollup_hours()
    url = REPORT_URL.replace("usage/", "usage.csv") + "&group=department"
    rows = list(csv.reader(io.StringIO(client_as(org.dept_admin).get(url).content.decode())))
    assert [row[0] for row in rows] == ["department", "'=HYPERLINK(1)", "Total"]


def test_only_platform_admins_set_prices_and_each_change_is_audited(org, client_as):
    for persona in (org.dept_admin, org.researcher, org.outsider):
        assert client_as(persona).get("/reports/prices/").status_code == 403
    client = client_as(org.platform_admin)
    response = client.post("/reports/prices/", {"gpu_model": "L40S", "price_per_hour": "1.25"})
    assert response.status_code == 302
    assert AuditLog.objects.filter(action="gpu_price.set", object_repr__startswith="L40S").exists()
    assert "L40S" in client.get("/reports/prices/").content.decode()
    bad = client.post("/reports/prices/", {"gpu_model": "L40S", "price_per_hour": "-1"})
    assert bad.status_code == 200 and "greater than or equal to 0" in bad.content.decode()


def test_usage_across_a_month_boundary_is_split_at_utc_midnight(org, settings):
    """A job from 23:30 on 28 February to 00:30 on 1 March (UTC), sampled by an agent whose
    clock writes +02:00, under a site time zone with half-hour offsets."""
    settings.TIME_ZONE = "Asia/Kolkata"
    settings.GPUPOOL_METRICS_RAW_DAYS = 100_000
    node = make_node(org.pool)
    work = make_workload(org.project_a, org.researcher, "midnight")
    start = dt.datetime(2026, 2, 28, 23, 30, tzinfo=dt.UTC)
    allocate(work, node, [0], at=start)
    allocations_sync(start)
    AllocationInterval.objects.update(ended_at=start + 60 * MIN)
    plus_two = dt.timezone(dt.timedelta(hours=2))
    samples_ingest([
        sample(node, 0, ts.astimezone(plus_two).isoformat(), 50.0)
        for ts in every(start, start + 60 * MIN, 30)
    ])  # fmt: skip
    rollup_minutes(now=start + 2 * HOUR)
    rollup_hours()
    now = dt.datetime(2026, 3, 15, tzinfo=dt.UTC)
    for preset in ("last_month", "this_month"):
        rows = usage_report(Project.objects.all(), *period_for(preset, now), "project")
        assert [(r.name, round(r.allocated_h, 4), round(r.used_h, 4)) for r in rows] == [
            ("ml-vision", 0.5, 0.25)
        ], preset


@pytest.fixture
def two_clusters(org, settings):
    """One pool over two clusters: train (ml-vision) on east's A100 for 30 min at 50 %,
    chat (nlp) on west's H100 for 60 min at 100 %."""
    from clusters.models import Cluster

    settings.GPUPOOL_METRICS_RAW_DAYS = 100_000
    east = Cluster.objects.create(name="east", backend="simulated")
    west = Cluster.objects.create(name="west", backend="simulated")
    a100 = make_node(org.pool, "east-1", gpus=1, model="A100", cluster=east)
    h100 = make_node(org.pool, "west-1", gpus=1, model="H100", cluster=west)
    train = make_workload(org.project_a, org.researcher, "train")
    chat = make_workload(org.project_b, org.outsider, "chat")
    allocate(train, a100, [0], at=T0)
    allocate(chat, h100, [0], at=T0)
    allocations_sync(T0)
    AllocationInterval.objects.filter(workload_id=train.pk).update(ended_at=T0 + 30 * MIN)
    AllocationInterval.objects.filter(workload_id=chat.pk).update(ended_at=T0 + 60 * MIN)
    samples = [sample(a100, 0, ts, 50.0) for ts in every(T0, T0 + 30 * MIN)]
    samples += [sample(h100, 0, ts, 100.0) for ts in every(T0, T0 + 60 * MIN)]
    samples_ingest(samples)
    rollup_minutes(now=T0 + 62 * MIN)
    return east, west


@pytest.mark.parametrize("hours", [True, False])
def test_reports_group_by_cluster_and_filter_to_one(two_clusters, org, hours):
    east, west = two_clusters
    if hours:
        rollup_hours()
    start, end = period_for("custom", T0, DAY, DAY)
    everyone = visible_projects(org.platform_admin)
    rows = {
        r.name: (r.allocated_h, r.used_h) for r in usage_report(everyone, start, end, "cluster")
    }
    assert rows == {"west": (1.0, 1.0), "east": (0.5, 0.25)}
    on_east = usage_report(everyone, start, end, "project", cluster=east.pk)
    assert [(r.name, r.allocated_h) for r in on_east] == [("ml-vision", 0.5)]
    # The scope still holds: nlp's researcher sees nothing of ml-vision's on east.
    assert usage_report(visible_projects(org.outsider), start, end, "project", east.pk) == []


def test_the_report_page_and_csv_filter_by_cluster(two_clusters, org, client_as):
    east, _ = two_clusters
    rollup_hours()
    client = client_as(org.platform_admin)
    page = client.get(f"{REPORT_URL}&cluster={east.pk}").content.decode()
    assert "on cluster east" in page and "ml-vision" in page and "nlp" not in page
    csv_url = REPORT_URL.replace("usage/", "usage.csv") + f"&group=cluster&cluster={east.pk}"
    response = client.get(csv_url)
    assert response["Content-Disposition"].endswith(f'-{DAY:%Y%m%d}-cluster-east.csv"')
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert [row[:2] for row in rows] == [
        ["cluster", "allocated_gpu_hours"], ["east", "0.5000"], ["Total", "0.5000"]
    ]  # fmt: skip
    bad = client.get(REPORT_URL.replace("usage/", "usage.csv") + "&cluster=999999")
    assert bad.status_code == 400 and "cluster:" in bad.content.decode()


def test_rows_rolled_up_before_clusters_were_recorded_get_theirs(two_clusters, org):
    import importlib

    from django.apps import apps

    from clusters.metrics.models import WorkloadUsage

    east, west = two_clusters
    WorkloadUsage.objects.update(cluster_id=None)
    migration = importlib.import_module("clusters.metrics.migrations.0003_workload_usage_cluster")
    migration.backfill(apps, None)
    found = dict(WorkloadUsage.objects.values_list("project_id", "cluster_id").distinct())
    assert found == {org.project_a.pk: east.pk, org.project_b.pk: west.pk}
