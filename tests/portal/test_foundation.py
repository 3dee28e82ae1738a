from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal import env

ROOT = Path(__file__).resolve().parents[2]
ENV_READ_BY_SETTINGS = {
    "DEBUG",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "DATABASE_URL",
    "REDIS_URL",
    "LOG_LEVEL",
    "CSRF_TRUSTED_ORIGINS",
    "SITE_URL",
    "EMAIL_USE_TLS",
    "EMAIL_USE_SSL",
    "GPUPOOL_CYCLE_INTERVAL_S",
    "GPUPOOL_RECONCILE_INTERVAL_S",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "GPUPOOL_BEHIND_TLS_PROXY",
}


def test_env_bool_rejects_a_value_that_is_not_a_boolean(monkeypatch):
    monkeypatch.setenv("GPUPOOL_FLAG", "perhaps")
    with pytest.raises(ImproperlyConfigured, match="GPUPOOL_FLAG must be a boolean"):
        env.env_bool("GPUPOOL_FLAG")


def test_env_int_names_the_variable_when_it_is_not_a_number(monkeypatch):
    monkeypatch.setenv("GPUPOOL_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="GPUPOOL_N must be an integer"):
        env.env_int("GPUPOOL_N", 1)


def test_env_secret_reads_the_file_named_by_the_file_variable(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("SOME_KEY_FILE", str(secret))
    assert env.env_secret("SOME_KEY") == "s3cret"


def test_anonymous_visitors_are_sent_to_the_login_page(client, db):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_researcher_sees_only_their_own_projects_on_the_overview(client_as, org):
    response = client_as(org.researcher).get("/")
    assert response.status_code == 200
    assert b"ml-vision" in response.content
    # As a word: the page's random CSRF token (the logout form) may contain the letters
    # "nlp" by chance; a clean-clone run failed on that once.
    assert not re.search(rb"\bnlp\b", response.content)


def test_env_url_refuses_a_url_without_a_known_scheme(monkeypatch):
    monkeypatch.setenv("SOME_URL", "localhost:6379")
    with pytest.raises(ImproperlyConfigured, match=r"SOME_URL must be a URL like redis://\.\.\."):
        env.env_url("SOME_URL", ("redis", "rediss"))
    monkeypatch.setenv("SOME_URL", "rediss://cache:6380/1")
    assert env.env_url("SOME_URL", ("redis", "rediss")) == "rediss://cache:6380/1"


def test_env_choice_accepts_any_case_and_names_the_choices(monkeypatch):
    monkeypatch.setenv("SOME_LEVEL", "warning")
    assert env.env_choice("SOME_LEVEL", "INFO", ("INFO", "WARNING")) == "WARNING"
    monkeypatch.setenv("SOME_LEVEL", "LOUD")
    with pytest.raises(ImproperlyConfigured, match="SOME_LEVEL must be one of INFO, WARNING"):
        env.env_choice("SOME_LEVEL", "INFO", ("INFO", "WARNING"))


# Start-up itself, in a fresh interpreter: each bad value stops it with the variable's name.
START_UP = {
    "settings": "import django; django.setup()",
    # Celery loads the settings when beat first reads its schedule.
    "beat": "from portal.celery import app; print(app.conf.beat_schedule['scheduling-cycle'])",
    "csrf": (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.CSRF_TRUSTED_ORIGINS)"
    ),
    "https": (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, "
        "getattr(s, 'SECURE_PROXY_SSL_HEADER', None))"
    ),
}


def _start(process: str, environment: dict[str, str], var: Path):
    """Run `process` in a fresh interpreter under `environment` and none of ours."""
    clean = {k: v for k, v in os.environ.items() if k not in ENV_READ_BY_SETTINGS}
    clean |= {"GPUPOOL_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "portal.settings"}
    return subprocess.run(
        [sys.executable, "-c", START_UP[process]],
        env=clean | environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("process", "environment", "message"),
    [
        ("settings", {"DEBUG": "perhaps"}, "DEBUG must be a boolean"),
        ("settings", {"REDIS_URL": "localhost:6379"}, "REDIS_URL must be a URL like redis://"),
        ("settings", {"DATABASE_URL": "postgress://db/x"}, "DATABASE_URL is not a valid"),
        ("settings", {"LOG_LEVEL": "LOUD"}, "LOG_LEVEL must be one of DEBUG, INFO"),
        ("settings", {"SITE_URL": "gpupool.example.org"}, "SITE_URL must be a URL like http://"),
        ("settings", {"EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "Set EMAIL_USE_TLS or"),
        ("settings", {"SECURE_HSTS_SECONDS": "-1"}, "SECURE_HSTS_SECONDS must be at least 0"),
        ("settings", {"SESSION_COOKIE_SECURE": "sure"}, "SESSION_COOKIE_SECURE must be a boolean"),
        ("settings", {"SECURE_SSL_REDIRECT": "1"}, "SECURE_SSL_REDIRECT needs an https://"),
        (
            "beat",
            {"GPUPOOL_CYCLE_INTERVAL_S": "ten"},
            "GPUPOOL_CYCLE_INTERVAL_S must be an integer",
        ),
        (
            "beat",
            {"GPUPOOL_RECONCILE_INTERVAL_S": "0"},
            "GPUPOOL_RECONCILE_INTERVAL_S must be at least 1",
        ),
    ],
)
def test_a_bad_environment_value_stops_start_up_naming_it(tmp_path, process, environment, message):
    result = _start(process, environment, tmp_path)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr


@pytest.mark.parametrize(("interval", "schedule"), [("3", "3.0"), ("", "10.0")])
def test_good_values_start_and_set_beats_intervals(tmp_path, interval, schedule):
    """An empty value means the default, for beat as for the settings."""
    environment = {"DEBUG": "off", "SECRET_KEY": "k" * 50, "GPUPOOL_CYCLE_INTERVAL_S": interval}
    result = _start("beat", environment, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"'schedule': {schedule}" in result.stdout


def test_the_sites_origin_is_trusted_for_forms_posted_through_a_tls_proxy(tmp_path):
    """Behind a proxy the app sees http; the browser's Origin is https://SITE_URL's host."""
    result = _start("csrf", {"SITE_URL": "https://gpupool.example.org/portal/"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['https://gpupool.example.org']"


@pytest.mark.parametrize(
    ("environment", "printed"),
    [
        ({}, "True True 0 None"),  # DEBUG is off unless set: https only
        ({"DEBUG": "1"}, "False False 0 None"),  # the demo on plain http: cookies must still work
        ({"DEBUG": "0", "SECRET_KEY": "k" * 50}, "True True 0 None"),  # production: https only
        (  # a plain-http production deployment opts out
            {
                "DEBUG": "0",
                "SECRET_KEY": "k" * 50,
                "SESSION_COOKIE_SECURE": "0",
                "CSRF_COOKIE_SECURE": "no",
            },
            "False False 0 None",
        ),
        ({"SITE_URL": "https://gpupool.example.org"}, "True True 0 None"),
        (
            {
                "SITE_URL": "https://gpupool.example.org",
                "GPUPOOL_BEHIND_TLS_PROXY": "1",
                "SECURE_HSTS_SECONDS": "3600",
                "CSRF_COOKIE_SECURE": "0",
            },
            "True False 3600 ('HTTP_X_FORWARDED_PROTO', 'https')",
        ),
    ],
)
def test_cookies_are_https_only_in_production_or_on_an_https_site(tmp_path, environment, printed):
    result = _start("https", environment, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == printed
