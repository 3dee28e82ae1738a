"""The organisation's services: who may, what they refuse (and say), what they record."""

from __future__ import annotations

from decimal import Decimal as D

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied

from portal import services
from portal.errors import ValidationFailed
from portal.models import AuditLog, DepartmentQuota, Membership, ProjectQuota, Role, User
from scheduling.models import Workload
from tests import factories as f


def last_audit() -> AuditLog:
    return AuditLog.objects.order_by("-id").first()


# --- Departments ------------------------------------------------------------------------------


def test_creating_a_department_writes_an_audit_row_with_the_actor_and_after(org):
    department = services.department_create(actor=org.platform_admin, name=" Robotics ")
    assert department.name == "Robotics"
    row = last_audit()
    assert (row.actor, row.action, row.department) == (
        org.platform_admin,
        "department.create",
        department,
    )
    assert row.after["name"] == "Robotics"


def test_only_platform_admins_create_departments(org):
    with pytest.raises(PermissionDenied):
        services.department_create(actor=org.dept_admin, name="Robotics")


def test_it_refuses_a_department_name_in_use_whatever_the_case(org):
    with pytest.raises(ValidationFailed) as exc:
        services.department_create(actor=org.platform_admin, name="VISION")
    assert exc.value.errors == {"name": ["A department named VISION exists already."]}


def test_a_department_admin_renames_their_department_but_not_another(org):
    services.department_update(actor=org.dept_admin, department=org.dept_a, name="sight")
    assert last_audit().before["name"] == "vision"
    with pytest.raises(PermissionDenied):
        services.department_update(actor=org.dept_admin, department=org.dept_b, name="x")


def test_a_department_with_projects_cannot_be_deleted_and_the_projects_are_named(org):
    with pytest.raises(ValidationFailed, match="ml-detect, ml-vision"):
        services.department_delete(actor=org.platform_admin, department=org.dept_a)


# --- Projects ---------------------------------------------------------------------------------


def test_a_project_gets_a_namespace_derived_from_its_name_when_none_is_given(org):
    project = services.project_create(actor=org.dept_admin, department=org.dept_a, name="seg")
    assert project.namespace == "gpupool-seg"
    assert last_audit().department == org.dept_a


def test_it_refuses_a_namespace_that_is_not_a_dns_label(org):
    with pytest.raises(ValidationFailed) as exc:
        services.project_create(
            actor=org.dept_admin, department=org.dept_a, name="seg", namespace="Seg_1"
        )
    assert list(exc.value.errors) == ["namespace"]
    assert "not a valid Kubernetes namespace" in exc.value.errors["namespace"][0]


def test_it_refuses_a_project_name_that_is_not_a_dns_label(org):
    with pytest.raises(ValidationFailed) as exc:
        services.project_create(actor=org.dept_admin, department=org.dept_a, name="-bad-")
    assert list(exc.value.errors) == ["name"]


def test_it_refuses_a_namespace_another_project_uses_and_names_that_project(org):
    with pytest.raises(ValidationFailed) as exc:
        services.project_create(
            actor=org.platform_admin, department=org.dept_b, name="x", namespace="gp-ml-vision"
        )
    assert exc.value.errors == {
        "namespace": ["Namespace gp-ml-vision is taken by project ml-vision."]
    }


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-anything", "gpupool-system"])
def test_it_refuses_the_namespaces_of_kubernetes_and_gpupool_itself(org, namespace):
    with pytest.raises(ValidationFailed) as exc:
        services.project_create(
            actor=org.dept_admin, department=org.dept_a, name="seg", namespace=namespace
        )
    assert exc.value.errors == {
        "namespace": [
            f"Namespace {namespace} is reserved for Kubernetes or GPUPool itself; choose another."
        ]
    }


def test_a_project_named_system_does_not_get_gpupools_own_namespace(org):
    with pytest.raises(ValidationFailed) as exc:
        services.project_create(actor=org.dept_admin, department=org.dept_a, name="system")
    assert "gpupool-system is reserved" in exc.value.errors["namespace"][0]
    project = services.project_create(
        actor=org.dept_admin, department=org.dept_a, name="system", namespace="team-system"
    )
    assert project.namespace == "team-system"


def test_the_namespace_of_a_project_with_running_work_does_not_change(org):
    Workload.objects.create(
        project=org.project_a, submitted_by=org.researcher, kind="training", name="resnet",
        state="running",
    )  # fmt: skip
    with pytest.raises(ValidationFailed) as exc:
        services.project_update(
            actor=org.dept_admin, project=org.project_a, name="ml-vision", namespace="gp-new"
        )
    assert exc.value.errors == {
        "namespace": [
            "ml-vision has 1 workload(s) pending or running (resnet); its namespace can change "
            "once they have stopped."
        ]
    }
    org.project_a.refresh_from_db()
    assert org.project_a.namespace == "gp-ml-vision"
    # The rest of the project may change meanwhile, the namespace staying.
    services.project_update(
        actor=org.dept_admin, project=org.project_a, name="ml-vision", namespace="gp-ml-vision",
        description="Cameras",
    )  # fmt: skip
    Workload.objects.filter(project=org.project_a).update(state="succeeded")
    services.project_update(
        actor=org.dept_admin, project=org.project_a, name="ml-vision", namespace="gp-new"
    )
    assert last_audit().after["namespace"] == "gp-new"


def test_a_project_racing_another_past_the_checks_is_refused_not_a_server_error(org, monkeypatch):
    # Two requests both checked the name before either saved: the second meets the constraint.
    monkeypatch.setattr(services.organisation, "_project_errors", lambda *args, **kw: {})
    before = AuditLog.objects.count()
    with pytest.raises(ValidationFailed, match="Another project like this one was saved"):
        services.project_create(actor=org.dept_admin, department=org.dept_a, name="ml-vision")
    assert AuditLog.objects.count() == before
    services.project_create(actor=org.dept_admin, department=org.dept_a, name="seg")  # still usable


def test_a_department_admin_cannot_create_projects_in_another_department(org):
    with pytest.raises(PermissionDenied):
        services.project_create(actor=org.dept_admin, department=org.dept_b, name="sneaky")


def test_a_project_with_running_work_is_not_deleted_and_the_work_is_named(org):
    Workload.objects.create(
        project=org.project_a,
        submitted_by=org.researcher,
        kind="training",
        name="resnet",
        state="running",
    )
    with pytest.raises(ValidationFailed, match=r"1 workload\(s\) pending or running \(resnet\)"):
        services.project_delete(actor=org.dept_admin, project=org.project_a)


def test_a_project_whose_work_has_finished_is_deleted_with_it_and_audited(org):
    Workload.objects.create(
        project=org.project_a,
        submitted_by=org.researcher,
        kind="training",
        name="old",
        state="succeeded",
    )
    services.project_delete(actor=org.dept_admin, project=org.project_a)
    assert not Workload.objects.filter(name="old").exists()
    assert last_audit().action == "project.delete"
    assert last_audit().before["name"] == "ml-vision"


# --- Quotas -----------------------------------------------------------------------------------


def test_a_project_quota_over_what_its_department_has_left_is_refused_with_the_numbers(org):
    # vision deserves 8 in a100; ml-detect already deserves 2, so ml-vision may have 6.
    with pytest.raises(ValidationFailed) as exc:
        services.quota_set(actor=org.dept_admin, owner=org.project_a, table={org.pool: {"gpus": 7}})
    assert exc.value.errors == {
        "a100.gpus": [
            "Department vision deserves 8 GPUs in a100; its other projects already deserve 2, "
            "so ml-vision can deserve at most 6 (asked 7)."
        ]
    }
    services.quota_set(actor=org.dept_admin, owner=org.project_a, table={org.pool: {"gpus": 6}})
    assert ProjectQuota.objects.get(project=org.project_a).gpus == 6


def test_lowering_a_department_below_its_projects_is_refused_naming_them(org):
    with pytest.raises(ValidationFailed) as exc:
        services.quota_set(
            actor=org.platform_admin, owner=org.dept_a, table={org.pool: {"gpus": 5}}
        )
    assert "ml-detect (2), ml-vision (4)" in exc.value.errors["a100.gpus"][0]
    assert DepartmentQuota.objects.get(department=org.dept_a).gpus == 8


def test_a_project_in_a_pool_where_its_department_has_no_quota_may_deserve_nothing(org):
    h100 = f.make_pool("h100")
    with pytest.raises(ValidationFailed, match="Department vision deserves 0 GPUs in h100"):
        services.quota_set(actor=org.dept_admin, owner=org.project_a, table={h100: {"gpus": 1}})


def test_the_whole_quota_table_is_written_or_nothing_is(org):
    h100 = f.make_pool("h100")
    table = {h100: {"gpus": 4}, org.pool: {"gpus": 10, "gpus_limit": 9}}
    with pytest.raises(ValidationFailed) as exc:
        services.quota_set(actor=org.platform_admin, owner=org.dept_a, table=table)
    assert list(exc.value.errors) == ["a100.gpus_limit"]
    assert not DepartmentQuota.objects.filter(node_pool=h100).exists()


def test_negative_values_are_refused_per_pool_and_field(org):
    table = {org.pool: {"gpus": 1, "cpu": -4, "over_quota_weight": -1}}
    with pytest.raises(ValidationFailed) as exc:
        services.quota_set(actor=org.dept_admin, owner=org.project_a, table=table)
    assert exc.value.errors == {
        "a100.cpu": ["Must not be negative."],
        "a100.over_quota_weight": ["Must not be negative."],
    }


def test_setting_quotas_records_the_whole_table_before_and_after(org):
    table = {
        org.pool: {
            "gpus": "2.5",
            "gpus_limit": 6,
            "over_quota_weight": 3,
            "over_quota_allowed": False,
        }
    }
    services.quota_set(actor=org.dept_admin, owner=org.project_a, table=table)
    quota = ProjectQuota.objects.get(project=org.project_a)
    assert (quota.gpus, quota.gpus_limit, quota.over_quota_weight) == (D("2.5"), 6, 3)
    assert quota.over_quota_allowed is False
    row = last_audit()
    assert row.action == "project_quota.set"
    assert row.before["a100"]["gpus"] == "4"
    assert row.after["a100"] == {
        "gpus": "2.5",  # as a person writes it
        "gpus_limit": "6",
        "cpu": "0",
        "cpu_limit": None,
        "memory_gib": "0",
        "memory_gib_limit": None,
        "over_quota_weight": "3",
        "over_quota_allowed": False,
    }


def test_department_quotas_are_for_platform_admins_and_project_quotas_for_their_admins(org):
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=org.dept_admin, owner=org.dept_a, table={org.pool: {"gpus": 9}})
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=org.dept_admin, owner=org.project_b, table={org.pool: {"gpus": 1}})
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=org.researcher, owner=org.project_a, table={org.pool: {"gpus": 1}})


# --- Node pools -------------------------------------------------------------------------------


def test_node_pools_need_a_unique_label_like_name_and_a_known_placement(org):
    with pytest.raises(ValidationFailed) as exc:
        services.node_pool_create(actor=org.platform_admin, name="a100", placement="random")
    assert set(exc.value.errors) == {"name", "placement"}
    pool = services.node_pool_create(actor=org.platform_admin, name="h100", placement="spread")
    services.node_pool_update(actor=org.platform_admin, pool=pool, label_value="nvidia-h100")
    assert last_audit().after["label_value"] == "nvidia-h100"
    with pytest.raises(PermissionDenied):
        services.node_pool_create(actor=org.dept_admin, name="t4")


# --- People -----------------------------------------------------------------------------------


def test_an_invited_user_gets_an_email_with_a_working_set_password_link(
    org, client, django_capture_on_commit_callbacks, settings
):
    settings.SITE_URL = "http://gpupool.test"
    with django_capture_on_commit_callbacks(execute=True):
        user = services.user_invite(
            actor=org.dept_admin, email="Nia@Example.com", project=org.project_a, role="viewer"
        )
    assert (user.username, user.email, user.has_usable_password()) == (
        "nia",
        "nia@example.com",
        False,
    )
    assert Membership.objects.get(user=user).role == Role.VIEWER
    assert [m.to for m in mail.outbox] == [["nia@example.com"]]
    link = next(w for w in mail.outbox[0].body.split() if w.startswith("http://gpupool.test/"))
    response = client.get(link.removeprefix("http://gpupool.test"), follow=True)
    assert b"Set your password" in response.content
    assert [r.action for r in AuditLog.objects.order_by("id")][-2:] == [
        "user.invite",
        "membership.add",
    ]


def test_an_invitation_that_fails_sends_no_email(org, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationFailed) as exc:
        services.user_invite(actor=org.platform_admin, email="rita@example.com")
    assert exc.value.errors == {"email": ["rita@example.com already has an account."]}
    assert mail.outbox == []


def test_a_department_admin_invites_only_into_their_department_and_never_platform_admins(org):
    with pytest.raises(PermissionDenied):
        services.user_invite(actor=org.dept_admin, email="x@example.com", project=org.project_b)
    with pytest.raises(PermissionDenied):
        services.user_invite(
            actor=org.dept_admin,
            email="x@example.com",
            project=org.project_a,
            is_platform_admin=True,
        )
    with pytest.raises(ValidationFailed) as exc:
        services.user_invite(actor=org.dept_admin, email="x@example.com")
    assert list(exc.value.errors) == ["project"]
    assert not User.objects.filter(email="x@example.com").exists()


def test_inviting_a_deactivated_persons_address_says_to_reactivate_them(org):
    services.user_deactivate(actor=org.platform_admin, user=org.researcher)
    with pytest.raises(ValidationFailed) as exc:
        services.user_invite(actor=org.dept_admin, email="RITA@example.com", project=org.project_a)
    assert exc.value.errors == {
        "email": [
            "rita@example.com already has an account. It is deactivated: reactivate it from "
            "its page."
        ]
    }


def test_two_invitations_racing_for_one_address_refuse_the_second(org, monkeypatch):
    from portal.services import users

    monkeypatch.setattr(users, "_invite_errors", lambda *args: {})  # both passed the check
    with pytest.raises(ValidationFailed, match="was given an account at the same moment"):
        services.user_invite(actor=org.dept_admin, email="rita@example.com", project=org.project_a)
    assert User.objects.filter(email="rita@example.com").count() == 1


def test_researchers_cannot_invite_anyone(org):
    with pytest.raises(PermissionDenied):
        services.user_invite(actor=org.researcher, email="x@example.com", project=org.project_a)


def test_memberships_are_added_and_removed_with_audit_rows_inside_the_department(org):
    membership = services.membership_add(
        actor=org.dept_admin, user=org.outsider, role="researcher", project=org.project_a2
    )
    assert last_audit().department == org.dept_a
    with pytest.raises(ValidationFailed, match="already a member of ml-detect"):
        services.membership_add(
            actor=org.dept_admin, user=org.outsider, role="viewer", project=org.project_a2
        )
    services.membership_remove(actor=org.dept_admin, membership=membership)
    assert last_audit().action == "membership.remove"
    with pytest.raises(PermissionDenied):
        services.membership_remove(actor=org.dept_admin, membership=org.outsider.memberships.get())


def test_a_membership_must_match_its_role(org):
    with pytest.raises(ValidationFailed) as exc:
        services.membership_add(
            actor=org.platform_admin,
            user=org.outsider,
            role="department_admin",
            project=org.project_a,
        )
    assert list(exc.value.errors) == ["department"]


def test_a_department_admin_deactivates_their_people_but_not_others_nor_themselves(org, client):
    services.user_deactivate(actor=org.dept_admin, user=org.researcher)
    org.researcher.refresh_from_db()
    assert org.researcher.is_active is False
    assert not client.login(username="rita", password=f.PASSWORD)
    with pytest.raises(PermissionDenied):
        services.user_deactivate(actor=org.dept_admin, user=org.outsider)
    with pytest.raises(PermissionDenied):
        services.user_deactivate(actor=org.dept_admin, user=org.dept_admin)
    with pytest.raises(ValidationFailed, match="cannot deactivate yourself"):
        services.user_deactivate(actor=org.platform_admin, user=org.platform_admin)


def test_a_deactivated_user_is_reactivated_by_an_admin_of_their_department_only(org, client):
    services.user_deactivate(actor=org.dept_admin, user=org.researcher)
    services.user_deactivate(actor=org.platform_admin, user=org.outsider)
    with pytest.raises(PermissionDenied):
        services.user_reactivate(actor=org.dept_admin, user=org.outsider)
    services.user_reactivate(actor=org.dept_admin, user=org.researcher)
    assert client.login(username="rita", password=f.PASSWORD)  # the old password works again
    row = last_audit()
    assert (row.action, row.department) == ("user.reactivate", org.dept_a)
    assert (row.before["is_active"], row.after["is_active"]) == (False, True)
    with pytest.raises(ValidationFailed, match="rita is active already"):
        services.user_reactivate(actor=org.dept_admin, user=org.researcher)


def test_a_department_admins_change_to_their_person_shows_in_their_audit_rows(org):
    services.user_update(
        actor=org.dept_admin, user=org.researcher, first_name="Rita", last_name="", email="r@x.io"
    )
    row = last_audit()
    assert (row.action, row.department) == ("user.update", org.dept_a)
    assert row.after["email"] == "r@x.io"


def test_only_platform_admins_grant_platform_admin_rights(org):
    with pytest.raises(PermissionDenied):
        services.user_update(
            actor=org.dept_admin,
            user=org.researcher,
            first_name="",
            last_name="",
            email="rita@example.com",
            is_platform_admin=True,
        )
    services.user_update(
        actor=org.platform_admin,
        user=org.researcher,
        first_name="Rita",
        last_name="R",
        email="rita@example.com",
        is_platform_admin=True,
    )
    assert last_audit().after["is_platform_admin"] is True
