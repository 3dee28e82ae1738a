"""No page asks another host for anything (issue 28): an air-gapped installation, common for
GPU clusters, serves everything itself. /api/docs/ once fetched Google Fonts (a console
ERR_NAME_NOT_RESOLVED offline).

Chromium, signed in as a platform admin, opens the overview and every page its links reach
(one level deep), the API docs and the admin site; any request to another host fails the
test. Break checked: with Redoc as before it failed on fonts.googleapis.com (drf-spectacular's
page for it), then, without those links, on cdn.redoc.ly (Redoc's logo, loaded whatever its
options): the docs are Swagger UI from drf-spectacular-sidecar now.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.factories import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# Links that end the session or change something when followed
SKIP = ("/logout", "/oidc/", "/accounts/logout")
MAX_PAGES = 40


def test_no_page_requests_anything_from_another_host(live_server, page, org):
    own = urlsplit(live_server.url).netloc
    foreign: list[str] = []
    page.on(
        "request",
        lambda request: foreign.append(request.url)
        if urlsplit(request.url).netloc not in (own, "")
        and urlsplit(request.url).scheme in ("http", "https", "ws", "wss")
        else None,
    )
    page.goto(f"{live_server.url}/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("text=Welcome")
    links = page.eval_on_selector_all("a[href^='/']", "els => els.map(e => e.getAttribute('href'))")
    paths = ["/api/docs/", "/django-admin/"]
    paths += [link for link in dict.fromkeys(links) if not link.startswith(SKIP)]
    for path in paths[:MAX_PAGES]:
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
    assert len(paths) > 5, paths
    assert not foreign, foreign
