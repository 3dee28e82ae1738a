from __future__ import annotations

import pytest

from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_researcher_logs_in_through_the_login_form_and_sees_the_overview(live_server, page, org):
    page.goto(f"{live_server.url}/")
    page.fill("#id_username", "rita")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("text=Welcome")
    assert "ml-vision" in page.content()
