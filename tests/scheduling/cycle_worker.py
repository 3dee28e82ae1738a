"""A separate process for the two-cycles-at-once test on a file SQLite database.

    python -m tests.scheduling.cycle_worker setup          # migrate, 8 GPUs, 8 one-GPU jobs
    python -m tests.scheduling.cycle_worker run DIR N       # N processes start one slow cycle
    python -m tests.scheduling.cycle_worker check           # print what was handed out
    python -m tests.scheduling.cycle_worker hang            # a cycle that never ends (kill it)
    python -m tests.scheduling.cycle_worker probe T0        # cycle until one runs; wait from T0

GPUPOOL_VAR_DIR points every process at the same database file; each prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


def setup() -> dict:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from scheduling.services import workload_submit
    from tests import factories as f
    from tests.scheduling.conftest import make_nodes

    pool = f.make_pool("a100")
    dept = f.make_department("vision")
    project = f.make_project(dept, "ml-vision")
    f.make_project_quota(project, pool, gpus=8)
    user = f.make_user("rita", platform_admin=True)
    make_nodes(pool, 2, 4)
    for i in range(8):
        workload_submit(
            actor=user, project=project, kind="training", name=f"job-{i}", image="x", gpus=1
        )
    return {"ok": True}


def run(barrier: str, parties: int) -> dict:
    import scheduling.cycle

    real = scheduling.cycle.schedule

    def slow(*args, **kwargs):
        time.sleep(1.0)  # keep the cycle open long enough for the other process to try
        return real(*args, **kwargs)

    scheduling.cycle.schedule = slow
    _barrier(Path(barrier), parties)
    result = scheduling.cycle.cycle_run()
    return {"ran": result is not None, "admitted": result.admitted if result else 0}


def _barrier(folder: Path, parties: int, timeout: float = 60.0) -> None:
    """Start together: each process, once loaded, marks itself and waits for the others."""
    folder.mkdir(exist_ok=True)
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError("the other cycle process never started")
        time.sleep(0.005)


def hang() -> dict:
    """Take the lock and stay inside the engine until killed."""
    import scheduling.cycle

    def forever(*args, **kwargs):
        time.sleep(3600)

    scheduling.cycle.schedule = forever
    scheduling.cycle.cycle_run()
    return {"ran": True}


def probe(since: float) -> dict:
    """Try a cycle every 0.1 s until one runs. Returns when the dead worker's lease ran
    out (`lock_until`, epoch s, read before the first try), how many tries were refused
    although they began after it (none, if the expiry alone frees the lock), and what
    became of the dead worker's cycle."""
    from portal.models import Lease
    from scheduling.cycle import cycle_run
    from scheduling.locks import NAME
    from scheduling.models import CycleRun

    lock_until = Lease.objects.get(name=NAME).locked_until.timestamp()
    refused_after_expiry = 0
    while True:
        began = time.time()
        if (run := cycle_run()) is not None:
            break
        refused_after_expiry += began > lock_until
        if began - since > 120:
            raise TimeoutError("no cycle could run for 120 s")
        time.sleep(0.1)
    others = CycleRun.objects.exclude(pk=run.pk).values("state", "ok", "error")
    return {
        "lock_until": lock_until,
        "refused_after_expiry": refused_after_expiry,
        "admitted": run.admitted,
        "state": run.state,
        "others": list(others),
    }


def check() -> dict:
    from scheduling.models import CycleRun, PodAllocation

    devices = [[a.node_id, int(i)] for a in PodAllocation.objects.all() for i in a.gpu_indices]
    cycles = [
        [run.started_at.timestamp(), run.started_at.timestamp() + run.duration_ms / 1000]
        for run in CycleRun.objects.order_by("started_at")
    ]
    return {"devices": devices, "cycles": cycles}


def main() -> None:
    import django

    # The worker processes must not try to reach a broker: requests for cycles are no-ops.
    from portal.celery import app

    app.conf.CELERY_TASK_ALWAYS_EAGER = False
    django.setup()
    from scheduling import tasks

    tasks.request_cycle = lambda: None
    command = sys.argv[1]
    if command == "setup":
        out = setup()
    elif command == "run":
        out = run(sys.argv[2], int(sys.argv[3]))
    elif command == "hang":
        out = hang()
    elif command == "probe":
        out = probe(float(sys.argv[2]))
    else:
        out = check()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
