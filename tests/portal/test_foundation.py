from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal import env


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
    assert b"nlp" not in response.content
