from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusters.metrics.models import GpuProcessSample, GpuSample
from clusters.metrics.services import samples_ingest
from portal.errors import ValidationFailed
from tests.metrics.helpers import T0, make_node, sample

pytestmark = pytest.mark.django_db


def test_samples_ingest_stores_every_field_of_every_sample(pool):
    node = make_node(pool)
    batch = [sample(node, gpu, T0, 10.0 * gpu, workload_id=7, pod_index=0) for gpu in range(4)]

    assert samples_ingest(batch) == 4

    stored = list(GpuSample.objects.order_by("gpu_index").values())
    assert [row["util_pct"] for row in stored] == [0.0, 10.0, 20.0, 30.0]
    assert stored[1]["ts"] == T0
    assert stored[1]["node_id"] == node.pk
    assert (stored[1]["mem_used_mib"], stored[1]["mem_total_mib"]) == (1000, 81920)
    assert (stored[1]["power_w"], stored[1]["temp_c"]) == (250.0, 60.0)
    assert (stored[1]["workload_id"], stored[1]["pod_index"]) == (7, 0)


def test_samples_may_name_the_node_by_cluster_and_name_and_give_epoch_or_iso_times(pool):
    node = make_node(pool, name="gpu-a")
    batch = [
        {"cluster": "sim", "node": "gpu-a", "gpu_index": 0, "ts": T0.timestamp(), "util_pct": 5,
         "mem_used_mib": 1, "mem_total_mib": 2},
        {"cluster": node.cluster_id, "node": "gpu-a", "gpu_index": 1,
         "ts": "2026-03-02T10:00:00Z", "util_pct": 6, "mem_used_mib": 1, "mem_total_mib": 2},
    ]  # fmt: skip

    assert samples_ingest(batch) == 2
    assert set(GpuSample.objects.values_list("node_id", "ts")) == {(node.pk, T0)}


def test_processes_are_stored_with_their_workload(pool):
    node = make_node(pool)
    procs = [{"pid": 4242, "used_mib": 3000, "workload_id": 9, "pod_index": 1}]
    samples_ingest([sample(node, 2, T0, 50, processes=procs)])

    stored = GpuProcessSample.objects.get()
    assert (stored.pid, stored.used_mib, stored.workload_id, stored.pod_index) == (4242, 3000, 9, 1)
    assert (stored.node_id, stored.gpu_index, stored.ts) == (node.pk, 2, T0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"util_pct": 101}, "util_pct must be between"),
        ({"util_pct": "high"}, "util_pct must be a number"),
        ({"gpu_index": -1}, "gpu_index must be"),
        ({"ts": "yesterday"}, "sample 1"),
        ({"node_id": None}, "node_id"),
        ({"workload_id": -3}, "workload_id must be"),
    ],
)
def test_a_bad_sample_rejects_the_whole_batch_and_names_itself(pool, change, message):
    node = make_node(pool)
    good = sample(node, 0, T0, 1)
    bad = {**sample(node, 1, T0, 1), **change}

    with pytest.raises(ValidationFailed) as caught:
        samples_ingest([good, bad])

    assert message in caught.value.errors["samples"][0]
    assert GpuSample.objects.count() == 0


def test_a_sample_missing_a_field_is_refused(pool):
    node = make_node(pool)
    incomplete = sample(node, 0, T0, 1)
    del incomplete["mem_total_mib"]
    with pytest.raises(ValidationFailed, match="mem_total_mib is missing"):
        samples_ingest([incomplete])


def test_a_naive_datetime_is_refused_rather_than_guessed(pool):
    node = make_node(pool)
    with pytest.raises(ValidationFailed, match="naive"):
        samples_ingest([sample(node, 0, dt.datetime(2026, 3, 2, 10, 0), 1)])


def test_an_empty_batch_stores_nothing():
    assert samples_ingest([]) == 0


def test_samples_for_a_node_the_portal_does_not_know_are_refused(pool):
    node = make_node(pool)
    with pytest.raises(ValidationFailed, match=r"unknown node id\(s\): \[" + str(node.pk + 1)):
        samples_ingest([sample(node, 0, T0, 1), {**sample(node, 0, T0, 1), "node_id": node.pk + 1}])
    assert GpuSample.objects.count() == 0


def test_a_sample_from_a_clock_running_ahead_is_refused_with_the_reason(pool):
    node = make_node(pool)
    soon = timezone.now() + dt.timedelta(minutes=5)  # within the slack: clocks drift a little
    late = timezone.now() + dt.timedelta(days=2)
    assert samples_ingest([sample(node, 0, soon, 1.0)]) == 1
    with pytest.raises(ValidationFailed) as refused:
        samples_ingest([sample(node, 0, soon, 1.0), sample(node, 1, late, 1.0)])
    (message,) = refused.value.errors["samples"]
    assert message.startswith("sample 1: ts ")
    assert "is in the future; check the node's clock" in message
    assert GpuSample.objects.count() == 1
