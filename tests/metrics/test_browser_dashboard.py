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


# Every element right of the viewport or of its card, except plotly's text-measuring svg
# that it parks off-screen on purpose.
_SPILLS = """() => {
  const out = [];
  for (const card of document.querySelectorAll('.card')) {
    const edge = card.getBoundingClientRect().right;
    for (const el of card.querySelectorAll('table')) {
      const right = el.getBoundingClientRect().right;
      if (right > edge + 1) out.push('table in ' + card.textContent.trim().slice(0, 30));
    }
  }
  for (const el of document.querySelectorAll('header *')) {
    if (el.getBoundingClientRect().right > window.innerWidth + 1) out.push(el.tagName);
  }
  return out;
}"""


@pytest.mark.parametrize("width", [1280, 390])
def test_no_table_spills_out_of_its_card_and_the_bar_is_one_line(live_server, page, org, width):
    node = make_node(org.pool)
    idle = make_workload(org.project_a, org.researcher, "a-workload-with-a-long-name-indeed")
    allocate(idle, node, [0, 1, 2], at=timezone.now() - dt.timedelta(hours=1))
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", org.platform_admin.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.goto(f"{live_server.url}/dashboard/")
    page.wait_for_selector("[data-figure] .main-svg")
    assert page.evaluate(_SPILLS) == []
    if width == 1280:  # every top-level link on one line: the admin pages are in a menu
        tops = page.evaluate(
            "() => [...document.querySelectorAll('.mainnav > a, .mainnav > details > summary')]"
            ".map(e => Math.round(e.getBoundingClientRect().top))"
        )
        assert len(set(tops)) == 1, tops
        page.click(".navmenu summary")
        assert page.is_visible(".navmenu-items a[href='/clusters/']")
