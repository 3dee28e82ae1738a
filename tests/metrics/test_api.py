from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.metrics.models import GpuSample, NodeToken
from clusters.metrics.services import node_token_issue, node_token_revoke
from portal.models import AuditLog
from tests.metrics.helpers import T0, allocate, make_node, make_workload

pytestmark = pytest.mark.django_db
URL = "/api/v1/metrics"


def body(gpus=(0, 1), **extra):
    return {
        "samples": [
            {"gpu_index": g, "ts": timezone.now().isoformat(), "util_pct": 42.5,
             "mem_used_mib": 100, "mem_total_mib": 81920, **extra}
            for g in gpus
        ]
    }  # fmt: skip


@pytest.fixture
def agent(org):
    node = make_node(org.pool)
    token, plain = node_token_issue(actor=org.platform_admin, node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    return client, node, token


def test_an_agent_posts_a_batch_with_its_node_token(agent):
    client, node, token = agent
    response = client.post(URL, body(gpus=range(4)), format="json")

    assert response.status_code == 201, response.content
    assert response.json() == {"accepted": 4}
    assert GpuSample.objects.filter(node_id=node.pk).count() == 4
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_samples_are_filed_under_the_tokens_node_whatever_they_claim(agent, org):
    client, node, _ = agent
    other = make_node(org.pool, name="other")
    response = client.post(URL, body(node_id=other.pk), format="json")
    assert response.status_code == 201
    assert set(GpuSample.objects.values_list("node_id", flat=True)) == {node.pk}


@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token", "Token abc", "Bearer two words"]
)  # fmt: skip
def test_ingestion_refuses_requests_without_a_valid_node_token(org, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.post(URL, body(node_id=1), format="json")
    assert response.status_code in (401, 403)
    assert GpuSample.objects.count() == 0


def test_a_logged_in_user_cannot_post_samples(org):
    client = APIClient()
    client.force_authenticate(org.platform_admin)
    response = client.post(URL, body(node_id=1), format="json")
    assert response.status_code == 403


def test_a_revoked_token_is_refused(agent, org):
    client, _, token = agent
    node_token_revoke(actor=org.platform_admin, token=token)
    assert client.post(URL, body(), format="json").status_code == 401


@pytest.mark.parametrize(
    ("payload", "field_text"),
    [
        ({"samples": "nope"}, "list"),
        (body(util_pct=250), "util_pct must be between"),
        (body(ts="not a time"), "sample 0"),
        ({"samples": [{"gpu_index": 0}]}, "is missing"),
    ],
)
def test_invalid_batches_get_400_naming_the_problem(agent, payload, field_text):
    client, _, _ = agent
    response = client.post(URL, payload, format="json")
    assert response.status_code == 400
    assert field_text in response.json()["samples"][0]
    assert GpuSample.objects.count() == 0


def test_issuing_a_token_stores_only_its_hash_and_writes_an_audit_row(org):
    node = make_node(org.pool)
    token, plain = node_token_issue(actor=org.platform_admin, node=node)
    assert plain.startswith("gpn_") and len(plain) > 40
    assert plain not in token.token_hash and token.prefix == plain[:12]
    assert NodeToken.objects.get().node == node
    assert AuditLog.objects.filter(action="node_token.issue", actor=org.platform_admin).exists()


def test_an_agent_lists_the_pods_on_its_node_only(agent, org):
    client, node, _ = agent
    other = make_node(org.pool, name="other")
    mine = make_workload(org.project_a, org.researcher, "mine")
    theirs = make_workload(org.project_a, org.researcher, "theirs")
    allocate(mine, node, [0], at=T0)
    allocate(theirs, other, [0], at=T0)

    response = client.get(URL + "/pods")
    assert response.status_code == 200
    assert [p["workload_id"] for p in response.json()["pods"]] == [mine.pk]
