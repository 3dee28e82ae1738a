"""workload_submit / stop / delete and policy_set: validation, policies, audit, trials."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied

from portal.errors import ValidationFailed
from portal.models import AuditLog
from scheduling.models import Workload, WorkloadEvent, WorkloadState
from scheduling.services import policy_set, workload_delete, workload_stop

pytestmark = pytest.mark.django_db


def errors_of(call) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        call()
    return caught.value.errors


def test_a_training_job_is_queued_pending_preemptible_with_an_event_and_audit_row(org, submit):
    wl = submit(org.researcher, org.project_a, "resnet", gpus=2, checkpoint_dir="/ckpt")
    assert wl.state == WorkloadState.PENDING
    assert (wl.priority_class, wl.preemptible, wl.pods, wl.gpus) == ("train", True, 1, 2)
    assert wl.queued_at is not None
    assert list(wl.events.values_list("type", "reason")) == [("pending", "Submitted")]
    row = AuditLog.objects.get(action="workload.submit")
    assert (row.actor, row.object_id, row.department) == (org.researcher, str(wl.pk), org.dept_a)


def test_inference_and_workspaces_are_not_preemptible_by_default(org, submit):
    svc = submit(org.researcher, org.project_a, "svc", kind="inference", replicas=3, ports=[8000])
    ws = submit(org.researcher, org.project_a, "nb", kind="workspace", gpus=1)
    assert (svc.priority_class, svc.preemptible, svc.pods, svc.min_pods) == (
        "inference",
        False,
        3,
        1,
    )
    assert svc.spec["ports"] == [{"name": "http", "port": 8000, "protocol": "http"}]
    assert (ws.priority_class, ws.preemptible) == ("build", False)


def test_a_distributed_job_is_a_gang_of_workers_and_a_master(org, submit):
    wl = submit(org.researcher, org.project_a, "ddp", kind="distributed", workers=4, master=True)
    assert (wl.pods, wl.min_pods, wl.spec["workers"], wl.spec["master"]) == (5, 5, 4, True)


def test_it_reports_every_bad_field_at_once(org, submit):
    errors = errors_of(
        lambda: submit(
            org.researcher,
            org.project_a,
            "Bad_Name",
            image="",
            gpus="1.5",
            cpu="0",
            node_pools=["h100"],
            env="NOVALUE",
        )
    )
    assert set(errors) == {"name", "image", "gpus", "cpu", "node_pools", "env"}
    assert "lower-case" in errors["name"][0]
    assert errors["node_pools"] == ["No such node pool: h100."]


def test_a_fraction_must_be_between_zero_and_one(org, submit):
    errors = errors_of(
        lambda: submit(org.researcher, org.project_a, "frac", gpu_request="fraction", gpus=1)
    )
    assert errors == {"gpus": ["A fraction of a GPU is between 0 and 1, e.g. 0.5."]}
    wl = submit(org.researcher, org.project_a, "frac", gpu_request="fraction", gpus="0.5")
    assert wl.gpus == Decimal("0.5")


def test_it_rejects_a_name_already_used_in_the_project(org, submit):
    submit(org.researcher, org.project_a, "dup")
    errors = errors_of(lambda: submit(org.researcher, org.project_a, "dup"))
    assert errors == {"name": ["Project ml-vision already has a workload named dup."]}
    # The same name in another project is fine.
    assert submit(org.dept_admin, org.project_a2, "dup").project == org.project_a2


def test_a_sweep_whose_trial_names_are_taken_is_refused_on_its_name(org, submit):
    submit(org.researcher, org.project_a, "tune-trial-1")
    search = {"method": "grid", "parameters": {"lr": [1, 2, 3]}}
    errors = errors_of(
        lambda: submit(org.researcher, org.project_a, "tune", kind="hpo", search=search)
    )
    assert errors == {
        "name": [
            "Project ml-vision already has a workload named tune-trial-1, "
            "a name this sweep's trials need."
        ]
    }
    assert not Workload.objects.filter(name="tune").exists()
    sweep = submit(org.researcher, org.project_a, "tune2", kind="hpo", search=search)
    assert sweep.children.count() == 3


def test_outsiders_and_viewers_may_not_submit(org, submit):
    with pytest.raises(PermissionDenied):
        submit(org.outsider, org.project_a, "nope")
    assert not Workload.objects.exists()


def test_the_project_policy_refuses_with_the_rule_named(org, submit):
    policy_set(actor=org.dept_admin, project=org.project_a, max_gpus_per_workload=Decimal(2))
    policy_set(actor=org.dept_admin, department=org.dept_a, allowed_kinds=["training"])
    errors = errors_of(
        lambda: submit(org.researcher, org.project_a, "big", kind="distributed", workers=2, gpus=2)
    )
    assert errors == {
        "kind": ["Refused by policy 'allowed kinds' of department vision: only training."],
        "gpus": [
            "Refused by policy 'max GPUs per workload' of project ml-vision: this workload "
            "asks for 4 GPUs, at most 2 are allowed."
        ],
    }


def test_runtime_policy_fills_the_default_and_refuses_more_than_the_maximum(org, submit):
    policy_set(
        actor=org.platform_admin, department=org.dept_a, default_runtime_s=600, max_runtime_s=3600
    )
    assert submit(org.researcher, org.project_a, "short").max_runtime_s == 600
    errors = errors_of(lambda: submit(org.researcher, org.project_a, "long", max_runtime_s=7200))
    assert errors == {
        "max_runtime_s": ["Refused by policy 'max runtime' of department vision: at most 3600 s."]
    }


def test_a_projects_default_runtime_above_its_departments_maximum_is_capped(org, submit):
    policy_set(actor=org.dept_admin, department=org.dept_a, max_runtime_s=3600)
    policy_set(actor=org.dept_admin, project=org.project_a, default_runtime_s=7200)
    assert submit(org.researcher, org.project_a, "job").max_runtime_s == 3600
    errors = errors_of(lambda: submit(org.researcher, org.project_a, "long", max_runtime_s=7200))
    assert errors == {
        "max_runtime_s": ["Refused by policy 'max runtime' of department vision: at most 3600 s."]
    }


def test_preemptible_classes_decide_the_default_and_refuse_opting_out(org, submit):
    policy_set(actor=org.dept_admin, project=org.project_a, preemptible_classes=["train", "build"])
    assert submit(org.researcher, org.project_a, "nb", kind="workspace").preemptible is True
    errors = errors_of(lambda: submit(org.researcher, org.project_a, "t", preemptible=False))
    assert errors["preemptible"] == [
        "Refused by policy 'preemptible classes' of project ml-vision: "
        "train workloads may be preempted here."
    ]


def test_only_admins_of_the_department_set_its_policies(org):
    with pytest.raises(PermissionDenied):
        policy_set(actor=org.researcher, project=org.project_a, max_runtime_s=10)
    with pytest.raises(PermissionDenied):
        policy_set(actor=org.dept_admin, department=org.dept_b, max_runtime_s=10)
    policy = policy_set(actor=org.dept_admin, project=org.project_a, max_runtime_s=10)
    row = AuditLog.objects.get(action="policy.set")
    assert (row.object_id, row.after["max_runtime_s"]) == (str(policy.pk), 10)


def test_an_hpo_grid_sweep_creates_one_trial_per_combination_with_params_in_env(org, submit):
    sweep = submit(
        org.researcher,
        org.project_a,
        "sweep",
        kind="hpo",
        gpus=1,
        env={"BASE": "1"},
        search={"method": "grid", "parameters": {"lr": [0.1, 0.01], "bs": [32, 64]}},
    )
    trials = list(sweep.children.order_by("name"))
    assert [t.name for t in trials] == [f"sweep-trial-{i}" for i in range(4)]
    assert {(t.env["BS"], t.env["LR"]) for t in trials} == {
        ("32", "0.1"),
        ("32", "0.01"),
        ("64", "0.1"),
        ("64", "0.01"),
    }
    assert all(t.env["BASE"] == "1" and t.kind == "training" and t.gpus == 1 for t in trials)
    assert WorkloadEvent.objects.filter(workload__parent=sweep).count() == 4


def test_a_random_sweep_is_repeatable_for_the_same_seed(org, submit):
    search = {
        "method": "random",
        "trials": 3,
        "seed": 7,
        "parameters": {"lr": {"min": 1e-4, "max": 1e-1, "log": True}, "depth": [2, 4, 8]},
    }
    one = submit(org.researcher, org.project_a, "one", kind="hpo", search=search)
    two = submit(org.researcher, org.project_a, "two", kind="hpo", search=search)
    params = [sorted(t.spec["params"].items()) for t in one.children.order_by("pk")]
    assert params == [sorted(t.spec["params"].items()) for t in two.children.order_by("pk")]
    assert all(1e-4 <= dict(p)["lr"] <= 1e-1 for p in params)


def test_a_bad_search_space_is_refused_on_the_search_field(org, submit):
    errors = errors_of(
        lambda: submit(
            org.researcher, org.project_a, "s", kind="hpo", search={"parameters": {"lr": []}}
        )
    )
    assert errors == {"search": ["Parameter lr has no values."]}


def test_stopping_a_sweep_stops_its_trials(org, submit):
    sweep = submit(
        org.researcher,
        org.project_a,
        "sweep",
        kind="hpo",
        search={"method": "grid", "parameters": {"lr": [1, 2]}},
    )
    workload_stop(actor=org.researcher, workload=sweep)
    states = set(Workload.objects.values_list("state", flat=True))
    assert states == {WorkloadState.STOPPED}
    assert AuditLog.objects.filter(action="workload.stop").count() == 1


def test_stopping_a_finished_workload_is_refused(org, submit):
    wl = submit(org.researcher, org.project_a, "job")
    workload_stop(actor=org.researcher, workload=wl)
    errors = errors_of(lambda: workload_stop(actor=org.researcher, workload=wl))
    assert errors == {"state": ["job has already stopped."]}


def test_outsiders_cannot_stop_or_delete(org, submit):
    wl = submit(org.researcher, org.project_a, "job")
    with pytest.raises(PermissionDenied):
        workload_stop(actor=org.outsider, workload=wl)
    with pytest.raises(PermissionDenied):
        workload_delete(actor=org.outsider, workload=wl)


def test_a_running_workload_must_be_stopped_before_it_is_deleted(org, submit, cluster):
    from scheduling.cycle import cycle_run

    wl = submit(org.researcher, org.project_a, "job", gpus=1)
    cycle_run()
    wl.refresh_from_db()
    assert wl.state == WorkloadState.ADMITTED
    errors = errors_of(lambda: workload_delete(actor=org.researcher, workload=wl))
    assert errors == {"state": ["Stop job before deleting it."]}
    workload_stop(actor=org.researcher, workload=wl)
    errors = errors_of(lambda: workload_delete(actor=org.researcher, workload=wl))
    assert errors == {"state": ["The pods of job are still stopping."]}
    wl.allocations.all().delete()
    workload_id = wl.pk
    workload_delete(actor=org.researcher, workload=wl)
    assert not Workload.objects.filter(pk=workload_id).exists()
    assert AuditLog.objects.filter(action="workload.delete", object_id=str(workload_id)).exists()
