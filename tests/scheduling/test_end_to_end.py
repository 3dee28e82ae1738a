"""End to end through real processes: a Celery worker (with beat) on the Redis broker runs
the cycle and reconciles a simulated cluster, while the test plays the users.

Run it under the services runner, which starts PostgreSQL and Redis:

    .venv/bin/python -m tests.services -- .venv/bin/pytest tests/scheduling/test_end_to_end.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from clusters.backends.simulated import description_parse
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster
from portal.celery import app as celery_app
from portal.models import DepartmentQuota
from scheduling.models import Workload, WorkloadState

S = WorkloadState
pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("REDIS_URL"),
        reason="needs the Redis broker: run under `python -m tests.services -- pytest ...`",
    ),
    pytest.mark.django_db(transaction=True),
]
SIMULATED = """
groups:
  - {prefix: a100, count: 2, gpus: 4, gpu_model: A100, gpu_memory_mib: 81920,
     labels: {gpupool.io/node-pool: a100}}
stop_delay_s: 0
"""


def database_url() -> str:
    """The URL of the test database this test runs in, for the worker process."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = f"{quote(db['USER'] or '')}:{quote(db['PASSWORD'] or '')}@"
    return f"postgresql://{auth}{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture
def worker(tmp_path):
    """A real `celery worker -B` process on the test database; stopped afterwards."""
    if connection.vendor == "sqlite":
        pytest.skip("the worker needs a database it can open too: run under tests.services")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "GPUPOOL_VAR_DIR": str(tmp_path),
        "GPUPOOL_CYCLE_INTERVAL_S": "1",
        "GPUPOOL_RECONCILE_INTERVAL_S": "1",
    }
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    celery = os.path.join(os.path.dirname(sys.executable), "celery")
    process = subprocess.Popen(
        [celery, "-A", "portal", "worker", "-B", "--pool=solo", "--loglevel=INFO",
         "--schedule", str(tmp_path / "beat-schedule"), "--without-gossip", "--without-mingle"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    # This process sends tasks to that worker instead of running them in place.
    celery_app.conf.CELERY_TASK_ALWAYS_EAGER = False
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        print((tmp_path / "worker.log").read_text()[-4000:])


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    states = list(Workload.objects.values_list("name", "state", "restart_count", "pending_reason"))
    pytest.fail(f"timed out waiting until {what}; workloads: {states}")


def state_of(name: str) -> tuple[str, int]:
    wl = Workload.objects.get(name=name)
    return wl.state, wl.restart_count


def test_borrowed_gpus_are_reclaimed_and_the_preempted_job_resumes(org, submit, worker):
    # Each department deserves 4 of the simulated cluster's 8 GPUs.
    DepartmentQuota.objects.update(gpus=4)
    cluster = Cluster.objects.create(
        name="sim", backend=Backend.SIMULATED, config=description_parse(SIMULATED)
    )
    inventory_sync(cluster)
    # 1. ml-vision asks for 8 GPUs while nlp is idle: both jobs run, one over quota.
    for name in ("first", "second"):
        submit(org.researcher, org.project_a, name, gpus=4, checkpoint_dir=f"/ckpt/{name}")
    wait_for(
        lambda: {state_of("first")[0], state_of("second")[0]} == {S.RUNNING},
        "both ml-vision jobs run on the 8 GPUs",
    )
    # 2. nlp, the owner of the borrowed GPUs, submits: a borrower is preempted.
    submit(org.outsider, org.project_b, "owner", gpus=4, duration_s=3)
    wait_for(lambda: state_of("owner")[0] == S.RUNNING, "the owner runs")
    victim = Workload.objects.get(project=org.project_a, restart_count=1)
    assert victim.checkpoint_dir == f"/ckpt/{victim.name}"
    events = list(victim.events.values_list("type", "reason"))
    assert events[:5] == [
        ("pending", "Submitted"),
        ("admitted", "Admitted"),
        ("running", "Started"),
        ("preempted", "Preempted:reclaim"),
        ("pending", "Requeued"),
    ]
    assert victim.events.get(type="preempted").message.startswith(
        "Reclaimed for project nlp's guaranteed quota: nlp/owner needs 4 GPUs in pool a100"
    )
    survivor = Workload.objects.get(project=org.project_a, restart_count=0)
    assert survivor.state == S.RUNNING
    # 3. The owner finishes after its 3 s; the preempted job is admitted again, once.
    wait_for(lambda: state_of("owner")[0] == S.SUCCEEDED, "the owner's job succeeds")
    wait_for(lambda: state_of(victim.name) == (S.RUNNING, 1), "the preempted job runs again")
    victim.refresh_from_db()
    assert victim.events.filter(type="admitted").count() == 2
    assert victim.allocations.count() == 1
