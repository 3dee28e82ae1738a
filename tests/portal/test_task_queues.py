"""Periodic tasks expire after a period, and the cycle has a queue of its own (issue 27).

After an outage beat's messages piled up in one FIFO queue (5,000 stale reconcile_all) and a
submit was not admitted within 420 s: the cycle waited behind them. Now every beat entry
expires after its period (a worker drops a run it takes late instead of running it), and
`run_cycle` goes to the `cycle` queue, which a worker started without -Q consumes beside the
default one, in turn.

Here through the real app and the embedded broker (a SQLite file): what is stored where, and
with what expiry. Breaks checked: without the route the cycle's message lands in `celery`;
without the beat entries' `expires` the stored messages carry none.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

import pytest

from portal.celery import app as celery_app
from tests.celery_pools import connections_dropped

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_file(tmp_path):
    """The app sends for real (not eagerly) into a broker file of this test's own."""
    path = tmp_path / "broker.sqlite3"
    conf = {
        "CELERY_TASK_ALWAYS_EAGER": False,
        "CELERY_BROKER_URL": "gpupool-sqlite://localhost",
        "CELERY_BROKER_TRANSPORT_OPTIONS": {"path": str(path)},
    }
    saved = {key: celery_app.conf.get(key) for key in conf}
    celery_app.conf.update(conf)
    connections_dropped()
    yield path
    celery_app.conf.update(saved)
    connections_dropped()


def _stored(path) -> list[tuple[str, dict]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT queue, payload FROM message ORDER BY id").fetchall()
    return [(queue, json.loads(payload)) for queue, payload in rows]


def test_every_beat_entry_expires_within_its_period():
    schedule = celery_app.conf.beat_schedule
    assert schedule, "beat has entries"
    for name, entry in schedule.items():
        assert 0 < entry["options"]["expires"] <= entry["schedule"], name


def test_a_worker_without_queue_options_consumes_the_cycle_queue_too():
    assert {"celery", "cycle"} <= set(celery_app.amqp.queues)


def test_beat_runs_are_stored_with_their_expiry_and_the_cycle_in_its_own_queue(broker_file):
    schedule = celery_app.conf.beat_schedule
    sent_at = datetime.now().astimezone()
    for name in ("clusters-reconcile-all", "scheduling-cycle"):
        entry = schedule[name]
        celery_app.send_task(entry["task"], **entry["options"])  # as beat sends an entry
    (reconcile, cycle) = _stored(broker_file)
    assert reconcile[0] == "celery" and cycle[0] == "cycle"
    for (_, message), name in zip(
        (reconcile, cycle), ("clusters-reconcile-all", "scheduling-cycle"), strict=True
    ):
        expires = datetime.fromisoformat(message["headers"]["expires"])
        left = (expires - sent_at).total_seconds()
        assert 0 < left <= schedule[name]["schedule"] + 1, (name, left)
