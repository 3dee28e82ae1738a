"""The queue page shows the engine's own order (CycleRun.pending_order), not a replay."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.cycle import cycle_run
from scheduling.models import CycleRun
from tests.scheduling.conftest import outgrown

pytestmark = pytest.mark.django_db


def _shown(client_as, user) -> list[str]:
    response = client_as(user).get("/workloads/queue/")
    assert response.status_code == 200
    return [wl.name for _, wl in response.context["order"]]


def test_a_cycle_stores_the_order_the_engine_considered_pending_work_in(
    client_as, org, cluster, submit
):
    submit(org.researcher, org.project_a, "vision-runs", gpus=4)
    cycle_run()
    vision = outgrown(submit, org.researcher, org.project_a, "vision-waits", gpus=16)
    detect = outgrown(submit, org.platform_admin, org.project_a2, "detect-waits", gpus=16)
    nlp = outgrown(submit, org.outsider, org.project_b, "nlp-waits", gpus=16)
    run = cycle_run()
    # Department language holds nothing, so it goes first; inside vision, ml-detect is
    # under its deserved quota and ml-vision is at it.
    assert run.pending_order == [nlp.pk, detect.pk, vision.pk]
    assert CycleRun.objects.get(pk=run.pk).pending_order == [nlp.pk, detect.pk, vision.pk]
    assert _shown(client_as, org.platform_admin) == ["nlp-waits", "detect-waits", "vision-waits"]


def test_the_page_follows_the_stored_order_even_where_a_replay_would_differ(
    client_as, org, cluster, submit
):
    first = outgrown(submit, org.researcher, org.project_a, "first", gpus=16)
    second = outgrown(submit, org.outsider, org.project_b, "second", gpus=16)
    third = outgrown(submit, org.researcher, org.project_a, "third", gpus=16)
    # An order no starvation replay gives (two of ml-vision's around nlp's, newest first):
    # the page must show what the engine recorded.
    CycleRun.objects.create(
        started_at=timezone.now(), pending_order=[third.pk, second.pk, first.pk]
    )
    assert _shown(client_as, org.platform_admin) == ["third", "second", "first"]


def test_work_submitted_after_the_last_cycle_goes_last_by_priority_then_age(
    client_as, org, cluster, submit
):
    seen = outgrown(submit, org.researcher, org.project_a, "seen", gpus=16)
    CycleRun.objects.create(started_at=timezone.now(), pending_order=[seen.pk])
    outgrown(submit, org.researcher, org.project_a, "new-train", gpus=16)
    submit(org.researcher, org.project_a, "new-build", gpus=1, priority_class="build")
    outgrown(submit, org.researcher, org.project_a, "newer-train", gpus=16)
    assert _shown(client_as, org.platform_admin) == [
        "seen",
        "new-build",
        "new-train",
        "newer-train",
    ]


def test_workloads_no_longer_pending_drop_out_and_outsiders_see_their_own_only(
    client_as, org, cluster, submit
):
    gone = submit(org.researcher, org.project_a, "gone", gpus=1)
    mine = outgrown(submit, org.outsider, org.project_b, "mine", gpus=16)
    theirs = outgrown(submit, org.researcher, org.project_a, "theirs", gpus=16)
    CycleRun.objects.create(started_at=timezone.now(), pending_order=[gone.pk, theirs.pk, mine.pk])
    gone.state = "running"
    gone.save(update_fields=["state"])
    assert _shown(client_as, org.platform_admin) == ["theirs", "mine"]
    response = client_as(org.outsider).get("/workloads/queue/")
    assert [(n, wl.name) for n, wl in response.context["order"]] == [(1, "mine")]


def test_projects_are_listed_in_the_order_the_engine_first_served_them(
    client_as, org, cluster, submit
):
    vision = outgrown(submit, org.researcher, org.project_a, "vision", gpus=16)
    nlp = outgrown(submit, org.outsider, org.project_b, "nlp", gpus=16)
    # The engine served ml-vision first (say, nlp held most of its CPU share): the
    # projects table follows it, then the projects it did not consider.
    CycleRun.objects.create(started_at=timezone.now(), pending_order=[vision.pk, nlp.pk])
    response = client_as(org.platform_admin).get("/workloads/queue/")
    names = [r.project.name for r in response.context["rows"]]
    assert names[:2] == [org.project_a.name, org.project_b.name]
    assert org.project_a2.name in names[2:]
    CycleRun.objects.create(started_at=timezone.now(), pending_order=[nlp.pk, vision.pk])
    response = client_as(org.platform_admin).get("/workloads/queue/")
    assert [r.project.name for r in response.context["rows"]][:2] == [
        org.project_b.name,
        org.project_a.name,
    ]
