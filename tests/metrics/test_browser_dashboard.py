"""The dashboard in a real browser: plotly draws, and the numbers refresh without a reload."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from tests.factories import PASSWORD
from tests.metrics.helpers import allocate, make_node, make_workload

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_dashboard_draws_its_chart_and_updates_numbers_in_place(live_server, page, org):
    node = make_node(org.pool)
    busy = make_workload(org.project_a, org.researcher, "busy")
    allocate(busy, node, [0], at=timezone.now() - dt.timedelta(minutes=1))

    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", "rita")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.goto(f"{live_server.url}/dashboard/")
    page.wait_for_selector("[data-figure] .main-svg")  # plotly.js from static/ drew the chart
    assert page.text_content('[data-metric="allocated"]').strip() == "1"
    page.evaluate("window.__notReloaded = true")

    second = make_workload(org.project_a, org.researcher, "second")
    allocate(second, node, [1, 2], at=timezone.now())

    page.wait_for_function(
        "document.querySelector('[data-metric=\"allocated\"]').textContent.trim() === '3'",
        timeout=15_000,
    )
    assert page.evaluate("window.__notReloaded") is True
