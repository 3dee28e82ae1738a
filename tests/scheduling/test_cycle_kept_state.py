"""The portal's cycle keeps the engine's state between cycles of one process (issue 17).

Each cycle below also runs the pure engine on the same snapshot: the kept state must
decide exactly as a rebuild would, through submits, admissions, stops, pods going away,
quota changes and a cordoned node; a cycle that another process ran in between (its
CycleRun row) is a version jump, and the state is rebuilt.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

import scheduling.cycle
from clusters.models import Node
from portal.models import ProjectQuota
from scheduling.cycle import KEPT, cycle_run
from scheduling.engine import schedule as rebuilt_schedule
from scheduling.lifecycle import workload_pods_released
from scheduling.models import CycleRun, CycleState, Workload, WorkloadState
from scheduling.services import workload_stop
from tests.scheduling.conftest import make_nodes

pytestmark = pytest.mark.django_db


@pytest.fixture
def compared(monkeypatch):
    """Every cycle's result next to a rebuild's on the same snapshot; counts both."""
    real = scheduling.cycle.schedule
    seen: list[bool] = []

    def both(snapshot, config, now):
        kept = real(snapshot, config, now)
        seen.append(kept == rebuilt_schedule(snapshot, config, now))
        return kept

    monkeypatch.setattr(scheduling.cycle, "schedule", both)
    KEPT.engine.rebuild()
    KEPT.version = None
    return seen


def _counts() -> tuple[int, int]:
    return KEPT.engine.builds, KEPT.engine.updates


def test_cycles_of_one_process_update_the_kept_state_and_decide_as_a_rebuild(org, submit, compared):
    make_nodes(org.pool, 3, 4)
    jobs = [submit(org.researcher, org.project_a, f"a-{i}", gpus=1 + i % 2) for i in range(5)]
    jobs += [submit(org.outsider, org.project_b, f"b-{i}", gpus=2) for i in range(4)]
    builds, updates = _counts()
    cycle_run()  # first cycle of this process: built
    assert _counts() == (builds + 1, updates)
    cycle_run()  # nothing new happened but its own admissions
    workload_stop(actor=org.researcher, workload=jobs[0], reason="Test", message="done")
    cycle_run()  # the stopped job's pods are still going away: their GPUs stay taken
    workload_pods_released(Workload.objects.get(pk=jobs[0].pk))
    submit(org.researcher, org.project_a, "late", gpus=0.5, gpu_request="fraction")
    cycle_run()
    ProjectQuota.objects.filter(project=org.project_b).update(gpus=8)
    cycle_run()
    Node.objects.filter(name="a100-node-2").update(schedulable=False)
    cycle_run()
    assert compared and all(compared)
    assert _counts()[1] - updates >= 4  # the quota change and the stop were diffs


def test_a_cycle_run_by_another_process_in_between_makes_the_next_one_rebuild(
    org, cluster, submit, compared
):
    submit(org.researcher, org.project_a, "job", gpus=1)
    cycle_run()
    builds, updates = _counts()
    cycle_run()
    assert _counts() == (builds, updates + 1)
    CycleRun.objects.create(started_at=timezone.now(), state=CycleState.OK, holder="another")
    submit(org.researcher, org.project_a, "next", gpus=1)
    cycle_run()
    assert _counts() == (builds + 1, updates + 1)
    assert Workload.objects.filter(state=WorkloadState.ADMITTED).count() == 2
    assert all(compared)
