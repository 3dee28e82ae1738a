"""Single sign-on end to end: Chromium signs in to GPUPool through a real OpenID Connect
provider (django-oauth-toolkit, RS256, PKCE) that the test runs as its own process on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from portal.models import AuditLog, Membership, Role, User
from portal.sso_mapping import parse_group_roles
from tests import factories as f

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "gpupool-test", "a-client-secret-for-the-test-only"
IDP_PASSWORD = "idp-passphrase-123"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    """The provider's issuer URL; users rita (group vision-leads) and a stranger."""
    folder = tmp_path_factory.mktemp("idp")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    setup = {
        "client": {
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "redirect_uri": f"{live_server.url}/oidc/callback/",
        },
        "users": [
            {
                "username": "rita-idp",
                "password": IDP_PASSWORD,
                "email": "Rita@Example.com",
                "groups": ["vision-leads", "staff"],
            },
            {"username": "stranger", "password": IDP_PASSWORD, "email": "stranger@example.com"},
        ],
    }
    (folder / "setup.json").write_text(json.dumps(setup))
    port = _free_port()
    env = {
        **os.environ,
        "PROVIDER_DB": str(folder / "idp.sqlite3"),
        "PROVIDER_RSA_KEY": pem,
        "DJANGO_SETTINGS_MODULE": "tests.sso_provider.settings",
    }
    log = (folder / "idp.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sso_provider.serve", str(port), str(folder / "setup.json")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    issuer = f"http://127.0.0.1:{port}/o"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the identity provider did not start: {(folder / 'idp.log').read_text()}"
                )
            time.sleep(0.2)
        yield issuer
    finally:
        process.terminate()
        process.wait(10)
        log.close()


@pytest.fixture
def sso(settings, provider, live_server):
    settings.GPUPOOL_OIDC_ISSUER = provider
    settings.GPUPOOL_OIDC_DISCOVERY_URL = f"{provider}/.well-known/openid-configuration"
    settings.GPUPOOL_OIDC_PROVIDER_NAME = "Example IdP"
    settings.GPUPOOL_OIDC_GROUPS_CLAIM = "groups"
    settings.GPUPOOL_OIDC_GROUP_ROLES = parse_group_roles(
        "vision-leads=department:vision:department_admin", variable="GPUPOOL_OIDC_GROUP_ROLES"
    )
    settings.GPUPOOL_OIDC_CREATE_USERS = False
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    return live_server.url


def sign_in_at_provider(page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.click("text=Sign in with Example IdP")
    page.wait_for_selector("text=Test identity provider")
    page.fill("#id_username", username)
    page.fill("#id_password", IDP_PASSWORD)
    page.click("#idp-submit")


def test_a_known_user_signs_in_through_the_provider_and_takes_a_role_from_a_group(org, sso, page):
    assert not Membership.objects.filter(user=org.researcher, department=org.dept_a).exists()
    sign_in_at_provider(page, sso, "rita-idp")
    page.wait_for_selector("text=Log out")
    assert page.url.startswith(sso)
    # The portal session is rita's (matched by e-mail, whatever its case), now a department admin.
    page.goto(f"{sso}/users/")
    assert page.locator("body").inner_text().count("rita") >= 1
    membership = Membership.objects.get(user=org.researcher, department=org.dept_a)
    assert membership.role == Role.DEPARTMENT_ADMIN
    assert AuditLog.objects.filter(
        action="sso.membership_add", object_id=str(membership.pk)
    ).exists()
    # Her hand-given project membership is outside the mapping and stays.
    assert Membership.objects.filter(user=org.researcher, project=org.project_a).exists()


def test_an_unknown_user_is_refused_with_a_page_that_says_why(org, sso, page):
    sign_in_at_provider(page, sso, "stranger")
    page.wait_for_selector("text=Sign-in with Example IdP refused")
    assert "there is no GPUPool account with this e-mail address" in page.content()
    assert not User.objects.filter(email="stranger@example.com").exists()
    refused = AuditLog.objects.get(action="sso.login_refused")
    assert refused.after["email"] == "stranger@example.com"
    page.goto(f"{sso}/")
    page.wait_for_selector("#id_username")  # not signed in


def test_the_break_glass_password_still_works_beside_sso(org, sso, page):
    page.goto(f"{sso}/accounts/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", f.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("text=Log out")


def test_with_creation_allowed_an_unknown_user_gets_an_account_on_first_login(
    org, sso, page, settings
):
    settings.GPUPOOL_OIDC_CREATE_USERS = True
    sign_in_at_provider(page, sso, "stranger")
    page.wait_for_selector("text=Log out")
    user = User.objects.get(email="stranger@example.com")
    assert (user.username, user.has_usable_password(), user.memberships.count()) == (
        "stranger",
        False,
        0,
    )
    assert AuditLog.objects.filter(action="sso.user_create", object_id=str(user.pk)).exists()
