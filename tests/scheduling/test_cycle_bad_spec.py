"""A pending row whose program or spec no pod can be made of (issue 27, bad rows) is
quarantined by the cycle, before it is admitted: the same check reconcile makes
(scheduling/stored.py), so it never reaches a cluster's pass."""

from __future__ import annotations

import pytest

from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadEvent, WorkloadState
from tests.clusters.test_reconcile_bad_rows import BAD

pytestmark = pytest.mark.django_db(transaction=True)

# Placement wishes of the wrong shape: the engine would take an object's keys for pools.
# (A nomination of the wrong shape is dropped as stale: scheduling/nominations.py.)
MISSHAPEN = {
    "node_pools-object": ({"node_pools": {"a100": 1}}, "node_pools is not a list of pool names"),
    "node_pools-numbers": ({"node_pools": [1, 2]}, "node_pools is not a list of pool names"),
}


@pytest.mark.parametrize("case", [*BAD, *MISSHAPEN])
def test_the_cycle_fails_a_row_no_pod_can_be_made_of_and_admits_the_rest(
    org, cluster, submit, case
):
    planted, field = {**BAD, **MISSHAPEN}[case]
    bad = submit(org.researcher, org.project_a, "malformed", gpus=1)
    good = submit(org.outsider, org.project_b, "honest", gpus=1)
    Workload.objects.filter(pk=bad.pk).update(**planted)

    run = cycle_run()

    assert run.ok and run.quarantined == 1, run.error
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    assert Workload.objects.get(pk=bad.pk).state == WorkloadState.FAILED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert event.reason == "InvalidRequest" and field in event.message, event.message
