"""Sign-in is throttled per address and per username: the login page, the admin's, the API's."""

from __future__ import annotations

from uuid import uuid4

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests import factories as f


@pytest.fixture
def rates(settings):
    settings.GPUPOOL_SIGN_IN_RATES = {"sign-in": "5/min", "sign-in-username": "3/hour"}


def token_attempt(username: str, password: str = "wrong", address: str = "10.0.0.1") -> int:
    body = {"username": username, "password": password}
    return (
        APIClient(REMOTE_ADDR=address).post("/api/v1/auth/token", body, format="json").status_code
    )


def test_the_token_endpoint_answers_429_past_the_username_rate_from_any_address(org, rates):
    codes = [token_attempt("rita", address=f"10.0.0.{i}") for i in range(4)]
    assert codes == [400, 400, 400, 429]
    # Even the right password waits: the check comes before the password is looked at.
    assert token_attempt("rita", f.PASSWORD, address="10.0.0.9") == 429
    assert token_attempt("dana", f.PASSWORD, address="10.0.0.9") == 200


def test_the_token_endpoint_answers_429_past_the_address_rate_whatever_the_username(org, rates):
    codes = [token_attempt(f"guess{i}") for i in range(6)]
    assert codes == [400] * 5 + [429]
    response = APIClient(REMOTE_ADDR="10.0.0.1").post(
        "/api/v1/auth/token", {"username": "x", "password": "y"}, format="json"
    )
    assert int(response["Retry-After"]) > 0
    assert token_attempt("rita", f.PASSWORD, address="10.0.0.2") == 200  # another address


@pytest.mark.parametrize("url", ["/accounts/login/", "/django-admin/login/"])
def test_the_login_pages_answer_a_styled_429_past_the_username_rate(org, rates, url):
    def attempt(password: str) -> object:
        return Client().post(url, {"username": "RITA", "password": password})

    assert [attempt("wrong").status_code for _ in range(3)] == [200, 200, 200]
    response = attempt(f.PASSWORD)
    assert response.status_code == 429
    assert "<h1>Too many requests</h1>" in response.content.decode()
    assert "Try again in" in response.content.decode()
    assert int(response["Retry-After"]) > 0
    assert Client().get(url).status_code == 200  # the page itself still opens


def test_signing_in_under_the_rates_works(org, rates):
    response = Client().post("/accounts/login/", {"username": "rita", "password": f.PASSWORD})
    assert response.status_code == 302
    assert token_attempt("rita", f.PASSWORD) == 200


def test_password_reset_requests_count_against_the_address(org, rates, mailoutbox):
    def reset() -> int:
        return Client().post("/accounts/password-reset/", {"email": "rita@example.com"}).status_code

    assert [reset() for _ in range(6)] == [302] * 5 + [429]
    assert len(mailoutbox) <= 5


def test_without_a_sign_in_cache_the_default_one_counts(org, rates, settings):
    fresh = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid4().hex}
    settings.CACHES = {"default": fresh}
    codes = [token_attempt("rita", address=f"10.0.1.{i}") for i in range(4)]
    assert codes == [400, 400, 400, 429]
