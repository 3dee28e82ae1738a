"""A job on the local backend reports its checkpoints to the real portal from inside its
network namespace (which reaches nothing else of the machine): the portal under uvicorn in a
thread of this process, the pod a real sandboxed process."""

from __future__ import annotations

import sys

import pytest

from clusters.backends.local import LocalBackend
from clusters.tasks import reconcile_cluster
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_submit
from scheduling.tasks import run_cycle
from tests.workspaces.helpers import local_cluster, stop_and_reap, wait_until
from tests.workspaces.test_ports_ssh_local import portal_url  # noqa: F401 - fixture

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("sandbox_required"),
]
REPORT = (
    "import os, urllib.request\n"
    "request = urllib.request.Request(os.environ['GPUPOOL_CHECKPOINT_URL'], data=b'', headers="
    "{'Authorization': 'Bearer ' + os.environ['GPUPOOL_CHECKPOINT_TOKEN']})\n"
    "print('portal answered', urllib.request.urlopen(request, timeout=30).status, flush=True)\n"
    "import time; time.sleep(600)\n"
)


@pytest.fixture(autouse=True)
def _var_dir(local_var_dir):
    pass


def test_a_local_job_reports_its_checkpoint_to_the_portal_through_its_door(
    org,
    settings,
    portal_url,  # noqa: F811
):
    settings.SITE_URL = portal_url
    cluster = local_cluster()
    workload = workload_submit(
        actor=org.researcher, project=org.project_a, kind="training", name="keeps",
        image="python", command=[sys.executable, "-c", REPORT], checkpoint_dir="ckpt", gpus=0,
    )  # fmt: skip

    def log() -> str:
        return LocalBackend(cluster).pod_logs(f"gp-{workload.id}-0", "")

    def reported() -> bool:
        """The portal took the report, and the pod read its answer."""
        run_cycle()
        reconcile_cluster(cluster.id)
        taken = Workload.objects.get(pk=workload.id).last_checkpoint_at is not None
        return taken and "portal answered 200" in log()

    try:
        try:
            wait_until(reported, 60, "the checkpoint report", interval=1)
        except AssertionError as exc:
            state = Workload.objects.get(pk=workload.id)
            raise AssertionError(f"{exc}: {state.state} {state.message!r}, {log()!r}") from exc
        assert Workload.objects.get(pk=workload.id).state == WorkloadState.RUNNING
    finally:
        stop_and_reap(workload.id, cluster)
