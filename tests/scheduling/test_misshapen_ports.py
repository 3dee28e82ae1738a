"""A pod's port addresses of the wrong shape (issue 27, bad rows): `PodAllocation.ports` is
an object of port name -> the address the backend reported (host:port, unix:/path). Another
writer's list, or a number for an address, fails that workload alone in the cycle (the check
reconcile makes too: scheduling/stored.py) and the port's proxy finds no upstream instead of
raising, while everyone else is scheduled."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduling.cycle import cycle_run
from scheduling.models import PodAllocation, Workload, WorkloadEvent, WorkloadState
from tests.planted import plant_text
from workspaces.selectors import workload_port_upstream

pytestmark = pytest.mark.django_db(transaction=True)

MISSHAPEN = {
    # A list or a text where an object belongs: PostgreSQL's CHECK refuses it (scheduling
    # 0017); on SQLite a row written before the check, or with checks off, still holds it.
    "list": ('["127.0.0.1:8080"]', "ports is a list, not an object"),
    "text": ('"127.0.0.1:8080"', "ports is a text, not an object"),
    "address-number": ('{"web": 8080}', "ports has an address that is not a text"),
    "address-object": ('{"web": {"host": "x"}}', "ports has an address that is not a text"),
}


@pytest.mark.parametrize("case", MISSHAPEN)
def test_port_addresses_of_the_wrong_shape_fail_their_workload_only(org, cluster, submit, case):
    value, expected = MISSHAPEN[case]
    if not value.startswith("{") and connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's CHECK refuses a ports value that is no object")
    bad = submit(org.researcher, org.project_a, "misaddressed", gpus=2)
    assert cycle_run().ok
    Workload.objects.filter(pk=bad.pk).update(spec={"ports": [{"name": "web", "port": 8080}]})
    alloc = PodAllocation.objects.get(workload=bad)
    plant_text(alloc, ports=value)
    later = submit(org.outsider, org.project_b, "later", gpus=2)
    assert workload_port_upstream(Workload.objects.get(pk=bad.pk), "web") is None

    run = cycle_run()

    assert run.ok and run.quarantined == 1, run.error
    assert Workload.objects.get(pk=bad.pk).state == WorkloadState.FAILED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert event.reason == "InvalidRequest", event.reason
    assert f"its allocation {alloc.pk}: {expected}" in event.message, event.message
    assert Workload.objects.get(pk=later.pk).state == WorkloadState.ADMITTED
