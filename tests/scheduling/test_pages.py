"""Workload pages for every persona: who sees what, forms and their messages, actions."""

from __future__ import annotations

import csv
import io

import pytest

from scheduling.cycle import cycle_run
from scheduling.models import Workload, WorkloadPolicy, WorkloadState
from tests.scheduling.conftest import outgrown

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(org, submit):
    return submit(org.researcher, org.project_a, "resnet", gpus=2)


@pytest.mark.parametrize(
    ("persona", "sees"),
    [("platform_admin", True), ("dept_admin", True), ("researcher", True), ("outsider", False)],
)
def test_the_list_shows_workloads_of_visible_projects_only(client_as, org, job, persona, sees):
    page = client_as(getattr(org, persona)).get("/workloads/")
    assert page.status_code == 200
    assert ("resnet" in page.content.decode()) is sees


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 200), ("outsider", 404)],
)
def test_the_detail_page_is_hidden_from_outsiders(client_as, org, job, persona, status):
    assert client_as(getattr(org, persona)).get(f"/workloads/{job.pk}/").status_code == status


def test_anonymous_visitors_are_sent_to_log_in(client_as, job):
    for url in ("/workloads/", "/workloads/queue/", f"/workloads/{job.pk}/"):
        response = client_as(None).get(url)
        assert response.status_code == 302 and "/login" in response["Location"]


def test_the_list_filters_and_sorts(client_as, org, submit):
    submit(org.researcher, org.project_a, "a-small", gpus=1)
    submit(org.researcher, org.project_a, "b-big", gpus=4)
    submit(org.dept_admin, org.project_a2, "c-other", gpus=2)
    client = client_as(org.dept_admin)
    page = client.get("/workloads/?project=ml-vision&sort=-gpus").content.decode()
    assert "c-other" not in page
    assert page.index("b-big") < page.index("a-small")
    page = client.get("/workloads/?user=dana").content.decode()
    assert "c-other" in page and "a-small" not in page
    page = client.get("/workloads/?state=running").content.decode()
    assert "No workloads match." in page


def test_every_computed_column_sorts_the_whole_list(client_as, org, cluster, submit):
    """GPUs allocated, node pool, node and runtime sort on the server, before the list is
    cut to its first rows; workloads without a value come last both ways."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import PodAllocation
    from tests import factories as f
    from tests.scheduling.conftest import make_nodes

    [h100] = make_nodes(f.make_pool("h100"), 1, 4)
    submit(org.researcher, org.project_a, "two", gpus=2)
    submit(org.researcher, org.project_a, "one", gpus=1)
    submit(org.researcher, org.project_a, "half", gpu_request="fraction", gpus="0.5")
    submit(org.researcher, org.project_a, "elsewhere", gpus=3, node_pools=["h100"])
    outgrown(submit, org.researcher, org.project_a, "waiting", gpus=16)
    cycle_run()
    now = timezone.now()
    for name, minutes in (("two", 5), ("one", 50), ("half", 20), ("elsewhere", 1)):
        Workload.objects.filter(name=name).update(started_at=now - timedelta(minutes=minutes))
    PodAllocation.objects.filter(workload__name__in=["two", "half"]).update(node=cluster[0])
    PodAllocation.objects.filter(workload__name="one").update(node=cluster[1])
    client = client_as(org.researcher)

    def names(sort: str) -> list[str]:
        response = client.get(f"/workloads/?format=csv&sort={sort}")
        return [r["name"] for r in csv.DictReader(io.StringIO(response.content.decode()))]

    assert names("-gpus_allocated") == ["elsewhere", "two", "one", "half", "waiting"]
    assert names("gpus_allocated") == ["waiting", "half", "one", "two", "elsewhere"]
    assert names("-runtime") == ["one", "half", "two", "elsewhere", "waiting"]
    assert names("runtime") == ["elsewhere", "two", "half", "one", "waiting"]
    assert names("pool")[-2:] == ["elsewhere", "waiting"]
    assert names("-pool")[0] == "elsewhere" and names("-pool")[-1] == "waiting"
    assert names("node") == ["half", "two", "one", "elsewhere", "waiting"]
    assert names("-node") == ["elsewhere", "one", "half", "two", "waiting"]
    page = client.get("/workloads/?sort=-runtime").content.decode()
    for key in ("gpus_allocated", "pool", "node", "runtime"):
        assert f'data-sort-key="{key}"' in page


def test_the_csv_holds_the_filtered_rows(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "placed", gpus=2)
    outgrown(submit, org.researcher, org.project_a, "waiting", gpus=16)
    cycle_run()
    response = client_as(org.researcher).get("/workloads/?format=csv&sort=name")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["name"], r["state"], r["gpus_allocated"], r["node"]) for r in rows] == [
        ("placed", "admitted", "2", "a100-node-0"),
        ("waiting", "pending", "0", ""),
    ]
    assert rows[1]["pending_reason"] == "Needs 16 GPUs in pool a100; 6 are free"


def test_submitting_a_training_job_from_the_form_queues_it(client_as, org):
    response = client_as(org.researcher).post(
        "/workloads/new/training/",
        {
            "project": org.project_a.pk,
            "name": "from-form",
            "image": "pytorch/pytorch:2.3",
            "command": "python train.py --epochs 3",
            "env": "SEED=1\nMODE=fast",
            "gpu_request": "whole",
            "gpus": "2",
            "cpu": "4",
            "memory_mib": "8192",
            "checkpoint_dir": "/ckpt/run1",
        },
    )
    wl = Workload.objects.get(name="from-form")
    assert response.status_code == 302 and response["Location"] == f"/workloads/{wl.pk}/"
    assert wl.command == ["python", "train.py", "--epochs", "3"]
    assert wl.env == {"SEED": "1", "MODE": "fast"}
    assert (wl.gpus, wl.checkpoint_dir, wl.submitted_by) == (2, "/ckpt/run1", org.researcher)


def test_the_form_shows_the_services_messages_on_their_fields(client_as, org, submit):
    submit(org.researcher, org.project_a, "taken")
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=1)
    response = client_as(org.researcher).post(
        "/workloads/new/training/",
        {
            "project": org.project_a.pk,
            "name": "taken",
            "image": "img",
            "gpu_request": "whole",
            "gpus": "2",
            "cpu": "1",
            "memory_mib": "100",
        },
    )
    assert response.status_code == 200
    form = response.context["form"]
    assert form.errors["name"] == ["Project ml-vision already has a workload named taken."]
    response = client_as(org.researcher).post(
        "/workloads/new/training/",
        {**response.context["form"].data.dict(), "name": "fresh"},
    )
    assert (
        response.context["form"]
        .errors["gpus"][0]
        .startswith("Refused by policy 'max GPUs per workload' of project ml-vision")
    )


def test_a_sweep_form_with_bad_json_says_so_on_the_parameters(client_as, org):
    response = client_as(org.researcher).post(
        "/workloads/new/hpo/",
        {
            "project": org.project_a.pk,
            "name": "sweep",
            "image": "img",
            "gpu_request": "whole",
            "gpus": "1",
            "cpu": "1",
            "memory_mib": "100",
            "search_method": "grid",
            "parameters": "{lr: [1,2]",
            "parallelism": "2",
        },
    )
    assert response.context["form"].errors["parameters"][0].startswith("Not valid JSON")


BASE_FORM = {"image": "img", "gpu_request": "whole", "gpus": "1", "cpu": "1", "memory_mib": "100"}


def test_each_kinds_form_queues_it_or_says_what_is_wrong_per_field(client_as, org):
    client = client_as(org.researcher)

    def post(kind: str, name: str, **fields: str):
        data = {**BASE_FORM, "project": org.project_a.pk, "name": name, **fields}
        return client.post(f"/workloads/new/{kind}/", data)

    assert post("distributed", "ddp", workers="3", master="on", min_pods="2").status_code == 302
    ddp = Workload.objects.get(name="ddp")
    assert (ddp.kind, ddp.pods, ddp.min_pods, ddp.spec["master"]) == ("distributed", 4, 2, True)
    errors = post("distributed", "gang", workers="2", min_pods="5").context["form"].errors
    assert errors["min_pods"] == ["The gang minimum is between 1 and 2 pods."]

    assert post("inference", "svc", replicas="3", ports="8000, metrics:9090").status_code == 302
    svc = Workload.objects.get(name="svc")
    assert (svc.pods, svc.preemptible, svc.spec["ports"][1]) == (
        3,
        False,
        {"name": "metrics", "port": 9090, "protocol": "http"},
    )
    errors = post("inference", "svc2", replicas="1").context["form"].errors
    assert errors["ports"] == ["An inference service exposes at least one port."]

    response = post("hpo", "rand", search_method="random", trials="5", parallelism="2",
                    parameters='{"lr": {"min": 0.0001, "max": 0.1, "log": true}}')  # fmt: skip
    assert response.status_code == 302
    trials = Workload.objects.filter(parent__name="rand")
    assert (
        trials.count() == 5 and Workload.objects.get(name="rand").spec["search"]["parallelism"] == 2
    )
    errors = post("hpo", "rand2", search_method="random", trials="2",
                  parameters='{"lr": {"min": 1, "max": 0.5}}').context["form"].errors  # fmt: skip
    assert errors["parameters"] == ["Parameter lr needs numbers min < max."]
    errors = post("training", "Bad_Name", gpus="1.5").context["form"].errors
    assert set(errors) == {"name", "gpus"}


def test_outsiders_cannot_pick_a_project_they_do_not_belong_to(client_as, org):
    response = client_as(org.outsider).get("/workloads/new/training/")
    projects = list(response.context["form"].fields["project"].queryset)
    assert projects == [org.project_b]


def test_stop_then_delete_from_the_pages(client_as, org, job):
    client = client_as(org.researcher)
    assert client.post(f"/workloads/{job.pk}/stop/").status_code == 302
    job.refresh_from_db()
    assert job.state == WorkloadState.STOPPED
    assert "Delete" in client.get(f"/workloads/{job.pk}/delete/").content.decode()
    assert client.post(f"/workloads/{job.pk}/delete/").status_code == 302
    assert not Workload.objects.filter(pk=job.pk).exists()


def test_outsiders_cannot_stop(client_as, org, job):
    assert client_as(org.outsider).post(f"/workloads/{job.pk}/stop/").status_code == 404
    job.refresh_from_db()
    assert job.state == WorkloadState.PENDING


def test_clone_opens_the_form_filled_in_from_the_workload(client_as, org, submit):
    wl = submit(org.researcher, org.project_a, "orig", gpus=3, env={"A": "1"}, command="run x")
    form = client_as(org.researcher).get(f"/workloads/{wl.pk}/clone/").context["form"]
    assert (form.initial["name"], form.initial["gpus"], form.initial["env"]) == (
        "orig-copy",
        3,
        "A=1",
    )
    assert form.initial["command"] == "run x"


def test_a_clone_submitted_unchanged_runs_the_same_program(client_as, org, submit):
    command = ["python", "-c", "print('a b')", ""]
    args = ["--msg", "hello world", "--path=$HOME/x"]
    wl = submit(org.researcher, org.project_a, "orig", command=command, args=args,
                env={"A": "x=y z"}, gpus=1, checkpoint_dir="/ckpt")  # fmt: skip
    client = client_as(org.researcher)
    form = client.get(f"/workloads/{wl.pk}/clone/").context["form"]
    posted = {k: v for k, v in form.initial.items() if v is not None}
    response = client.post("/workloads/new/training/", posted)
    assert response.status_code == 302, response.context["form"].errors
    copy = Workload.objects.get(name="orig-copy")
    assert (copy.command, copy.args, copy.env) == (command, args, {"A": "x=y z"})
    assert (copy.gpus, copy.checkpoint_dir, copy.preemptible) == (1, "/ckpt", True)


def test_the_detail_page_shows_events_and_the_allocation(client_as, org, cluster, job):
    cycle_run()
    page = client_as(org.researcher).get(f"/workloads/{job.pk}/").content.decode()
    assert "Placed in pool a100 on a100-node-0." in page
    assert "a100-node-0" in page and "0, 1" in page and "sim" in page


def test_logs_say_unavailable_before_the_workload_ran(client_as, org, job):
    page = client_as(org.researcher).get(f"/workloads/{job.pk}/logs/").content.decode()
    assert "This workload has not run on a cluster yet." in page


def test_the_queue_lists_pending_work_in_consideration_order_with_reasons(
    client_as, org, cluster, submit
):
    submit(org.researcher, org.project_a, "runs", gpus=4)
    outgrown(submit, org.researcher, org.project_a, "a-waits", gpus=16)
    outgrown(submit, org.outsider, org.project_b, "b-waits", gpus=16)
    cycle_run()
    response = client_as(org.platform_admin).get("/workloads/queue/")
    order = [wl.name for _, wl in response.context["order"]]
    # nlp has nothing allocated, so it is more starved than ml-vision and goes first.
    assert order == ["b-waits", "a-waits"]
    rows = {r.project.name: r for r in response.context["rows"]}
    assert (rows["ml-vision"].deserved, rows["ml-vision"].allocated) == (4.0, 4.0)
    assert "Needs 16 GPUs in pool a100" in response.content.decode()
    # An outsider sees their own project only.
    response = client_as(org.outsider).get("/workloads/queue/")
    assert [wl.name for _, wl in response.context["order"]] == ["b-waits"]


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 403), ("researcher", 403), ("outsider", 403)],
)
def test_the_cycles_page_is_for_platform_admins(client_as, org, persona, status):
    assert client_as(getattr(org, persona)).get("/workloads/cycles/").status_code == status


def test_the_cycles_page_lists_runs(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "x", gpus=1)
    cycle_run()
    page = client_as(org.platform_admin).get("/workloads/cycles/").content.decode()
    assert '<span class="badge state-running">ok</span>' in page


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 403), ("outsider", 403)],
)
def test_policies_are_for_admins(client_as, org, persona, status):
    user = getattr(org, persona)
    assert client_as(user).get("/workloads/policies/").status_code == status
    url = f"/workloads/policies/project/{org.project_a.pk}/"
    assert client_as(user).get(url).status_code == status


def test_a_department_admin_sets_a_project_policy_from_the_form(client_as, org):
    url = f"/workloads/policies/project/{org.project_a.pk}/"
    response = client_as(org.dept_admin).post(
        url, {"max_gpus_per_workload": "4", "allowed_kinds": ["training", "hpo"]}
    )
    assert response.status_code == 302
    policy = WorkloadPolicy.objects.get(project=org.project_a)
    assert (policy.max_gpus_per_workload, policy.allowed_kinds) == (4, ["training", "hpo"])
    other = f"/workloads/policies/department/{org.dept_b.pk}/"
    # Another department's: one he may not see, as one that does not exist.
    assert client_as(org.dept_admin).post(other, {}).status_code == 404


def test_the_project_page_shows_usage_per_pool(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "job", gpus=2)
    cycle_run()
    page = client_as(org.researcher).get(f"/projects/{org.project_a.pk}/").content.decode()
    assert 'id="project-usage"' in page
    assert "1 running · 0 pending" in page


def test_the_detail_page_includes_the_gpu_utilization_chart(client_as, org, job):
    page = client_as(org.researcher).get(f"/workloads/{job.pk}/").content.decode()
    assert "GPU utilization" in page
    assert "No GPU samples for this workload yet." in page


@pytest.mark.parametrize(
    ("persona", "status"),
    [("platform_admin", 200), ("dept_admin", 200), ("researcher", 200), ("outsider", 404)],
)
def test_the_live_status_fragment_per_persona(client_as, org, cluster, job, persona, status):
    cycle_run()
    response = client_as(getattr(org, persona)).get(f"/workloads/{job.pk}/status/")
    assert response.status_code == status
    if status == 200:
        text = response.content.decode()
        assert 'id="workload-state">admitted<' in text
        assert "GPUs allocated: 2" in text and "a100-node-0" in text
        assert "<html" not in text  # a fragment, not a page
