"""A training job's declared checkpoint interval: bounded once (scheduling.specs), taken
from the form, the API and the CLI, shown back, and handed to the engine, whose rule then
lets a claim between over-quota work wait for a victim's checkpoint that is due soon
(engine/actions/victims; work within its guarantee never waits: issue 24);
and the running pod's report of each checkpoint it saves (scheduling.checkpoints)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.podspecs import pod_env
from portal.models import DepartmentQuota
from scheduling import adapters, bounds
from scheduling.checkpoints import workload_checkpoint_token, workload_token_check
from scheduling.cli import main
from scheduling.cycle import cycle_run
from scheduling.forms import initial_from
from scheduling.models import Workload, WorkloadState
from scheduling.services import workload_stop
from scheduling.specs import clean_spec
from tests.scheduling.test_bounds import training
from tests.scheduling.test_cli import gp, logged_in  # noqa: F401 - the CLI's fixtures

pytestmark = pytest.mark.django_db
FIELD = "checkpoint_interval_s"
WEEK_S = 7 * 86_400
# Out of bounds or no whole number of seconds.
REFUSED = [59, 0, -600, WEEK_S + 1, 2**31, "soon", "1.5", "1e9", True]


@pytest.fixture
def api(org):
    client = APIClient()
    client.force_authenticate(org.researcher)
    return client


def form_data(org, **extra):
    return {
        "project": org.project_a.pk,
        "name": "from-form",
        "image": "img",
        "gpu_request": "whole",
        "gpus": "1",
        "cpu": "1",
        "memory_mib": "100",
        **extra,
    }


@pytest.mark.parametrize("value", REFUSED)
def test_the_api_refuses_an_interval_out_of_bounds_naming_the_field(api, org, cluster, value):
    response = api.post("/api/v1/workloads/", training(**{FIELD: value}), format="json")
    assert response.status_code == 400
    assert list(response.json()) == [FIELD]
    assert not Workload.objects.exists()


@pytest.mark.parametrize("value", ["59", str(WEEK_S + 1), "half an hour", "1.5"])
def test_the_form_shows_a_bad_interval_on_its_field(client_as, org, cluster, value):
    response = client_as(org.researcher).post(
        "/workloads/new/training/", form_data(org, **{FIELD: value})
    )
    assert response.status_code == 200
    assert list(response.context["form"].errors) == [FIELD]
    assert not Workload.objects.exists()


@pytest.mark.parametrize("value", [59, WEEK_S + 1, "soon"])
def test_the_spec_bound_holds_whatever_the_entry(value):
    _, errors = clean_spec("training", "job", {"image": "img", FIELD: value})
    assert list(errors) == [FIELD]
    assert errors[FIELD] == [bounds.CHECKPOINT_INTERVAL_S.describe()]


@pytest.mark.parametrize("kind", ["inference", "workspace"])
def test_only_training_work_declares_a_checkpoint_interval(kind):
    spec = {"image": "img", "ports": [8000], FIELD: 600}
    _, errors = clean_spec(kind, "svc", spec)
    assert errors == {FIELD: ["Only training work saves checkpoints."]}


def test_the_api_refuses_an_interval_for_a_service_naming_the_field(api, org, cluster):
    body = {**training(kind="inference", ports=[8000]), FIELD: 600}
    response = api.post("/api/v1/workloads/", body, format="json")
    assert (response.status_code, response.json()) == (
        400,
        {FIELD: ["Only training work saves checkpoints."]},
    )


def test_the_interval_is_optional_and_unknown_when_empty(api, org, cluster):
    response = api.post("/api/v1/workloads/", training(**{FIELD: ""}), format="json")
    assert response.status_code == 201
    assert response.json()[FIELD] is None
    assert Workload.objects.get().checkpoint_interval_s is None


def test_the_interval_round_trips_through_the_api(api, org, cluster):
    body = training(checkpoint_dir="/ckpt", **{FIELD: 1800})
    created = api.post("/api/v1/workloads/", body, format="json").json()
    assert (created[FIELD], created["last_checkpoint_at"]) == (1800, None)
    shown = api.get(f"/api/v1/workloads/{created['id']}/").json()
    assert (shown["checkpoint_dir"], shown[FIELD]) == ("/ckpt", 1800)
    assert Workload.objects.get().checkpoint_interval_s == 1800


def test_the_schema_documents_the_interval_with_its_bounds(api):
    schema = api.get("/api/schema/?format=json").json()["components"]["schemas"]
    submitted = schema["SubmitSpec"]["properties"][FIELD]
    assert (submitted["minimum"], submitted["maximum"]) == (60, WEEK_S)
    assert {FIELD, "last_checkpoint_at"} <= set(schema["Workload"]["properties"])


def test_the_schema_documents_the_checkpoint_report_and_its_token(api):
    schema = api.get("/api/schema/?format=json").json()
    report = schema["paths"]["/api/v1/workloads/{id}/checkpoint/"]["post"]
    assert report["security"] == [{"checkpointToken": []}]
    assert {"200", "400", "401", "403", "404"} <= set(report["responses"])
    assert schema["components"]["securitySchemes"]["checkpointToken"]["scheme"] == "bearer"


@pytest.mark.parametrize("kind", ["training", "distributed"])
def test_the_interval_round_trips_through_the_form_page_and_clone(client_as, org, cluster, kind):
    client = client_as(org.researcher)
    extra = {"workers": "2"} if kind == "distributed" else {}
    response = client.post(f"/workloads/new/{kind}/", form_data(org, **extra, **{FIELD: "900"}))
    wl = Workload.objects.get(name="from-form")
    assert response.status_code == 302 and wl.checkpoint_interval_s == 900
    assert "every 900 s" in client.get(f"/workloads/{wl.pk}/").content.decode()
    assert initial_from(wl)[FIELD] == 900
    clone = client.get(f"/workloads/{wl.pk}/clone/").context["form"]
    assert clone[FIELD].value() == 900


def test_a_sweeps_trials_keep_its_interval(org, cluster, submit):
    search = {"method": "grid", "parameters": {"lr": [0.1, 0.01]}}
    sweep = submit(
        org.researcher, org.project_a, "sweep", kind="hpo", search=search, **{FIELD: 600}
    )
    trials = Workload.objects.filter(parent=sweep)
    assert [t.checkpoint_interval_s for t in trials] == [600, 600]


@pytest.mark.django_db(transaction=True)
def test_the_interval_round_trips_through_the_cli(logged_in, org, cluster):  # noqa: F811
    cli = logged_in
    cli("project", "set", "ml-vision")
    cli("submit", "training", "resnet", "--image", "img", "--gpus", "1", "--checkpoint-dir",
        "/ckpt", "--checkpoint-interval", "1800", "--", "python", "t.py")  # fmt: skip
    cli("submit", "distributed", "ddp", "--image", "img", "--gpus", "1",
        "--checkpoint-interval", "600")  # fmt: skip
    described = cli("describe", str(Workload.objects.get(name="resnet").pk))
    assert "checkpoints:    /ckpt, every 1800 s" in described
    rows = Workload.objects.order_by("name").values_list("name", "checkpoint_interval_s")
    assert list(rows) == [("ddp", 600), ("resnet", 1800)]


@pytest.mark.parametrize("value", ["30", str(WEEK_S + 1), "30m"])
def test_the_cli_refuses_a_bad_interval_before_sending_anything(value):
    args = ["submit", "training", "x", "--image", "i", "--checkpoint-interval", value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--checkpoint-interval" in result.output
    assert "Enter a whole number from 60 to 604800 seconds." in result.output


def engine_workload(wl: Workload):
    snapshot = adapters.read_snapshot().snapshot
    return next(w for w in snapshot.workloads if w.id == str(wl.pk))


def test_the_snapshot_hands_the_interval_and_last_checkpoint_to_the_engine(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, **{FIELD: 600})
    saved = timezone.now() - timedelta(seconds=42)
    Workload.objects.filter(pk=wl.pk).update(last_checkpoint_at=saved)
    engine = engine_workload(wl)
    assert (engine.checkpoint_interval_s, engine.last_checkpoint_time) == (
        600.0,
        saved.timestamp(),
    )
    unknown = submit(org.researcher, org.project_a, "unknown", gpus=1)
    assert engine_workload(unknown).checkpoint_interval_s is None


@pytest.mark.parametrize("planted", [0, 59, WEEK_S + 1, 2**31 - 1])
def test_a_planted_interval_out_of_bounds_reaches_the_engine_as_unknown(
    org, cluster, submit, planted
):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, **{FIELD: 600})
    Workload.objects.filter(pk=wl.pk).update(checkpoint_interval_s=planted)
    assert engine_workload(wl).checkpoint_interval_s is None


def borrowers_running(org, submit, *, saved_ago: float) -> list[Workload]:
    """vision runs two 4-GPU jobs on all 8 GPUs (4 borrowed from language), for an hour,
    checkpointing every 600 s, the last one saved_ago seconds ago."""
    DepartmentQuota.objects.update(gpus=4)
    jobs = [
        submit(org.researcher, org.project_a, n, gpus=4, checkpoint_dir="/ckpt", **{FIELD: 600})
        for n in "ab"
    ]
    cycle_run()
    now = timezone.now()
    Workload.objects.filter(pk__in=[j.pk for j in jobs]).update(
        state=WorkloadState.RUNNING,
        admitted_at=now - timedelta(hours=1),
        last_checkpoint_at=now - timedelta(seconds=saved_ago),
    )
    return jobs


def states(jobs: list[Workload]) -> list[str]:
    return sorted(
        Workload.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)
    )


def test_the_live_cycle_lets_an_over_quota_claim_wait_for_a_checkpoint_due_soon(
    org, cluster, submit
):
    # ml-vision, over its quota, submits urgent work: it preempts the project's own
    # lower-priority job, but waits for the checkpoint due in 200 s, and says so.
    jobs = borrowers_running(org, submit, saved_ago=400)
    urgent = submit(org.researcher, org.project_a, "urgent", gpus=4, priority_class="build")
    run = cycle_run()
    assert (run.evicted, states(jobs)) == (0, [WorkloadState.RUNNING] * 2)
    reason = Workload.objects.get(pk=urgent.pk).pending_reason
    assert "; waiting about 200 s for ml-vision/" in reason
    assert reason.endswith("'s checkpoint before preempting it")
    # Both pods report that they have just saved: nothing more to wait for.
    for job in jobs:
        assert report(job).status_code == 200
    run = cycle_run()
    assert (run.evicted, states(jobs)) == (1, [WorkloadState.PREEMPTED, WorkloadState.RUNNING])


def test_the_live_cycle_reclaims_for_the_guarantee_without_waiting_for_checkpoints(
    org, cluster, submit
):
    # language's owner is within its guaranteed quota: the guarantee means now, due
    # checkpoint or not (issue 24).
    for interval in (600, None):
        Workload.objects.all().delete()
        jobs = borrowers_running(org, submit, saved_ago=400)
        Workload.objects.update(checkpoint_interval_s=interval)
        submit(org.outsider, org.project_b, "owner", gpus=4)
        run = cycle_run()
        assert (run.evicted, states(jobs)) == (
            1,
            [WorkloadState.PREEMPTED, WorkloadState.RUNNING],
        )


# --- Reporting a checkpoint from the workload's own pod -------------------------------------


def report(wl: Workload, token: str | None = None):
    """POST as the workload's pod would: to the URL in its environment, with its token
    (or with `token` instead)."""
    url = f"{settings.SITE_URL}/api/v1/workloads/{wl.pk}/checkpoint/"
    if token is None:
        env = pod_env(wl.allocations.first())
        url, token = env["GPUPOOL_CHECKPOINT_URL"], env["GPUPOOL_CHECKPOINT_TOKEN"]
    path = url.removeprefix(settings.SITE_URL)
    return APIClient().post(path, HTTP_AUTHORIZATION=f"Bearer {token}".strip())


def test_a_pod_of_work_that_keeps_checkpoints_is_told_where_to_report_them(org, cluster, submit):
    keeps = submit(org.researcher, org.project_a, "keeps", gpus=1, checkpoint_dir="/ckpt")
    plain = submit(org.researcher, org.project_a, "plain", gpus=1)
    cycle_run()
    env = pod_env(keeps.allocations.get())
    assert env["GPUPOOL_CHECKPOINT_URL"] == (
        f"{settings.SITE_URL}/api/v1/workloads/{keeps.pk}/checkpoint/"
    )
    assert workload_token_check(env["GPUPOOL_CHECKPOINT_TOKEN"]) == keeps.pk
    assert not {"GPUPOOL_CHECKPOINT_URL", "GPUPOOL_CHECKPOINT_TOKEN"} & set(
        pod_env(plain.allocations.get())
    )


def test_a_running_pod_reports_a_checkpoint_with_its_own_token(api, org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, checkpoint_dir="/ckpt")
    cycle_run()
    before = timezone.now()
    response = report(wl)
    saved = Workload.objects.get(pk=wl.pk).last_checkpoint_at
    assert response.status_code == 200 and before <= saved <= timezone.now()
    shown = api.get(f"/api/v1/workloads/{wl.pk}/").json()["last_checkpoint_at"]
    assert shown == response.json()["last_checkpoint_at"]
    assert engine_workload(wl).last_checkpoint_time == saved.timestamp()


def test_a_checkpoint_report_needs_the_workloads_own_token(org, cluster, submit):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, checkpoint_dir="/ckpt")
    other = submit(org.researcher, org.project_a, "other", gpus=1, checkpoint_dir="/ckpt")
    cycle_run()
    assert report(wl, workload_checkpoint_token(other.pk)).status_code == 403
    assert report(wl, f"{wl.pk}:forged").status_code == 401
    assert report(wl, "").status_code == 401
    url = f"/api/v1/workloads/{wl.pk}/checkpoint/"
    client = APIClient()
    client.force_login(org.researcher)  # an account, even the owner's, is not the pod
    assert client.post(url).status_code == 401
    assert Workload.objects.get(pk=wl.pk).last_checkpoint_at is None


@pytest.mark.parametrize("case", ["pending", "stopped", "no checkpoint directory"])
def test_only_running_work_with_a_checkpoint_directory_reports_checkpoints(
    org, cluster, submit, case
):
    wl = submit(org.researcher, org.project_a, "job", gpus=1, checkpoint_dir="/ckpt")
    if case != "pending":
        cycle_run()
    if case == "stopped":
        workload_stop(actor=org.researcher, workload=wl)
    if case == "no checkpoint directory":
        Workload.objects.filter(pk=wl.pk).update(checkpoint_dir="")
    response = report(wl, workload_checkpoint_token(wl.pk))
    assert (response.status_code, list(response.json())) == (400, ["state"])
    assert Workload.objects.get(pk=wl.pk).last_checkpoint_at is None
