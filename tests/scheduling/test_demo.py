"""The demo seed submits its workloads once, however often it runs."""

from __future__ import annotations

import io

import pytest

from clusters import demo as clusters_demo
from portal import demo as portal_demo
from scheduling import demo
from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy, WorkloadState

pytestmark = pytest.mark.django_db


def test_the_demo_seed_is_idempotent_and_its_workloads_get_placed(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    portal_demo.seed(out)
    clusters_demo.seed(out)
    demo.seed(out)
    demo.seed(out)
    assert "Demo workloads: 8 submitted" in out.getvalue()
    assert "Demo workloads: 0 submitted" in out.getvalue()
    assert Workload.objects.filter(parent=None).count() == 8
    assert WorkloadPolicy.objects.get(department__name="Vision").max_runtime_s == 86400
    run = cycle_run()
    assert run.ok and run.admitted == 10  # 4 of them on MIG instances (pool h100)
    waiting = Workload.objects.filter(state=WorkloadState.PENDING).values_list("name", flat=True)
    assert sorted(waiting) == [
        "lr-sweep-trial-2", "lr-sweep-trial-3", "tok-sweep-mig-trial-2", "tok-sweep-mig-trial-3"
    ]  # fmt: skip
    mig = Workload.objects.filter(state=WorkloadState.ADMITTED, gpu_request="mig")
    assert sorted(mig.values_list("name", flat=True)) == [
        "embed-mig", "eval-mig", "tok-sweep-mig-trial-0", "tok-sweep-mig-trial-1"
    ]  # fmt: skip
