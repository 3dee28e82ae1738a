"""The embedded Celery broker (portal/broker.py): under concurrent producers and consumers in
separate processes every message arrives exactly once and whole; a write that cannot get
the file's lock raises instead of dropping the message; and it is what the embedded default
configures."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path
from queue import Empty

import pytest
from django.conf import settings
from kombu import Connection, Queue
from kombu.asynchronous import Hub

from portal import broker

PRODUCERS = 4
CONSUMERS = 3
PER_PRODUCER = 300
# Big enough that a message spans several writes of a file-based transport.
PADDING = "x" * 20_000


def _connection(path: Path) -> Connection:
    return Connection("gpupool-sqlite://localhost", transport_options={"path": str(path)})


def _produce(path: Path, producer: int) -> None:
    with _connection(path) as conn:
        queue = conn.SimpleQueue("soak")
        for n in range(PER_PRODUCER):
            queue.put({"producer": producer, "n": n, "padding": PADDING})
        queue.close()


def _consume(path: Path, out: Path, expected: int) -> None:
    got = []
    with _connection(path) as conn:
        queue = conn.SimpleQueue("soak")
        idle = 0
        while idle < 20 and len(got) < expected:  # bounded: 20 empty polls of 0.25 s
            try:
                message = queue.get(timeout=0.25)
            except Empty:
                idle += 1
                continue
            idle = 0
            body = message.payload
            assert body["padding"] == PADDING
            got.append(f"{body['producer']}:{body['n']}")
            message.ack()
        queue.close()
    out.write_text("\n".join(got))


def test_concurrent_producers_and_consumers_get_every_message_exactly_once(tmp_path):
    path = tmp_path / "broker.sqlite3"
    ctx = multiprocessing.get_context("spawn")
    total = PRODUCERS * PER_PRODUCER
    outs = [tmp_path / f"consumer-{i}.txt" for i in range(CONSUMERS)]
    consumers = [ctx.Process(target=_consume, args=(path, out, total)) for out in outs]
    producers = [ctx.Process(target=_produce, args=(path, i)) for i in range(PRODUCERS)]
    for process in consumers + producers:
        process.start()
    for process in producers + consumers:
        process.join(timeout=240)
        assert process.exitcode == 0, process
    received = [line for out in outs for line in out.read_text().splitlines()]
    assert len(received) == len(set(received)) == total
    assert all(out.read_text() for out in outs), "every consumer took a share"
    assert sqlite3.connect(path).execute("SELECT count(*) FROM message").fetchone()[0] == 0


def test_a_put_that_cannot_get_the_lock_raises_instead_of_dropping_the_message(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(broker, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as conn:
        queue = conn.SimpleQueue("locked")
        queue.put({"n": 1})
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            queue.put({"n": 2})
        holder.execute("ROLLBACK")
        holder.close()
        queue.put({"n": 3})
        assert [queue.get(timeout=1).payload["n"] for _ in range(2)] == [1, 3]
        assert len(queue) == 0
        queue.close()
    assert sqlite3.OperationalError in conn.transport.connection_errors


def _take_one_and_hang(path: Path, flag: Path) -> None:
    with _connection(path) as conn:
        message = conn.SimpleQueue("held").get(timeout=5)
        flag.write_text(str(message.payload["n"]))
        time.sleep(120)  # killed long before


def test_a_message_held_by_a_worker_killed_outright_is_delivered_again(tmp_path):
    path, flag = tmp_path / "broker.sqlite3", tmp_path / "taken"
    with _connection(path) as conn:
        conn.SimpleQueue("held").put({"n": 1})
    holder = multiprocessing.get_context("spawn").Process(
        target=_take_one_and_hang, args=(path, flag)
    )
    holder.start()
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert flag.read_text() == "1"
    with _connection(path) as conn, pytest.raises(Empty):  # held while its holder lives
        conn.SimpleQueue("held").get(timeout=0.5)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(timeout=30)
    with _connection(path) as conn:  # the next process to open the broker releases it
        queue = conn.SimpleQueue("held")
        message = queue.get(timeout=1)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM message").fetchone()[0] == 0


def test_a_rejected_message_is_deleted_or_requeued_in_its_place(tmp_path):
    with _connection(tmp_path / "broker.sqlite3") as conn:
        queue = conn.SimpleQueue("rejected")
        for n in (1, 2, 3):
            queue.put({"n": n})
        queue.get(timeout=1).reject()  # 1: gone
        second = queue.get(timeout=1)
        second.requeue()  # 2: ready again, before 3
        got = [queue.get(timeout=1) for _ in range(2)]
        assert [m.payload["n"] for m in got] == [2, 3]
        for message in got:
            message.ack()
        assert len(queue) == 0
        queue.close()


def test_a_message_taken_but_not_acked_comes_back_when_the_consumer_closes(tmp_path):
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as conn:
        queue = conn.SimpleQueue("redelivered")
        queue.put({"n": 1})
        assert queue.get(timeout=1).payload == {"n": 1}
        queue.close()
    with _connection(path) as conn:
        queue = conn.SimpleQueue("redelivered")
        message = queue.get(timeout=1)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()


def test_the_embedded_default_uses_the_sqlite_broker_in_var():
    if not os.environ.get("GPUPOOL_TEST_EMBEDDED"):
        pytest.skip("only the embedded run (make test's second pass) checks this")
    assert settings.CELERY_BROKER_URL.startswith(f"{broker.ALIAS}://")
    path = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["path"])
    assert path.parent == Path(settings.VAR_DIR)
    assert settings.CELERY_RESULT_BACKEND is None


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(tmp_path):
    """Celery's pool processes inherit the worker's channels; SQLite forbids using a
    connection across fork, so the child opens its own, and closing its copy of the
    channel does not close the parent's."""
    with _connection(tmp_path / "broker.sqlite3") as conn:
        channel = conn.default_channel
        queue = conn.SimpleQueue("forked", channel=channel)
        queue.put({"from": "parent"})
        parents = channel.db
        pid = os.fork()
        if pid == 0:  # the child: exit code 0 only if all holds
            ok = channel.db is not parents
            channel._put("forked", {"body": "ignored"})
            channel.close()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert channel.db is parents
        assert parents.execute("SELECT count(*) FROM message").fetchone()[0] == 2
        queue.close()


def test_a_row_that_cannot_be_decoded_is_set_aside_and_the_next_message_delivered(tmp_path, caplog):
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as conn:
        queue = conn.SimpleQueue("mixed")
        bad = ["{half a mess", '{"body": "no properties"}', '{"properties": {}}']
        db = sqlite3.connect(path, isolation_level=None)
        for payload in bad:
            db.execute("INSERT INTO message (queue, payload) VALUES ('mixed', ?)", (payload,))
        queue.put({"n": 1})
        message = queue.get(timeout=1)
        assert message.payload == {"n": 1}
        message.ack()
        dead = db.execute("SELECT queue, payload, reason FROM dead_letter ORDER BY id").fetchall()
        assert [(q, p) for q, p, _ in dead] == [("mixed", p) for p in bad]
        assert all(reason.startswith("cannot be decoded: ") for _, _, reason in dead)
        assert db.execute("SELECT count(*) FROM message").fetchone()[0] == 0
        assert caplog.text.count("moved to the dead-letter table: cannot be decoded") == 3
        queue.close()
        db.close()


def test_a_message_put_back_too_often_is_set_aside_instead_of_looping(tmp_path):
    path = tmp_path / "broker.sqlite3"
    with _connection(path) as conn:
        queue = conn.SimpleQueue("poison")
        queue.put({"n": 1})
        for _ in range(broker.MAX_RESTORES):
            queue.get(timeout=1).requeue()  # as Celery does when the task's child died
        last = queue.get(timeout=1)
        assert last.payload == {"n": 1}
        assert last.properties[broker.RESTORES] == broker.MAX_RESTORES
        last.requeue()
        with pytest.raises(Empty):
            queue.get(timeout=0.5)
        queue.close()
    db = sqlite3.connect(path)
    ((reason,),) = db.execute("SELECT reason FROM dead_letter").fetchall()
    assert reason.startswith(f"put back {broker.MAX_RESTORES + 1} times ")
    db.close()


def test_on_an_event_loop_it_delivers_what_is_ready_and_stops_polling_when_closed(tmp_path):
    """How Celery's worker runs it (asynloop): polled from the loop's timer, never blocking,
    within what the consumer may hold."""
    hub = Hub()
    got = []
    with _connection(tmp_path / "broker.sqlite3") as conn:
        assert conn.transport.implements.asynchronous
        queue = Queue("loop", routing_key="loop")
        for n in (1, 2):
            conn.Producer().publish({"n": n}, routing_key="loop", declare=[queue])
        consumer = conn.Consumer(queue, callbacks=[lambda body, message: got.append(message)])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        conn.transport.register_with_event_loop(conn.connection, hub)
        loop = hub.create_loop()

        def run_until(done) -> None:
            deadline = time.monotonic() + 30
            while not done() and time.monotonic() < deadline:
                next(loop)

        run_until(lambda: got)
        polled = time.monotonic() + 5 * broker.POLLING_INTERVAL_S
        run_until(lambda: time.monotonic() > polled)
        assert [m.payload for m in got] == [{"n": 1}], "the second waits for the first's ack"
        got[0].ack()
        run_until(lambda: len(got) == 2)
        assert [m.payload for m in got] == [{"n": 1}, {"n": 2}]
        got[1].ack()
        polling = conn.transport._polling
    assert polling.canceled, "closing the connection stops its polling"
    hub.close()
