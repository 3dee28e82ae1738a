"""SSO's settings: checked at start-up with a message naming the variable; off unless set."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.portal.test_foundation import ROOT, _start

ISSUER = {
    "GPUPOOL_OIDC_ISSUER": "https://idp.example.com/realms/x/",
    "GPUPOOL_OIDC_CLIENT_ID": "gpupool",
    "GPUPOOL_OIDC_CLIENT_SECRET": "s3cret",
}


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"GPUPOOL_OIDC_ISSUER": "idp.example.com"}, "GPUPOOL_OIDC_ISSUER must be a URL like"),
        (
            {"GPUPOOL_OIDC_ISSUER": "https://idp"},
            "GPUPOOL_OIDC_ISSUER is set: set GPUPOOL_OIDC_CLIENT_ID",
        ),
        ({"GPUPOOL_OIDC_CLIENT_ID": "gpupool"}, "GPUPOOL_OIDC_* is set but GPUPOOL_OIDC_ISSUER"),
        ({**ISSUER, "GPUPOOL_OIDC_SCOPES": "email"}, "GPUPOOL_OIDC_SCOPES must include openid"),
        ({**ISSUER, "GPUPOOL_OIDC_CREATE_USERS": "maybe"}, "GPUPOOL_OIDC_CREATE_USERS must be a"),
        ({**ISSUER, "GPUPOOL_OIDC_SIGN_ALGO": "HS256"}, "GPUPOOL_OIDC_SIGN_ALGO must be one of"),
        (
            {**ISSUER, "GPUPOOL_OIDC_GROUP_ROLES": "g=project:p:viewer"},
            "GPUPOOL_OIDC_GROUP_ROLES needs",
        ),
        (
            {**ISSUER, "GPUPOOL_OIDC_GROUPS_CLAIM": "groups", "GPUPOOL_OIDC_GROUP_ROLES": "g=root"},
            "GPUPOOL_OIDC_GROUP_ROLES: group 'g' maps to 'root'",
        ),
        (
            {**ISSUER, "GPUPOOL_OIDC_CLIENT_SECRET": "", "GPUPOOL_OIDC_CLIENT_SECRET_FILE": "/no"},
            "GPUPOOL_OIDC_CLIENT_SECRET_FILE='/no' cannot be read",
        ),
    ],
)
def test_a_bad_sso_setting_stops_start_up_naming_it(tmp_path, environment, message):
    result = _start("settings", environment, tmp_path)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr


def test_a_good_sso_configuration_starts_with_the_secret_from_a_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    environment = {
        **ISSUER,
        "GPUPOOL_OIDC_CLIENT_SECRET": "",
        "GPUPOOL_OIDC_CLIENT_SECRET_FILE": str(secret),
        "GPUPOOL_OIDC_GROUPS_CLAIM": "groups",
        "GPUPOOL_OIDC_GROUP_ROLES": "ops=platform_admin;ml=project:ml:researcher",
        "GPUPOOL_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.GPUPOOL_OIDC_ISSUER, s.GPUPOOL_OIDC_DISCOVERY_URL, s.OIDC_RP_CLIENT_SECRET, "
        "s.OIDC_RP_SCOPES, sorted(s.GPUPOOL_OIDC_GROUP_ROLES))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=environment | {"PATH": ""},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stdout.split(" ", 4) == [
        "https://idp.example.com/realms/x",
        "https://idp.example.com/realms/x/.well-known/openid-configuration",
        "from-a-file",
        "openid",
        "email profile ['ml', 'ops']\n",
    ], result.stderr


@pytest.mark.django_db
def test_without_sso_there_is_no_button_and_no_endpoint(client, settings):
    settings.GPUPOOL_OIDC_ISSUER = ""
    assert "Sign in with" not in client.get("/accounts/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


@pytest.mark.django_db
def test_with_sso_the_login_page_offers_the_provider_and_keeps_next(client, settings):
    settings.GPUPOOL_OIDC_ISSUER = "https://idp.example.com"
    settings.GPUPOOL_OIDC_PROVIDER_NAME = "Acme ID"
    page = client.get("/accounts/login/?next=/workloads/").content.decode()
    assert 'href="/oidc/authenticate/?next=/workloads/"' in page
    assert "Sign in with Acme ID" in page
    assert 'id="id_password"' in page  # the local form stays beside it


@pytest.mark.django_db
def test_an_unreachable_provider_is_a_page_that_says_so_not_a_server_error(client, settings):
    with socket.socket() as sock:  # a port nothing listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.GPUPOOL_OIDC_ISSUER = f"http://127.0.0.1:{port}"
    settings.GPUPOOL_OIDC_DISCOVERY_URL = (
        f"http://127.0.0.1:{port}/.well-known/openid-configuration"
    )
    response = client.get("/oidc/authenticate/")
    assert response.status_code == 503
    assert "the identity provider cannot be reached" in response.content.decode()
