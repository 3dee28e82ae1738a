"""A node agent's token stores samples of its own node only: its GPUs, the workloads placed
on it, at times samples are kept for. Anything else is refused (400, naming the sample and
its key), which the agent's shipper answers by dropping that sample alone."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.metrics.models import GpuProcessSample, GpuSample, RollupMark
from clusters.metrics.services import node_token_issue, samples_ingest
from tests.metrics.helpers import allocate, make_node, make_workload

pytestmark = pytest.mark.django_db
URL = "/api/v1/metrics"


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def agent(org):
    node = make_node(org.pool, gpus=4)
    _, plain = node_token_issue(actor=org.platform_admin, node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    return client, node


def reading(ts, gpu=0, **extra):
    return {"gpu_index": gpu, "ts": ts.isoformat(), "util_pct": 50.0, "mem_used_mib": 100,
            "mem_total_mib": 81920, **extra}  # fmt: skip


def post(client, *samples):
    return client.post(URL, {"samples": list(samples)}, format="json")


def test_an_agent_stores_samples_of_its_gpus_and_the_workloads_on_its_node(agent, org, now):
    client, node = agent
    mine = make_workload(org.project_a, org.researcher, "mine")
    allocate(mine, node, [1], at=now - dt.timedelta(hours=1))
    response = post(
        client,
        reading(now, gpu=0),
        reading(now, gpu=1, workload_id=mine.pk, processes=[{"pid": 7, "workload_id": mine.pk}]),
        reading(now - dt.timedelta(days=6), gpu=3),
    )
    assert response.status_code == 201, response.content
    assert response.json() == {"accepted": 3}
    assert sorted(GpuSample.objects.values_list("gpu_index", "workload_id")) == [
        (0, None),
        (1, mine.pk),
        (3, None),
    ]


def test_a_gpu_index_its_node_does_not_have_is_refused_naming_it(agent, org, now):
    client, node = agent
    make_node(org.pool, name="eight", gpus=8)  # another node's GPU 7 is not this one's
    response = post(client, reading(now, gpu=0), reading(now, gpu=7))
    assert response.status_code == 400
    assert response.json() == {"samples": ["sample 1: gpu_index 7 is not a GPU of this node"]}
    assert not GpuSample.objects.exists()


@pytest.mark.parametrize(
    ("where", "named"),
    [
        (lambda w: {"workload_id": w}, "workload_id"),
        (lambda w: {"processes": [{"pid": 1, "workload_id": w}]}, "processes: workload_id"),
    ],
)
def test_a_workload_placed_on_another_node_is_refused_naming_it(agent, org, now, where, named):
    client, _ = agent
    other = make_node(org.pool, name="other")
    theirs = make_workload(org.project_a, org.researcher, "theirs")
    allocate(theirs, other, [0], at=now - dt.timedelta(hours=1))
    response = post(client, reading(now, **where(theirs.pk)))
    assert response.status_code == 400
    refusal = f"sample 0: {named} {theirs.pk} has no pod on this node"
    assert response.json() == {"samples": [refusal]}
    assert not GpuSample.objects.exists() and not GpuProcessSample.objects.exists()


def test_samples_of_a_workload_that_left_the_node_recently_are_still_taken(agent, org, now):
    """An agent empties its buffer after the pod is gone: the interval is still there."""
    client, node = agent
    done = make_workload(org.project_a, org.researcher, "done")
    allocate(done, node, [0], at=now - dt.timedelta(hours=2)).delete()  # the interval closes
    response = post(client, reading(now - dt.timedelta(hours=1), workload_id=done.pk))
    assert response.status_code == 201, response.content


def test_a_sample_of_year_one_is_refused_and_rewinds_no_roll_up(agent, now):
    client, _ = agent
    RollupMark.objects.create(name="minute", done_until=now - dt.timedelta(minutes=5))
    ancient = dt.datetime(1, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    response = post(client, reading(now), reading(ancient))
    assert response.status_code == 400
    refusal = response.json()["samples"][0]
    assert refusal.startswith("sample 1: ts 0001-01-01 00:00:01+00:00 is before")
    assert not GpuSample.objects.exists()
    assert RollupMark.objects.get(name="minute").done_until == now - dt.timedelta(minutes=5)


def test_a_sample_older_than_raw_samples_are_kept_is_refused(agent, now, settings):
    client, _ = agent
    settings.GPUPOOL_METRICS_RAW_DAYS = 7
    response = post(client, reading(now - dt.timedelta(days=7, minutes=1)))
    assert response.status_code == 400 and "is before" in response.json()["samples"][0]


def test_a_sample_far_in_the_future_is_refused(agent, now):
    client, _ = agent
    response = post(client, reading(now + dt.timedelta(days=365)))
    assert response.status_code == 400 and "in the future" in response.json()["samples"][0]


def test_the_services_own_writers_are_not_held_to_an_agents_scope(org):
    """The simulator and the in-process agent write for any node and any time."""
    node = make_node(org.pool, gpus=1)
    ts = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
    assert samples_ingest([{**reading(ts, gpu=5, workload_id=999), "node_id": node.pk}]) == 1
