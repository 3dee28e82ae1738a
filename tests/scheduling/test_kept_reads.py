"""reads_kept: a caller checking many submits at once (a native intake pass) reads what they
share once: the nodes' sizes, the pools' names, each project's policy."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.errors import ValidationFailed
from portal.models import AuditLog
from scheduling.fits import node_rooms
from scheduling.kept import reads_kept
from scheduling.models import Workload, WorkloadEvent
from scheduling.services import workload_check, workload_create_checked, workloads_create_checked
from tests.scheduling.conftest import make_nodes


def test_inside_the_block_each_pool_is_read_once_and_after_it_afresh(
    pool, django_assert_num_queries
):
    make_nodes(pool, 2, 4)
    with reads_kept():
        with django_assert_num_queries(1):
            first = node_rooms(["a100"], "")
            assert node_rooms(["a100"], "") == first
        make_nodes(pool, 1, 8)  # kept as the block began
        assert len(node_rooms(["a100"], "")) == 2
        with django_assert_num_queries(1):  # another request: read once too
            node_rooms([], "")
    rooms = node_rooms(["a100"], "")
    assert sorted(room.gpus for room in rooms) == [4, 4, 8]


def _tables(queries) -> list[str]:
    return [
        q["sql"].split(" FROM ")[1].split()[0].strip('"') for q in queries if " FROM " in q["sql"]
    ]


def test_submits_in_a_block_read_the_pools_and_each_projects_policy_once(org, cluster):
    """An intake pass's submits share the pools' names and a project's policy; a policy
    is read per project (two projects: two reads)."""
    spec = {"image": "pytorch/pytorch:2.3", "gpus": 1, "node_pools": ["a100"]}
    with reads_kept(), CaptureQueriesContext(connection) as seen:
        for index, project in enumerate([org.project_a, org.project_a, org.project_b]):
            workload_create_checked(
                org.platform_admin, project, "training", f"w{index}", dict(spec)
            )
    tables = _tables(seen.captured_queries)
    assert tables.count("clusters_nodepool") == 1
    assert tables.count("scheduling_workloadpolicy") == 2
    assert Workload.objects.filter(name__in=["w0", "w1", "w2"]).count() == 3


def test_a_name_read_free_but_taken_meanwhile_is_still_refused(org, cluster):
    """`name_free`: the caller read the name free (the intake reads all its names at
    once); one taken since is refused on the name by the table's constraint, and nothing
    is written."""
    spec = {"image": "pytorch/pytorch:2.3", "gpus": 1}
    workload_create_checked(org.platform_admin, org.project_a, "training", "dup", dict(spec))
    with pytest.raises(ValidationFailed) as refused:
        workload_create_checked(
            org.platform_admin, org.project_a, "training", "dup", dict(spec), name_free=True
        )
    assert "name" in refused.value.errors
    assert Workload.objects.filter(name="dup").count() == 1


def test_checked_submits_written_together_refuse_only_a_name_taken_since(org, cluster):
    """workloads_create_checked: a name taken after its check fails the batch's INSERT;
    the batch is then written one by one, so that submit alone is refused and the others
    are queued with their event and audit row (none for the refused one)."""
    spec = {"image": "pytorch/pytorch:2.3", "gpus": 1}
    checked = [
        workload_check(org.platform_admin, org.project_a, "training", name, dict(spec))
        for name in ("first", "later-taken", "third")
    ]
    workload_create_checked(org.platform_admin, org.project_a, "training", "later-taken", spec)
    answers = workloads_create_checked(org.platform_admin, checked)
    assert [type(a).__name__ for a in answers] == ["Workload", "ValidationFailed", "Workload"]
    assert "name" in answers[1].errors
    assert Workload.objects.filter(name="later-taken").count() == 1
    names = ["first", "third"]
    assert WorkloadEvent.objects.filter(workload__name__in=names, reason="Submitted").count() == 2
    audits = AuditLog.objects.filter(
        action="workload.submit", object_id__in=[a.pk for a in answers[::2]]
    )
    assert audits.count() == 2


def test_checked_submits_written_together_are_each_a_workload_with_its_event_and_audit(
    org, cluster
):
    """The rows, their first events and their audit rows: one INSERT each for all, each row
    with a version of its own (the cycle's kept rows read a row again when it changes)."""
    spec = {"image": "pytorch/pytorch:2.3", "gpus": 1}
    checked = [
        workload_check(org.platform_admin, org.project_a, "training", f"many-{i}", dict(spec))
        for i in range(12)
    ]
    with CaptureQueriesContext(connection) as seen:
        answers = workloads_create_checked(org.platform_admin, checked)
    inserts = [q["sql"].split()[2].strip('"') for q in seen if q["sql"].startswith("INSERT")]
    assert sorted(inserts) == ["portal_auditlog", "scheduling_workload", "scheduling_workloadevent"]
    rows = Workload.objects.filter(name__startswith="many-")
    assert sorted(w.pk for w in answers) == sorted(rows.values_list("pk", flat=True))
    assert len(set(rows.values_list("version", flat=True))) == 12
    events = WorkloadEvent.objects.filter(workload__in=rows, reason="Submitted")
    assert sorted(events.values_list("workload_id", flat=True)) == sorted(w.pk for w in answers)
    audits = AuditLog.objects.filter(
        action="workload.submit", object_id__in=[w.pk for w in answers]
    )
    assert sorted(a.after["name"] for a in audits) == sorted(f"many-{i}" for i in range(12))
