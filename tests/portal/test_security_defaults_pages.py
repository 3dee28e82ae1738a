"""DEBUG off unless set, a secret key of the installation's own, and styled error pages for users.

Django's technical pages (tracebacks, settings, URL patterns) reach staff only, and only with
DEBUG on; everyone else gets the styled 400/403/404/500 pages with the navigation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import SuspiciousOperation
from django.test import Client
from django.urls import path

from portal.urls import urlpatterns as portal_urlpatterns

BASE_DIR = Path(__file__).resolve().parents[2]
NAVIGATION = 'href="/workloads/queue/"'
TECHNICAL = ("Traceback", "SECRET_KEY", "Using the URLconf", "DEBUG = True", "INSTALLED_APPS")


def _boom(request):
    raise RuntimeError("the database said no")


def _suspicious(request):
    raise SuspiciousOperation("odd")


# This module doubles as the URLconf of the tests below: the portal's, plus views that fail.
urlpatterns = [
    path("boom/", _boom),
    path("api/v1/boom/", _boom),
    path("suspicious/", _suspicious),
    *portal_urlpatterns,
]
handler400 = "portal.errors.bad_request"
handler403 = "portal.errors.permission_denied"
handler404 = "portal.errors.page_not_found"
handler500 = "portal.errors.server_error"


def settings_in_a_fresh_process(var_dir: Path, **env: str) -> list[str]:
    code = "from django.conf import settings as s; print(s.DEBUG); print(s.SECRET_KEY)"
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=BASE_DIR,
        env={**clean, "DJANGO_SETTINGS_MODULE": "portal.settings", "GPUPOOL_VAR_DIR": str(var_dir)}
        | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split()


def test_debug_is_off_unless_set_and_the_secret_key_is_made_once_per_installation(tmp_path):
    debug, key = settings_in_a_fresh_process(tmp_path)
    assert debug == "False"
    assert len(key) >= 50 and "insecure" not in key
    assert oct((tmp_path / "secret_key").stat().st_mode & 0o777) == "0o600"
    assert settings_in_a_fresh_process(tmp_path) == ["False", key]  # kept, not made again
    assert settings_in_a_fresh_process(tmp_path / "other")[1] != key
    assert settings_in_a_fresh_process(tmp_path, DEBUG="1", SECRET_KEY="k" * 60) == [
        "True",
        "k" * 60,
    ]


@pytest.fixture
def failing_views(settings):
    settings.ROOT_URLCONF = __name__
    return Client(raise_request_exception=False)


@pytest.fixture(params=[False, True], ids=["debug-off", "debug-on"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def styled(response, status: int, title: str) -> str:
    body = response.content.decode()
    assert response.status_code == status
    assert f"<h1>{title}</h1>" in body
    assert not [word for word in TECHNICAL if word in body]
    return body


def test_a_researcher_gets_the_styled_404_with_the_navigation(org, debug, failing_views):
    failing_views.force_login(org.researcher)
    body = styled(failing_views.get("/no/such/page/"), 404, "Not found")
    assert NAVIGATION in body
    body = styled(failing_views.get(f"/projects/{org.project_b.pk}/"), 404, "Not found")
    assert "nlp" not in body


def test_a_researcher_gets_the_styled_403_with_the_navigation(org, debug, failing_views):
    failing_views.force_login(org.researcher)
    assert NAVIGATION in styled(failing_views.get("/departments/"), 403, "Forbidden")


def test_a_researcher_never_sees_djangos_technical_500(org, debug, failing_views):
    failing_views.force_login(org.researcher)
    body = styled(failing_views.get("/boom/"), 500, "Server error")
    assert NAVIGATION in body and "the database said no" not in body
    styled(failing_views.get("/suspicious/"), 400, "Bad request")


def test_an_anonymous_visitor_gets_styled_pages_too(db, debug, failing_views):
    body = styled(failing_views.get("/no/such/page/"), 404, "Not found")
    assert NAVIGATION not in body and "Sign in" in body
    styled(failing_views.get("/boom/"), 500, "Server error")


def test_the_api_answers_json_errors(org, debug, failing_views):
    failing_views.force_login(org.researcher)
    response = failing_views.get("/api/v1/boom/")
    assert response.status_code == 500
    assert response.json() == {"detail": "Something went wrong on our side; it has been logged."}
    assert failing_views.get("/api/v1/no-such-endpoint/").json()["detail"]


def test_staff_still_get_djangos_technical_pages_when_debug_is_on(org, settings, failing_views):
    settings.DEBUG = True
    org.platform_admin.is_staff = True
    org.platform_admin.save()
    failing_views.force_login(org.platform_admin)
    assert "Traceback" in failing_views.get("/boom/").content.decode()
    assert "Using the URLconf" in failing_views.get("/no/such/page/").content.decode()


def test_an_address_without_its_slash_is_still_redirected_under_debug(org, settings):
    settings.DEBUG = True
    client = Client()
    client.force_login(org.researcher)
    response = client.get("/projects")
    assert response.status_code == 301 and response["Location"] == "/projects/"


def test_a_failed_csrf_check_gets_the_styled_403(org):
    client = Client(enforce_csrf_checks=True)
    client.force_login(org.researcher)
    body = styled(client.post("/projects/new/", {}), 403, "Forbidden")
    assert "The form expired" in body and NAVIGATION in body
