"""Workload pages in a real browser: the form's GPU fields follow the request kind, a
submission lands on its page, and the list sorts by clicking a column header."""

from __future__ import annotations

import pytest

from scheduling.models import Workload
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def test_a_researcher_submits_training_and_sorts_the_list(live_server, page, org, submit):
    submit(org.researcher, org.project_a, "small", gpus=1)
    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/workloads/new/training/")
    assert page.is_hidden("#row-gpu_memory_mib")
    page.select_option("#id_gpu_request", "memory")
    assert page.is_visible("#row-gpu_memory_mib") and page.is_hidden("#row-gpus")
    page.select_option("#id_gpu_request", "whole")
    page.fill("#id_name", "Not Valid")
    page.fill("#id_image", "pytorch/pytorch:2.3")
    page.fill("#id_gpus", "3")
    page.click("#workload-form button[type=submit]")
    assert "lower-case letters" in page.text_content("#row-name .errorlist")
    page.fill("#id_name", "big")
    page.click("#workload-form button[type=submit]")
    page.wait_for_url(f"**/workloads/{Workload.objects.get(name='big').pk}/")
    assert "big is queued." in page.text_content(".messages")
    page.goto(f"{live_server.url}/workloads/")
    page.click("[data-sort-key=gpus]")
    page.wait_for_url(lambda url: url.endswith("sort=gpus"))
    names = page.locator("#workloads tbody tr td:first-child a").all_text_contents()
    assert names == ["small", "big"]
    page.click("[data-sort-key=gpus]")
    page.wait_for_url(lambda url: url.endswith("sort=-gpus"))
    names = page.locator("#workloads tbody tr td:first-child a").all_text_contents()
    assert names == ["big", "small"]


def test_the_workload_page_follows_its_state_without_a_reload(
    live_server, page, org, cluster, submit
):
    from scheduling.cycle import cycle_run

    wl = submit(org.researcher, org.project_a, "watched", gpus=2)
    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/workloads/{wl.pk}/")
    assert page.text_content("#workload-state") == "pending"
    page.evaluate("window.__notReloaded = true")
    cycle_run()
    page.wait_for_function(
        "document.getElementById('workload-state').textContent === 'admitted'", timeout=15_000
    )
    assert "Placed in pool a100" in page.text_content("#workload-live")
    assert page.evaluate("window.__notReloaded") is True
