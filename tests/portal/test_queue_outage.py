"""With Redis or the broker down, a submit still answers as stored (issue 27).

The row is stored before the cycle is asked for; when that ask cannot reach the cache
(the cycle's debounce key) or the broker (the task), the submit used to answer 500 (11 of
11 in a 30-second outage), inviting a duplicate. Now it answers 201 with a notice that the
next periodic cycle picks the work up, and the form says so; nothing is stored twice.

Break checked: without `enqueue` around the ask (the old `_queue_cycle`), both API cases
answer 500.
"""

from __future__ import annotations

import socket

import pytest
from rest_framework.test import APIClient

from portal.celery import app as celery_app
from scheduling.models import Workload
from tests.celery_pools import connections_dropped

pytestmark = pytest.mark.django_db(transaction=True)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["cache", "broker"])
def outage(request, settings):
    """Celery sends tasks for real (not eagerly), with the cache or the broker unreachable.
    The app reads Django's settings under the CELERY_ namespace: its keys carry it."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    conf = {"CELERY_TASK_ALWAYS_EAGER": False}
    if request.param == "cache":
        cache = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}
    else:
        cache = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": url}
        conf |= {
            "CELERY_BROKER_URL": url,
            "CELERY_BROKER_CONNECTION_TIMEOUT": 1,
            "CELERY_TASK_PUBLISH_RETRY_POLICY": {"max_retries": 1, "interval_start": 0},
        }
    settings.CACHES = {**settings.CACHES, "default": cache}
    saved = {key: celery_app.conf.get(key) for key in conf}
    celery_app.conf.update(conf)
    connections_dropped()
    yield request.param
    celery_app.conf.update(saved)
    connections_dropped()


def _body():
    return {"project": "ml-vision", "kind": "training", "name": "during-outage", "image": "img"}


def test_an_api_submit_during_an_outage_is_stored_once_and_says_so(org, outage):
    client = APIClient()
    client.force_authenticate(org.researcher)
    response = client.post("/api/v1/workloads/", _body(), format="json")
    assert response.status_code == 201, response.content
    assert "next periodic scheduling cycle" in response.json()["notice"]
    assert Workload.objects.filter(name="during-outage").count() == 1


def test_a_form_submit_during_an_outage_tells_the_user(client, org, outage):
    client.force_login(org.researcher)
    form = {"project": org.project_a.pk, "name": "during-outage", "image": "img",
            "gpu_request": "whole", "gpus": "1", "cpu": "1", "memory_mib": "1024"}  # fmt: skip
    response = client.post("/workloads/new/training/", form, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert "during-outage is queued." in text
    assert "next periodic scheduling cycle" in text
    assert Workload.objects.filter(name="during-outage").count() == 1


def test_with_everything_up_a_submit_carries_no_notice(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    response = client.post("/api/v1/workloads/", _body(), format="json")
    assert response.status_code == 201 and "notice" not in response.json()
