"""Onboarding in a real browser: Playwright driving Debian's Chromium against live_server."""

from __future__ import annotations

import re

import pytest
from django.core import mail

from portal.models import Department, Project, ProjectQuota, User
from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("text=Welcome")


def test_an_admin_onboards_a_team_and_the_invited_user_sets_a_password_and_logs_in(
    live_server, page, org, settings
):
    base = live_server.url
    settings.SITE_URL = base
    pool = org.pool
    log_in(page, base, "admin", PASSWORD)

    # A department, with 6 GPUs deserved in a100.
    page.goto(f"{base}/departments/new/")
    page.fill("#id_name", "Robotics")
    page.click("text=Create department")
    page.wait_for_selector("text=Department Robotics")
    page.fill(f"#id_pool-{pool.pk}-gpus", "6")
    page.click("text=Save quotas")
    page.wait_for_selector("text=Quotas of Robotics saved.")
    department = Department.objects.get(name="Robotics")
    assert department.quotas.get().gpus == 6

    # A project in it, with 2.5 GPUs; more than the department has is refused first.
    page.goto(f"{base}/projects/new/?department={department.pk}")
    page.fill("#id_name", "arm-control")
    page.click("text=Create project")
    page.wait_for_selector("text=Quotas of project")
    page.fill(f"#id_pool-{pool.pk}-gpus", "7")
    page.click("text=Save quotas")
    page.wait_for_selector("text=so arm-control can deserve at most 6 (asked 7)")
    page.fill(f"#id_pool-{pool.pk}-gpus", "2.5")
    page.click("text=Save quotas")
    page.wait_for_selector("text=Quotas of arm-control saved.")
    project = Project.objects.get(name="arm-control")
    assert (project.namespace, str(ProjectQuota.objects.get(project=project).gpus)) == (
        "gpupool-arm-control",
        "2.50",
    )

    # An invitation into the project.
    page.goto(f"{base}/users/invite/")
    page.fill("#id_email", "nia@example.com")
    page.fill("#id_first_name", "Nia")
    page.select_option("#id_project", label="arm-control")
    page.click("text=Send invitation")
    page.wait_for_selector("text=Invitation sent to nia@example.com.")
    assert len(mail.outbox) == 1
    link = re.search(r"http://\S+/accounts/reset/\S+", mail.outbox[0].body).group(0)
    page.click("text=Log out")
    page.wait_for_selector("#id_username")

    # The invited user follows the link, sets a password and logs in.
    page.goto(link)
    page.wait_for_selector("text=Set your password")
    page.fill("#id_new_password1", "a-long-new-passphrase-42")
    page.fill("#id_new_password2", "a-long-new-passphrase-42")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Password set")
    log_in(
        page, base, User.objects.get(email="nia@example.com").username, "a-long-new-passphrase-42"
    )
    assert "Welcome, Nia" in page.content()
    assert "arm-control" in page.inner_text("main")
    assert "ml-vision" not in page.inner_text("main")
