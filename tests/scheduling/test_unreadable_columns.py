"""A text in a numeric or date column (issue 27, bad rows): SQLite stores `cpu = 'abc'` or
`gpus = 'NaN'` as given (PostgreSQL refuses the text, and holds numeric NaN). Such a row
loads with a stand-in out of bounds (scheduling.models.TolerantDecimalField), so every page
and the API answer for everyone, and the next cycle fails the row saying which value is not
a number, and resets it to its default. A `created_at` that is no date loads as the epoch
(scheduling.models.tolerant_datetime), a text in pods, min_pods, memory_mib or
gpu_memory_mib as -1 (tolerant_count), and each is quarantined the same way."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadEvent, WorkloadState
from tests.planted import plant_text
from tests.scheduling.test_cycle_poison import api_as, read_paths_answer  # noqa: F401

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses the text"),
]


def every_read_answers(org, client_as, api_as, bad: Workload, good: Workload) -> None:  # noqa: F811
    """For another user (their own workload), the bad row's owner and the admin."""
    for user in (org.outsider, org.researcher, org.platform_admin):
        read_paths_answer(client_as, api_as, user, good.pk if user == org.outsider else bad.pk)


def quarantined_alone(org, client_as, api_as, bad: Workload, good: Workload) -> str:  # noqa: F811
    """Every read answers before and after the cycle, which fails the bad row only and
    says why on its page; the message."""
    every_read_answers(org, client_as, api_as, bad, good)
    run = cycle_run()
    assert run.ok and run.quarantined == 1, run.error
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert event.reason == "InvalidRequest", event.message
    detail = client_as(org.researcher).get(reverse("workload_detail", args=[bad.pk]))
    assert event.message in detail.content.decode()
    every_read_answers(org, client_as, api_as, bad, good)
    return event.message


@pytest.fixture
def quarantined(org, cluster, submit, client_as, api_as):  # noqa: F811
    """Plant `columns` in one workload beside another user's, then quarantined_alone: the
    message, and the row as the cycle left it."""

    def plant_and_cycle(**columns: str) -> tuple[str, Workload]:
        bad = submit(org.researcher, org.project_a, "typed-by-hand", gpus=1)
        good = submit(org.outsider, org.project_b, "honest", gpus=1)
        dates = any(name.endswith("_at") for name in columns)
        assert "text" in plant_text(bad, **columns) or dates
        message = quarantined_alone(org, client_as, api_as, bad, good)
        return message, Workload.objects.get(pk=bad.pk)

    return plant_and_cycle


@pytest.mark.parametrize(("cpu", "gpus"), [("abc", "1"), ("1", "NaN"), ("abc", "abc")])
def test_a_text_in_cpu_or_gpus_breaks_no_page_and_fails_only_its_row(quarantined, cpu, gpus):
    message, row = quarantined(cpu=cpu, gpus=gpus)
    texts = [name for name, value in (("cpu", cpu), ("gpus", gpus)) if value != "1"]
    for name in texts:
        assert f"{name} is not a number in the database" in message, message
        assert getattr(row, name) == Workload._meta.get_field(name).get_default()


COUNTS = ["pods", "min_pods", "memory_mib", "gpu_memory_mib", "priority", "min_gpus"]
COUNTS += ["max_runtime_s", "checkpoint_interval_s", "restart_count", "exit_code"]


@pytest.mark.parametrize("column", COUNTS)
def test_a_text_in_a_count_breaks_no_page_and_fails_only_its_row(quarantined, column):
    message, row = quarantined(**{column: "abc"})
    assert f"{column} is not a number in the database" in message, message
    field = Workload._meta.get_field(column)
    assert getattr(row, column) == (None if field.null else field.get_default())


@pytest.mark.parametrize("value", ["garbage", "2026-13-45 99:99:99", "2026-02-31 10:00:00", "0"])
def test_a_created_at_that_is_no_date_breaks_no_page_and_fails_only_its_row(quarantined, value):
    message, _ = quarantined(created_at=value)
    assert "created_at is not a date in the database" in message, message


@pytest.mark.parametrize(
    "column", ["queued_at", "admitted_at", "started_at", "finished_at", "last_checkpoint_at"]
)
def test_any_date_that_is_no_date_breaks_no_page_and_fails_only_its_row(quarantined, column):
    message, _ = quarantined(**{column: "2026-13-45 99:99:99"})
    assert f"{column} is not a date in the database" in message, message


@pytest.mark.parametrize("column", ["kind", "gpu_request", "priority_class"])
def test_a_choice_none_of_its_choices_names_fails_only_its_row(quarantined, column):
    message, _ = quarantined(**{column: "bogus"})
    assert f"{column}=bogus is not one of its choices" in message, message


def test_an_unknown_state_breaks_no_page_and_no_cycle(org, cluster, submit, client_as, api_as):  # noqa: F811
    bad = submit(org.researcher, org.project_a, "lost", gpus=1)
    good = submit(org.outsider, org.project_b, "honest", gpus=1)
    plant_text(bad, state="bogus")
    every_read_answers(org, client_as, api_as, bad, good)

    run = cycle_run()

    assert run.ok and run.quarantined == 0, run.error
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    every_read_answers(org, client_as, api_as, bad, good)


def test_a_running_row_with_a_text_runtime_is_quarantined_not_stopped_for_its_runtime(
    org, cluster, submit
):
    bad = submit(org.researcher, org.project_a, "timed", gpus=1, max_runtime_s=3600)
    good = submit(org.outsider, org.project_b, "honest", gpus=1, max_runtime_s=3600)
    assert cycle_run().ok
    plant_text(bad, max_runtime_s="abc")

    run = cycle_run()

    assert run.ok and run.quarantined == 1 and run.stopped == 0, run.error
    assert Workload.objects.get(pk=good.pk).state == WorkloadState.ADMITTED
    event = WorkloadEvent.objects.get(workload=bad, type=WorkloadState.FAILED)
    assert "max_runtime_s is not a number in the database" in event.message, event.message


def test_the_row_is_stopped_deleted_and_shown_in_django_admin_before_any_cycle(
    org, cluster, submit, client_as
):
    stopped = submit(org.researcher, org.project_a, "stop-me", gpus=1)
    deleted = submit(org.researcher, org.project_a, "delete-me", gpus=1)
    plant_text(stopped, cpu="abc", gpus="NaN", pods="abc", max_runtime_s="abc", exit_code="x")
    plant_text(stopped, restart_count="abc", min_gpus="abc", queued_at="2026-13-45 10:00:00")
    plant_text(deleted, cpu="NaN", gpus="abc", memory_mib="abc", checkpoint_interval_s="abc")
    admin = client_as(org.platform_admin)
    for url in ("admin:scheduling_workload_changelist", "admin:scheduling_workload_change"):
        args = [stopped.pk] if url.endswith("change") else []
        assert admin.get(reverse(url, args=args)).status_code == 200, url

    owner = client_as(org.researcher)
    assert owner.post(reverse("workload_stop", args=[stopped.pk])).status_code == 302
    assert Workload.objects.get(pk=stopped.pk).state == WorkloadState.STOPPED
    assert owner.post(reverse("workload_delete", args=[deleted.pk])).status_code == 302
    assert not Workload.objects.filter(pk=deleted.pk).exists()
