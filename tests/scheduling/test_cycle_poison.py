"""A row that cannot be turned into an engine request is quarantined, not fatal.

The values are planted straight in the database, as an older version or a hand edit
could leave them: on SQLite a cpu of 100000 in the DECIMAL(7, 2) column (what used to
raise decimal.InvalidOperation on every read of the row), on PostgreSQL what the column
holds but no node could run (99999.99 cores). The next cycle fails that row with the
reason and goes on for everyone else; every page and the API still answer; its owner and
the platform admin can stop and delete it from the page, the API and the CLI.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse
from rest_framework.test import APIClient

import scheduling.cycle
from portal.models import AuditLog
from scheduling.cycle import cycle_run
from scheduling.models import CycleRun, Workload, WorkloadEvent, WorkloadState
from tests import factories as f
from tests.planted import plant_text
from tests.scheduling.test_cli import gp  # noqa: F401 (the CLI against the live server)

pytestmark = pytest.mark.django_db(transaction=True)


def plant(workload: Workload) -> str:
    """Put an out-of-range cpu (and gpus) in the row behind the ORM's back; the value."""
    cpu, gpus = ("100000", "1000000") if connection.vendor == "sqlite" else ("99999.99", "999")
    plant_text(workload, cpu=cpu, gpus=gpus)  # on SQLite, past the CHECKs as an old row
    return cpu


PAGES = ("workload_list", "workload_queue", "workload_cycles", "dashboard")
API = ("api-workloads", "api-queue", "api-cycles")


def read_paths_answer(page_client, api_client, user, pk: int) -> None:
    """Every read path answers: 200, or 403 for the admin-only cycle pages."""
    page, api = page_client(user), api_client(user)
    urls = [(page, reverse(name)) for name in PAGES] + [(api, reverse(name)) for name in API]
    urls += [
        (page, reverse("workload_detail", args=[pk])),
        (api, reverse("api-workload", args=[pk])),
    ]
    for client, url in urls:
        response = client.get(url)
        expected = 200 if user.is_platform_admin or "cycles" not in url else 403
        assert response.status_code == expected, (url, response.status_code)


@pytest.fixture
def api_as():
    def as_user(user):
        client = APIClient()
        client.force_authenticate(user)
        return client

    return as_user


def test_the_cycle_fails_the_bad_row_and_runs_for_everyone_else(
    org, cluster, submit, client_as, api_as
):
    bad = submit(org.researcher, org.project_a, "poison", gpus=1)
    good = submit(org.outsider, org.project_b, "honest", gpus=2)
    cpu = plant(bad)
    for user in (org.researcher, org.platform_admin):
        read_paths_answer(client_as, api_as, user, bad.pk)

    run = cycle_run()

    assert run.ok and run.state == "ok" and run.quarantined == 1, run.error
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    bad = Workload.objects.get(pk=bad.pk)
    assert bad.state == WorkloadState.FAILED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert event.reason == "InvalidRequest" and f"cpu={cpu}" in event.message
    assert "Cannot be scheduled" in event.message
    detail = client_as(org.researcher).get(reverse("workload_detail", args=[bad.pk]))
    assert event.message in detail.content.decode()
    audit = AuditLog.objects.get(action="workload.quarantine", object_id=str(bad.pk))
    assert audit.actor is None and audit.department == org.dept_a
    # The next cycle runs clean: the failed row is no longer considered.
    again = cycle_run()
    assert again.ok and again.quarantined == 0
    for user in (org.researcher, org.platform_admin):
        read_paths_answer(client_as, api_as, user, bad.pk)
    page = client_as(org.platform_admin).get(reverse("workload_cycles"))
    assert "1 workload failed as unschedulable" in page.content.decode()
    # Its owner deletes it from the page.
    response = client_as(org.researcher).post(reverse("workload_delete", args=[bad.pk]))
    assert response.status_code == 302
    assert not Workload.objects.filter(pk=bad.pk).exists()


def test_the_bad_row_is_stopped_and_deleted_from_the_page_and_the_api(
    org, cluster, submit, client_as, api_as
):
    by_page = submit(org.researcher, org.project_a, "poison-page", gpus=1)
    by_api = submit(org.researcher, org.project_a, "poison-api", gpus=1)
    plant(by_page)
    plant(by_api)

    admin = client_as(org.platform_admin)
    assert admin.post(reverse("workload_stop", args=[by_page.pk])).status_code == 302
    assert Workload.objects.get(pk=by_page.pk).state == WorkloadState.STOPPED
    assert admin.post(reverse("workload_delete", args=[by_page.pk])).status_code == 302
    assert not Workload.objects.filter(pk=by_page.pk).exists()

    owner = api_as(org.researcher)
    response = owner.post(reverse("api-workload-stop", args=[by_api.pk]))
    assert response.status_code == 200, response.content
    assert response.json()["state"] == WorkloadState.STOPPED
    assert AuditLog.objects.filter(action="workload.stop", object_id=str(by_api.pk)).exists()
    assert owner.delete(reverse("api-workload", args=[by_api.pk])).status_code == 204
    assert not Workload.objects.filter(pk=by_api.pk).exists()


def test_the_bad_row_is_stopped_and_deleted_from_the_cli(org, cluster, submit, gp):  # noqa: F811
    bad = submit(org.researcher, org.project_a, "poison-cli", gpus=1)
    plant(bad)
    gp("login", "--url", gp.url, "--username", "admin", "--password", f.PASSWORD)
    assert "poison-cli" in gp("list")
    assert gp("stop", str(bad.pk)).strip() == "poison-cli: stopped."
    assert gp("delete", str(bad.pk)).strip() == f"Deleted workload {bad.pk}."
    assert not Workload.objects.filter(pk=bad.pk).exists()
    assert CycleRun.objects.count() == 0  # stopping went without a cycle


def test_a_running_row_planted_bad_is_failed_and_keeps_its_gpus_until_its_pods_go(
    org, cluster, submit, monkeypatch
):
    from tests.scheduling.test_cycle_overlap import overcommits

    running = submit(org.researcher, org.project_a, "running", gpus=4)
    assert cycle_run().admitted == 1
    held = {int(i) for a in running.allocations.all() for i in a.gpu_indices}
    plant(running)
    for i in range(3):
        submit(org.outsider, org.project_b, f"hungry-{i}", gpus=4)
    reconciled: list[set[int]] = []
    monkeypatch.setattr(scheduling.cycle, "reconcile_later", reconciled.append)

    run = cycle_run()

    assert run.ok and run.quarantined == 1, run.error
    assert cluster[0].cluster_id in reconciled[0], "its pods are deleted on its cluster"
    running = Workload.objects.get(pk=running.pk)
    assert running.state == WorkloadState.FAILED
    # Its pods may still be on the GPUs: they stay taken until reconciliation frees them.
    assert {int(i) for a in running.allocations.all() for i in a.gpu_indices} == held
    assert overcommits() == []
    assert Workload.objects.filter(state=WorkloadState.ADMITTED).count() == 1


INT32_MAX = 2**31 - 1


def test_the_largest_values_the_columns_hold_break_no_page_and_no_cycle(
    org, cluster, submit, client_as, api_as
):
    """On both databases: what the columns and their checks still take, at its extremes."""
    bad = submit(org.researcher, org.project_a, "extreme", gpus=1)
    good = submit(org.outsider, org.project_b, "honest", gpus=1)
    extremes = {"max_runtime_s": INT32_MAX, "checkpoint_interval_s": INT32_MAX}
    extremes |= {"restart_count": INT32_MAX, "priority": -INT32_MAX - 1, "exit_code": INT32_MAX}
    plant_text(bad, **extremes)
    for user in (org.researcher, org.outsider, org.platform_admin):
        read_paths_answer(client_as, api_as, user, bad.pk if user != org.outsider else good.pk)

    run = cycle_run()

    assert run.ok and run.quarantined == 0, run.error
    assert set(Workload.objects.values_list("state", flat=True)) == {WorkloadState.ADMITTED}
    plant_text(bad, min_gpus=32767)  # a GPU range no single pod may have
    again = cycle_run()
    assert again.ok and again.quarantined == 1, again.error
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert "a GPU range of 32767..1" in event.message, event.message
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    read_paths_answer(client_as, api_as, org.researcher, bad.pk)
