"""Schemathesis over the OpenAPI schema: no input, valid or not, gets a server error.

Every operation of /api/schema/ is called with bodies, query and path parameters generated
from the schema (values that fit it and values that break it), as a platform admin, whose
token opens every operation, and as a researcher, against the WSGI application in-process.
Any 5xx fails. Each call runs inside a savepoint that is rolled back, so examples stay
independent and a database error cannot poison the ones after it.
"""

from __future__ import annotations

import json
import traceback

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import got_request_exception, request_finished, request_started
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, Phase, settings

from portal.tokens import api_token_issue

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLES_PER_OPERATION = 25
INT64_MAX = 2**63 - 1


def _schema() -> dict:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(raw, renderer_context={}))


schema = schemathesis.openapi.from_dict(_schema())


@pytest.fixture
def callers(org):
    """Tokens of a platform admin and a researcher, and the organisation they work in."""
    return {
        "admin": api_token_issue(user=org.platform_admin)[1],
        "researcher": api_token_issue(user=org.researcher)[1],
    }


@pytest.fixture
def app():
    """Django's WSGI handler, kept from closing the test's connection after each request."""
    for signal in (request_started, request_finished):  # as Django's test client does
        signal.disconnect(close_old_connections)
    errors: list[str] = []

    def record(sender, request=None, **kwargs):
        errors.append(traceback.format_exc())

    got_request_exception.connect(record)
    handler = WSGIHandler()
    handler.errors = errors
    yield handler
    got_request_exception.disconnect(record)
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@pytest.mark.parametrize("caller", ["admin", "researcher"])
def test_no_request_gets_a_server_error(case, caller, callers, app):
    app.errors.clear()
    savepoint = transaction.savepoint()
    try:
        response = case.call(app=app, headers={"Authorization": f"Token {callers[caller]}"})
    finally:
        transaction.savepoint_rollback(savepoint)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} as {caller} -> {response.status_code}\n"
        f"query={case.query} body={case.body!r}\n{''.join(app.errors)}"
    )


def test_a_huge_parent_filter_is_a_400_not_a_server_error(client, org):
    client.raise_request_exception = False
    client.force_login(org.researcher)
    assert client.get(f"/api/v1/workloads/?parent={10**30}").status_code == 400
