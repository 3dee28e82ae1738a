"""Run GPUPool on its embedded default: migrate, seed a demo organisation, then start the
web server (uvicorn), a Celery worker and Celery beat. One of them that dies is started
again, with a line saying so (after a pause that grows if it keeps dying; a process that
crash-loops stops the demo); so is a worker that lives but consumes nothing while messages
wait in its queues (killed after STALL_S); local pods such as a workspace's JupyterLab run
on through a worker's restart. Ctrl-C stops all three.

Safe to run again: migrations and the seed are idempotent.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def manage(*args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True)


# demo_prepare's line once the database is migrated (portal/management/commands/).
SEEDING = "seeding the demo..."


def prepare(migrated: Callable[[], None]) -> None:
    """`manage.py demo_prepare` (migrate when a migration is unapplied, then seed), its lines
    passed on. `migrated` is called at its SEEDING line: the web server needs only the
    schema, so it starts while the demo is seeded."""
    command = [sys.executable, "manage.py", "demo_prepare"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.rstrip("\n") == SEEDING:
                migrated()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)


def var_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_VAR_DIR", ROOT / "var"))


def collect_static() -> None:
    """collectstatic (hashing and compressing takes half a minute) when the project's
    static files or its pinned packages changed since the last start."""
    target = Path(os.environ.get("GPUPOOL_STATIC_ROOT", var_dir() / "staticfiles"))
    digest = hashlib.sha256((ROOT / "requirements.txt").read_bytes())
    for path in sorted((ROOT / "static").rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(ROOT)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    stamp = target / ".collected"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    print("collecting and compressing static files (once)...", flush=True)
    manage("collectstatic", "--noinput", "--verbosity", "0")
    stamp.write_text(digest.hexdigest())


# A process that dies is started again after a pause that doubles with each recent restart
# (1, 2, 4 ... 30 s); one that died more than MAX_RESTARTS times within RESTART_WINDOW_S is
# crash-looping, and the demo stops with a line saying which process and how often it died.
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0


# A worker that lives but takes nothing while a message waits in its queue (the oldest ready
# one stays the oldest) for STALL_S is killed, and so started again: its taken messages go
# back to the queue. Long enough for both pool children to finish a slow task first.
STALL_S = 120.0
STALL_LOOK_EVERY_S = 5.0


class StallWatch:
    """Whether a worker consumes: the oldest ready message of each queue, and since when it
    has been the oldest. `observe` decides; a call reads the embedded broker's file (every
    STALL_LOOK_EVERY_S at most) and decides."""

    def __init__(self, broker: Path, stall_s: float = STALL_S) -> None:
        self.broker = broker
        self.stall_s = stall_s
        self.oldest: dict[str, tuple[int, float]] = {}  # queue: (message id, seen since)
        self.looked_at: float | None = None

    def reset(self) -> None:
        self.oldest = {}
        self.looked_at = None

    def observe(self, ready: dict[str, tuple[int, int]], now: float) -> str | None:
        """`ready`: queue -> (id of its oldest ready message, how many are ready). A line
        saying what waits when one queue's oldest has stayed so for stall_s; else None."""
        oldest = {}
        for queue, (first, _) in ready.items():
            seen, since = self.oldest.get(queue, (None, now))
            oldest[queue] = (first, since if seen == first else now)
        self.oldest = oldest
        waited = {q: now - since for q, (_, since) in oldest.items()}
        stuck = {q: waited_s for q, waited_s in waited.items() if waited_s >= self.stall_s}
        if not stuck:
            return None
        waiting = ", ".join(f"{ready[q][1]} in {q!r}" for q in sorted(stuck))
        return f"consumed nothing for {max(stuck.values()):.0f} s while messages waited ({waiting})"

    def __call__(self, now: float) -> str | None:
        if self.looked_at is not None and now - self.looked_at < STALL_LOOK_EVERY_S:
            return None
        self.looked_at = now
        ready = ready_in_broker(self.broker)
        return None if ready is None else self.observe(ready, now)


def ready_in_broker(path: Path) -> dict[str, tuple[int, int]] | None:
    """Per queue of the embedded broker: (id of its oldest ready message, how many are
    ready); None when the file cannot be read (not there yet: a Redis broker, or locked)."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            rows = db.execute(
                "SELECT queue, min(id), count(*) FROM message WHERE taken_by IS NULL GROUP BY queue"
            ).fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return {queue: (first, count) for queue, first, count in rows}


class Supervised:
    """One of the demo's processes: started, watched, started again when it dies (or, with
    a `stalled` check, when it lives but does nothing)."""

    def __init__(self, name: str, cmd: list[str], stalled: StallWatch | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.stalled = stalled
        self.proc: subprocess.Popen[bytes] | None = None
        self.deaths: list[float] = []  # monotonic times, the recent ones only
        self.restart_at: float | None = None

    def start(self) -> None:
        # Own process group, so Ctrl-C in the terminal reaches us once and we stop each cleanly.
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, start_new_session=True)
        print(f"started {self.name} (pid {self.proc.pid}): {' '.join(self.cmd)}", flush=True)
        self.restart_at = None
        if self.stalled is not None:
            self.stalled.reset()

    def check(self, now: float) -> bool:
        """Restart the process if it died (or stalled) and its pause is over; False when it
        crash-loops."""
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.start()
            return True
        if self.proc is None:
            return True
        if self.proc.poll() is None:
            reason = self.stalled(now) if self.stalled is not None else None
            if reason is None:
                return True
            print(
                f"{self.name} (pid {self.proc.pid}) is alive but {reason}; killing it", flush=True
            )
            kill_with_children(self.proc.pid)
            self.proc.wait()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
        code = self.proc.returncode
        if len(self.deaths) > MAX_RESTARTS:
            print(
                f"{self.name} exited (code {code}) {len(self.deaths)} times within "
                f"{RESTART_WINDOW_S:.0f} s; it is crash-looping, so GPUPool stops",
                flush=True,
            )
            return False
        delay = min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (len(self.deaths) - 1))
        print(
            f"{self.name} exited (code {code}); restarting it in {delay:.0f} s "
            f"(restart {len(self.deaths)} of at most {MAX_RESTARTS} in "
            f"{RESTART_WINDOW_S:.0f} s)",
            flush=True,
        )
        self.restart_at = now + delay
        return True


def wait_listening(host: str, port: int, web: Supervised, timeout_s: float = 120.0) -> None:
    """Until something accepts connections on host:port (or the web process ended, or the
    time is up: the supervisor's loop then says what happened)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and web.proc is not None and web.proc.poll() is None:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)


def kill_with_children(pid: int) -> None:
    """SIGKILL a process and its children (a worker's pool; local pods have sessions of
    their own and run on). The next process to open the broker makes its messages ready."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    for target in (pid, *children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)


def stop_all(processes: list[Supervised]) -> None:
    # SIGTERM to each main process only: Celery's worker stops its own pool children
    # (signalling the whole group makes them log spurious errors). Celery needs several
    # seconds to stop on a busy machine, so allow 30 before killing what is left.
    running = [p for p in processes if p.proc is not None and p.proc.poll() is None]
    for p in running:
        p.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in running:
        try:
            p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{p.name} did not stop in time; killing it", flush=True)
            os.killpg(p.proc.pid, signal.SIGKILL)


# What the demo and every process it starts create is for this user alone: the database,
# the broker's queue, logs and pods' files under var/ (once 0644 in a 0755 folder).
UMASK = 0o077


def main() -> int:
    os.umask(UMASK)
    host = os.environ.get("GPUPOOL_HOST", "127.0.0.1")
    port = os.environ.get("GPUPOOL_PORT", "8000")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("SITE_URL", f"http://{host}:{port}")
    # Users' HTTP ports (TensorBoard, a tool's page) on the next port: an origin apart from
    # the portal's, so a tool's scripts cannot act with the visitor's session.
    os.environ.setdefault("GPUPOOL_PORTS_ORIGIN", f":{int(port) + 1}")
    # Development mode (cookies over plain http); users still get the styled error pages,
    # only staff see Django's technical ones.
    os.environ.setdefault("DEBUG", "1")
    # Static files as in production: hashed names, gzip and brotli copies, long caching
    # (collectstatic compresses only what changed since the last start).
    os.environ.setdefault("GPUPOOL_STATIC_COLLECTED", "1")
    # The worker's queues are read only on the embedded broker, not on a Redis one.
    broker = var_dir() / "celery-broker.sqlite3"
    stall_watch = None if os.environ.get("REDIS_URL") else StallWatch(broker)
    processes = [
        Supervised(
            "web",
            [
                str(BIN / "python"),
                "-m",
                "portal.serve",
                "--host",
                host,
                "--port",
                port,
                "--log-level",
                "warning",
            ],
        ),
        Supervised(
            "worker",
            [
                str(BIN / "celery"),
                "-A",
                "portal",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
            ],
            stalled=stall_watch,
        ),
        Supervised("beat", [str(BIN / "celery"), "-A", "portal", "beat", "--loglevel", "INFO"]),
    ]
    began = time.monotonic()
    collect_static()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    web, *others = processes
    try:
        prepare(migrated=web.start)
        took = time.monotonic() - began
        print(f"prepared in {took:.0f} s; starting the worker and beat...", flush=True)
        for process in others:
            process.start()
        # Said once the web server answers: on a busy machine it takes a while to listen,
        # and a user who opened the address at once got "connection refused".
        wait_listening(host, int(port), web)
        print(f"\nGPUPool is running at http://{host}:{port}/  (Ctrl-C stops it)\n", flush=True)
        while all(process.check(time.monotonic()) for process in processes):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        # Stopping runs to its end: a second Ctrl-C or SIGTERM meanwhile (an impatient
        # user, or `make` passing its own on) once broke off stop_all with a traceback and
        # left beat and a JupyterLab pod running.
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, signal.SIG_IGN)
        stop_all(processes)
        # Local pods (a workspace's JupyterLab) are processes of their own that outlive a
        # worker on purpose (a restarted worker finds them again); the demo is over, so
        # they stop too.
        subprocess.run([sys.executable, "manage.py", "local_pods_stop"], cwd=ROOT, check=False)


if __name__ == "__main__":
    sys.exit(main())
