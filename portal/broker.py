"""The embedded Celery broker: a kombu transport on one SQLite file, nothing to install.

Why not the transports kombu ships:
- filesystem:// writes a message with a plain write() into the queue folder, and a consumer
  can read the file half written: the worker dies on a JSONDecodeError after minutes of use
  (kombu issue 1551, open since 2022).
- sqla+sqlite:// (SQLAlchemy) swallows a write error in put(), so a message sent while the
  file is locked past the timeout is silently lost, and it never deletes a consumed row.

Here a put is one INSERT, and a take one `UPDATE ... RETURNING` that marks the oldest
ready row as held by the taking process: SQLite runs each statement atomically, so a message
is either whole in the queue or whole in one consumer's hands, never half of either, and no
two consumers get the same one. The ack deletes the row; a reject with requeue, or a
consumer that closes with messages unacked, makes them ready again; a consumer killed
outright (SIGKILL, OOM) leaves its rows held, and the next process that opens the broker
(the restarted worker) finds their holder gone and makes them ready again. WAL lets readers
go on beside the writer, and a busy timeout makes a writer wait for the lock instead of
failing; a put that still fails raises (an OperationalError, which Celery retries as a
connection error) rather than dropping the message.

A row that cannot be read as a message (not JSON, no properties, a body its encoding cannot
decode) is moved to the `dead_letter` table of the same file, with a log line, and the next
one is taken: a worker that raised on it restarted, took it again and crash-looped. So is a
message put back more than MAX_RESTORES times (a task that kills its pool child each run).

The worker polls this transport on Celery's event loop (see Transport.implements), so its
prefork pool gives each child a pipe of its own and survives a child killed outright.

What it does not do: fanout (remote control such as `celery inspect` sees only the worker's
own process) and priorities.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from json import dumps, loads
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual

logger = logging.getLogger(__name__)

ALIAS = "gpupool-sqlite"
BUSY_TIMEOUT_S = 30.0
# How long a worker waits before it looks again at an empty queue, or again when it holds
# as many tasks as it may (kombu's default is 1 s).
POLLING_INTERVAL_S = 0.1
# At most this many messages taken in one poll of the worker's event loop (QoS stops it
# sooner: the worker holds no more than concurrency x prefetch multiplier).
MAX_TAKEN_PER_POLL = 100
# Where a delivered message carries its row, for the ack that deletes it.
ROW = "x-gpupool-row"
# How often a message was put back (rejected with requeue, or held by a consumer that
# closed); past MAX_RESTORES it goes to the dead-letter table.
RESTORES = "x-gpupool-restores"
MAX_RESTORES = 5
SCHEMA = """
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    taken_by INTEGER  -- the pid of the consumer that holds it, unacked; NULL: ready
);
CREATE INDEX IF NOT EXISTS message_queue_ready ON message (queue, taken_by, id);
CREATE TABLE IF NOT EXISTS dead_letter (
    id INTEGER PRIMARY KEY,  -- the message's own id
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,  -- as it was in the queue
    reason TEXT NOT NULL,
    set_aside_at REAL NOT NULL  -- Unix time
);
"""


def open_database(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (each statement its own transaction), WAL, with
    the busy timeout; creates the file and its table on first use."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    db.execute("PRAGMA journal_mode = WAL")
    # In WAL mode NORMAL still never corrupts the file; a power cut may lose the last
    # commits, which a demo can live with.
    db.execute("PRAGMA synchronous = NORMAL")
    db.executescript(SCHEMA)
    return db


def release_dead_consumers(db: sqlite3.Connection) -> int:
    """Make the messages held by processes that are gone ready again (a worker killed
    outright never acked them); returns how many."""
    holders = [pid for (pid,) in db.execute("SELECT DISTINCT taken_by FROM message")]
    dead = [pid for pid in holders if pid is not None and not _alive(pid)]
    released = 0
    for pid in dead:
        released += db.execute(
            "UPDATE message SET taken_by = NULL WHERE taken_by = ?", (pid,)
        ).rowcount
    return released


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Channel(virtual.Channel):
    """One queue table; a connection per thread (the web server publishes from several)."""

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        self._local = threading.local()
        self._no_ack_queues: set[str] = set()
        self._no_ack_now = False
        super().__init__(connection, **kwargs)

    @property
    def db(self) -> sqlite3.Connection:
        db = self._own_db()
        if db is None:
            db = open_database(self.connection.client.transport_options["path"])
            self._local.db = (os.getpid(), db)
            release_dead_consumers(db)
        return db

    def _own_db(self) -> sqlite3.Connection | None:
        """This thread's connection, unless it was opened before a fork (Celery's pool
        processes inherit the worker's channels): SQLite forbids using it in the child."""
        pid, db = getattr(self._local, "db", None) or (None, None)
        if pid != os.getpid():
            self._local.db = None
            return None
        return db

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Queues need no declaration: a row names its queue."""

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        self._no_ack_now = no_ack
        try:
            return super().basic_get(queue, no_ack, **kwargs)
        finally:
            self._no_ack_now = False

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        row = self._row_of(delivery_tag)
        super().basic_ack(delivery_tag, multiple)
        self.db.execute("DELETE FROM message WHERE id = ?", (row,))

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        row = self._row_of(delivery_tag)
        super().basic_reject(delivery_tag, requeue=requeue)  # requeue: _restore below
        if not requeue:
            self.db.execute("DELETE FROM message WHERE id = ?", (row,))

    def _row_of(self, delivery_tag: str) -> int | None:
        try:
            return self.qos.get(delivery_tag).properties.get(ROW)
        except KeyError:  # not held (taken with no_ack): nothing to delete
            return None

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.db.execute(
            "INSERT INTO message (queue, payload) VALUES (?, ?)", (queue, dumps(message))
        )

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        """Take the oldest ready message: marked as this process's until it is acked
        (deleted), rejected or restored (ready again), or this process dies (made ready
        again by the next process that opens the broker). A consumer that acks nothing
        (no_ack) has it deleted at once. One that cannot be decoded is set aside in the
        dead-letter table, and the next one is taken instead."""
        while True:
            row_id, payload = self._take(queue)
            try:
                message = self._readable(payload)
            except Exception as exc:  # whatever it is, the queue must go on past it
                self._set_aside(row_id, queue, payload, f"cannot be decoded: {exc!r}")
                continue
            message["properties"][ROW] = row_id
            return message

    def _take(self, queue: str) -> tuple[int, str]:
        # An empty queue is seen with a read, which takes no lock (the worker polls often).
        first = self.db.execute(
            "SELECT id FROM message WHERE queue = ? AND taken_by IS NULL LIMIT 1", (queue,)
        ).fetchone()
        if first is None:
            raise Empty()
        # Another consumer may take the same row first: then it gets the next one instead.
        oldest = "(SELECT id FROM message WHERE queue = ? AND taken_by IS NULL ORDER BY id LIMIT 1)"
        if self._no_ack_now or queue in self._no_ack_queues:
            sql = f"DELETE FROM message WHERE id = {oldest} RETURNING id, payload"
            row = self.db.execute(sql, (queue,)).fetchone()
        else:
            sql = f"UPDATE message SET taken_by = ? WHERE id = {oldest} RETURNING id, payload"
            row = self.db.execute(sql, (os.getpid(), queue)).fetchone()
        if row is None:
            raise Empty()
        return row

    def _readable(self, payload: str) -> dict[str, Any]:
        """The row as the message kombu delivers; raises whatever stops kombu reading it
        (not JSON, no properties or delivery tag, a body its encoding cannot decode).
        A body Celery itself cannot read is Celery's to handle (it logs and acks it)."""
        message = loads(payload)
        self.Message(payload=message, channel=self)
        return message

    def _set_aside(self, row: int, queue: str, payload: str, reason: str) -> None:
        """Move a message that cannot be delivered from its queue to the dead-letter table
        (one transaction), with a log line: a consumer that raised on it, restarted and
        took it again would crash-loop on it for good."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR REPLACE INTO dead_letter (id, queue, payload, reason, set_aside_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (row, queue, payload, reason, time.time()),
            )
            db.execute("DELETE FROM message WHERE id = ?", (row,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        logger.error(
            "broker: message %s of queue %r moved to the dead-letter table: %s", row, queue, reason
        )

    def _restore(self, message: Any) -> None:
        """A message rejected with requeue (Celery does so for a task whose pool child was
        killed), or held unacked when the channel closes: ready again, in its place. One
        put back more than MAX_RESTORES times (a task that kills its child each time it
        runs) is set aside in the dead-letter table instead of looping for good."""
        row = message.properties.get(ROW)
        payload = message.serializable()
        payload["redelivered"] = True
        restores = payload["properties"][RESTORES] = payload["properties"].get(RESTORES, 0) + 1
        text = dumps(payload)
        found = self.db.execute("SELECT queue FROM message WHERE id = ?", (row,)).fetchone()
        if found is None:
            super()._restore(message)
        elif restores > MAX_RESTORES:
            reason = f"put back {restores} times (its worker died or stopped each time)"
            self._set_aside(row, found[0], text, reason)
        else:
            sql = "UPDATE message SET taken_by = NULL, payload = ? WHERE id = ?"
            self.db.execute(sql, (text, row))

    def _size(self, queue: str) -> int:
        ((count,),) = self.db.execute(
            "SELECT count(*) FROM message WHERE queue = ? AND taken_by IS NULL", (queue,)
        )
        return count

    def _purge(self, queue: str) -> int:
        sql = "DELETE FROM message WHERE queue = ? AND taken_by IS NULL"
        return self.db.execute(sql, (queue,)).rowcount

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)

    def close(self) -> None:
        super().close()
        db = self._own_db()
        if db is not None:
            db.close()
            self._local.db = None


class Transport(virtual.Transport):
    Channel = Channel
    polling_interval = POLLING_INTERVAL_S
    can_parse_url = False
    default_port = 0
    driver_type = "sqlite"
    driver_name = "sqlite3"
    # A lock held past the busy timeout: Celery's publish retry treats it as a lost connection.
    connection_errors = (*virtual.Transport.connection_errors, sqlite3.OperationalError)
    channel_errors = (*virtual.Transport.channel_errors, sqlite3.DatabaseError)

    # Celery runs a worker on its event loop (asynloop) only for a transport that says it
    # can: then its prefork pool is AsynPool, with a pipe of its own to each child, and a
    # job written to a child that is killed before it took it goes to another child. The
    # blocking loop's pool (for the others) has the children share one pipe under one
    # semaphore, which an idle child holds while it waits in read(): SIGKILL or the OOM
    # killer on that child leaves it held for good, and no child ever takes a task again
    # (the worker lives on, holding its prefetched messages, consuming nothing).
    implements = virtual.Transport.implements.extend(asynchronous=True)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """On the worker's event loop: every polling interval, take what is ready (up to
        what the worker may hold: the channel's QoS), without waiting."""
        self._polling = loop.call_repeatedly(self.polling_interval, self._deliver_ready)

    def close_connection(self, connection: Any) -> None:
        """Also stops the polling (the event loop outlives a connection Celery replaces)."""
        polling, self._polling = getattr(self, "_polling", None), None
        if polling is not None:
            polling.cancel()
        super().close_connection(connection)

    def _deliver_ready(self) -> None:
        for _ in range(MAX_TAKEN_PER_POLL):
            try:
                self.cycle.get(self._deliver, timeout=0)
            except Empty:
                return

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Wait at most one polling interval (a consumer off the event loop: `celery
        inspect`, a SimpleQueue). Celery's blocking worker loop, which ran this transport
        before it ran on the event loop, sent the acks of finished tasks only between two
        calls here, and called with a 2 s timeout: with the worker full that capped it at
        2 tasks per 2 s, and beat's tasks piled up."""
        if timeout is not None:
            timeout = min(timeout, self.polling_interval)
        super().drain_events(connection, timeout=timeout)

    def driver_version(self) -> str:
        return sqlite3.sqlite_version


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
