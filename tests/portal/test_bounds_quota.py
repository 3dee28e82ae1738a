"""Quota numbers keep to scheduling.bounds.QUOTA through the service and the API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.errors import ValidationFailed
from portal.services import quota_set

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", ["NaN", "sNaN", "Infinity", "-Infinity"])
def test_a_quota_that_is_not_a_finite_number_is_refused_naming_the_field(org, value):
    with pytest.raises(ValidationFailed) as refused:
        quota_set(actor=org.platform_admin, owner=org.dept_a, table={org.pool: {"gpus": value}})
    assert refused.value.errors == {"a100.gpus": ["Enter a number."]}


@pytest.mark.parametrize("value", [10**20, "1e999999", "9" * 5000])
def test_the_quota_api_refuses_numbers_past_the_column(org, value):
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(org.platform_admin)
    body = [{"node_pool": "a100", "gpus": value}]
    response = client.put(f"/api/v1/departments/{org.dept_a.pk}/quotas/", body, format="json")
    assert response.status_code == 400, response.content
    assert "gpus" in str(response.json())
