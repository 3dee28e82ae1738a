"""Run GPUPool on its embedded default: migrate, seed a demo organisation, then start the
web server (uvicorn), a Celery worker and Celery beat. Ctrl-C stops all three.

Safe to run again: migrations and the seed are idempotent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def manage(*args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True)


def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
    print(f"starting {name}: {' '.join(cmd)}", flush=True)
    # Own process group, so Ctrl-C in the terminal reaches us once and we stop each cleanly.
    return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)


def stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    # SIGTERM to each main process only: Celery's worker stops its own pool children
    # (signalling the whole group makes them log spurious errors). Celery needs several
    # seconds to stop on a busy machine, so allow 30 before killing what is left.
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for name, proc in procs.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{name} did not stop in time; killing it", flush=True)
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    host = os.environ.get("GPUPOOL_HOST", "127.0.0.1")
    port = os.environ.get("GPUPOOL_PORT", "8000")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("SITE_URL", f"http://{host}:{port}")
    # Development mode (static files from their folders, cookies over plain http); users
    # still get the styled error pages, only staff see Django's technical ones.
    os.environ.setdefault("DEBUG", "1")
    manage("migrate", "--noinput")
    manage("seed_demo")
    procs = {
        "web": start(
            "web",
            [
                str(BIN / "uvicorn"),
                "portal.asgi:application",
                "--host",
                host,
                "--port",
                port,
                "--log-level",
                "warning",
            ],
        ),
        "worker": start(
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
        ),
        "beat": start("beat", [str(BIN / "celery"), "-A", "portal", "beat", "--loglevel", "INFO"]),
    }
    print(f"\nGPUPool is running at http://{host}:{port}/  (Ctrl-C stops it)\n", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while all(proc.poll() is None for proc in procs.values()):
            time.sleep(0.5)
        dead = [name for name, proc in procs.items() if proc.poll() is not None]
        print(f"{', '.join(dead)} exited; stopping the rest", flush=True)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        stop_all(procs)
        # Local pods (a workspace's JupyterLab) are processes of their own that outlive a
        # worker on purpose; the demo is over, so they stop too.
        subprocess.run([sys.executable, "manage.py", "local_pods_stop"], cwd=ROOT, check=False)


if __name__ == "__main__":
    sys.exit(main())
