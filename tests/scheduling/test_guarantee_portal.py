"""The guaranteed quota through the portal (issue 24): the real cycle over the database,
the adapter and the events. An owner within its deserved quota, blocked only by another
project's preemptible work over that project's quota, gets its GPUs within two cycles
(the first evicts, reconciliation confirms the pods gone, the second admits), whatever the
victims' checkpoints, start times or order; every eviction's event names the real cause.

The engine's own properties are in tests/engine/test_guarantee_promise.py; this one
checks that the live path keeps the promise: checkpoint intervals and times reach the
engine from the rows (a reclaim that waited for them, as before issue 24, fails here)."""

from __future__ import annotations

import random
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import DepartmentQuota
from scheduling.cycle import cycle_run
from scheduling.lifecycle import workload_pods_released
from scheduling.models import Workload, WorkloadState

pytestmark = pytest.mark.django_db
S = WorkloadState


def _borrow_everything(org, submit, rng: random.Random) -> list[Workload]:
    """vision fills the 8 GPUs with one-GPU jobs (4 of them on language's quota), each
    with a random start and checkpoint interval, and its next checkpoint due soon (a
    reclaim that waited for checkpoints would wait for every one of them)."""
    jobs = [submit(org.researcher, org.project_a, f"v{i}", gpus=1) for i in range(8)]
    cycle_run()
    now = timezone.now()
    for wl in jobs:
        interval = rng.choice([600, 1800, 3600])
        started = now - timedelta(seconds=rng.uniform(interval, 20_000))
        saved = now - timedelta(seconds=rng.uniform(0.5, 0.99) * interval)
        Workload.objects.filter(pk=wl.pk).update(
            admitted_at=started, checkpoint_interval_s=interval, last_checkpoint_at=saved
        )
    assert Workload.objects.filter(state=S.ADMITTED).count() == 8
    return jobs


@pytest.mark.parametrize("seed", range(6))
def test_an_owner_gets_its_guaranteed_gpus_within_two_cycles_whatever_the_checkpoints(
    org, cluster, submit, seed
):
    DepartmentQuota.objects.update(gpus=4)
    rng = random.Random(seed)
    jobs = _borrow_everything(org, submit, rng)
    n = rng.randint(1, 4)  # within nlp's deserved 4
    if rng.random() < 0.5:
        owner = [submit(org.outsider, org.project_b, "gang", kind="distributed", workers=n, gpus=1)]
    else:
        owner = [submit(org.outsider, org.project_b, f"o{i}", gpus=1) for i in range(n)]
    cycle_run()
    victims = [wl for wl in jobs if Workload.objects.get(pk=wl.pk).state == S.PREEMPTED]
    reasons = [Workload.objects.get(pk=wl.pk).pending_reason for wl in owner]
    assert len(victims) == n, f"seed {seed}: {len(victims)} evicted for {n} GPUs: {reasons}"
    for victim in victims:
        event = victim.events.last()
        assert (event.type, event.reason) == ("preempted", "Preempted:reclaim")
        assert event.message.startswith("Reclaimed for project nlp's guaranteed quota: nlp/")
        assert re.search(r"; nlp holds [0-3] of its deserved 4\.$", event.message)
        workload_pods_released(Workload.objects.get(pk=victim.pk))  # reconcile saw them go
    cycle_run()
    states = {Workload.objects.get(pk=wl.pk).state for wl in owner}
    assert states == {S.ADMITTED}, f"seed {seed}: the owner still waits after two cycles"
