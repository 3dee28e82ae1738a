"""The organisation's pages: forms post to the services and show their messages in place."""

from __future__ import annotations

from datetime import timedelta

from django.core import mail
from django.utils import timezone

from portal import services
from portal.models import AuditLog, Department, DepartmentQuota, Project, ProjectQuota, User


def quota_post(pool, **values) -> dict[str, str]:
    row = {"gpus": "0", "cpu": "0", "memory_gib": "0", "over_quota_weight": "1"} | values
    return {f"pool-{pool.pk}-{k}": str(v) for k, v in row.items()}


def test_a_platform_admin_creates_a_department_and_lands_on_its_quota_table(client_as, org):
    response = client_as(org.platform_admin).post("/departments/new/", {"name": "Robotics"})
    department = Department.objects.get(name="Robotics")
    assert response["Location"] == f"/departments/{department.pk}/"
    page = client_as(org.platform_admin).get(response["Location"]).content.decode()
    assert f'name="pool-{org.pool.pk}-gpus"' in page


def test_the_department_quota_form_saves_every_pool_in_one_post(client_as, org):
    data = quota_post(org.pool, gpus="12.5", gpus_limit="16", over_quota_allowed="on")
    response = client_as(org.platform_admin).post(f"/departments/{org.dept_a.pk}/quotas/", data)
    assert response.status_code == 302
    quota = DepartmentQuota.objects.get(department=org.dept_a)
    assert (str(quota.gpus), str(quota.gpus_limit)) == ("12.50", "16.00")


def test_a_refused_department_quota_shows_the_message_on_its_field(client_as, org):
    data = quota_post(org.pool, gpus="3")
    response = client_as(org.platform_admin).post(f"/departments/{org.dept_a.pk}/quotas/", data)
    assert response.status_code == 200
    page = response.content.decode()
    assert "The projects of vision deserve 6 GPUs in a100 together" in page
    assert "ml-detect (2), ml-vision (4)" in page
    assert DepartmentQuota.objects.get(department=org.dept_a).gpus == 8


def test_a_project_quota_form_rejects_a_limit_below_deserved_in_place(client_as, org):
    data = quota_post(org.pool, gpus="2", gpus_limit="1")
    response = client_as(org.dept_admin).post(f"/projects/{org.project_a.pk}/quotas/", data)
    assert response.status_code == 200
    assert "must be at least the deserved amount (2 GPUs)" in response.content.decode()
    assert ProjectQuota.objects.get(project=org.project_a).gpus == 4


def test_a_department_admin_creates_a_project_with_the_default_namespace(client_as, org):
    data = {"department": org.dept_a.pk, "name": "seg", "namespace": ""}
    response = client_as(org.dept_admin).post("/projects/new/", data)
    project = Project.objects.get(name="seg")
    assert project.namespace == "gpupool-seg"
    assert response["Location"] == f"/projects/{project.pk}/quotas/"


def test_a_department_admin_cannot_pick_another_department_for_a_new_project(client_as, org):
    data = {"department": org.dept_b.pk, "name": "seg"}
    response = client_as(org.dept_admin).post("/projects/new/", data)
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Project.objects.filter(name="seg").exists()


def test_deleting_a_project_with_running_work_says_why_and_keeps_it(client_as, org):
    from scheduling.models import Workload

    Workload.objects.create(
        project=org.project_a,
        submitted_by=org.researcher,
        kind="training",
        name="bert",
        state="pending",
    )
    client = client_as(org.dept_admin)
    response = client.post(f"/projects/{org.project_a.pk}/delete/", follow=True)
    assert "pending or running (bert)" in response.content.decode()
    assert Project.objects.filter(pk=org.project_a.pk).exists()


def test_inviting_from_the_page_sends_the_email(client_as, org, django_capture_on_commit_callbacks):
    data = {"email": "nia@example.com", "project": org.project_a.pk, "role": "researcher"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as(org.dept_admin).post("/users/invite/", data)
    user = User.objects.get(email="nia@example.com")
    assert response["Location"] == f"/users/{user.pk}/"
    assert len(mail.outbox) == 1
    assert "/accounts/reset/" in mail.outbox[0].body


def test_a_department_admin_makes_someone_department_admin_of_their_department(client_as, org):
    data = {"role": "department_admin", "department": org.dept_a.pk}
    response = client_as(org.dept_admin).post(f"/users/{org.researcher.pk}/memberships/", data)
    assert response.status_code == 302
    assert org.researcher.memberships.filter(role="department_admin").exists()


def test_deactivating_from_the_page_stops_the_user(client_as, org):
    client_as(org.dept_admin).post(f"/users/{org.researcher.pk}/deactivate/")
    org.researcher.refresh_from_db()
    assert not org.researcher.is_active


def test_reactivating_from_the_page_lets_the_user_sign_in_again(client_as, org):
    client = client_as(org.dept_admin)
    client.post(f"/users/{org.researcher.pk}/deactivate/")
    page = client.get(f"/users/{org.researcher.pk}/").content.decode()
    assert f'action="/users/{org.researcher.pk}/reactivate/"' in page
    response = client.post(f"/users/{org.researcher.pk}/reactivate/", follow=True)
    assert "rita can sign in again." in response.content.decode()
    org.researcher.refresh_from_db()
    assert org.researcher.is_active
    # Someone outside the department stays out of reach.
    services.user_deactivate(actor=org.platform_admin, user=org.outsider)
    assert client.post(f"/users/{org.outsider.pk}/reactivate/").status_code == 404
    org.outsider.refresh_from_db()
    assert not org.outsider.is_active


def test_the_audit_log_filters_by_actor_action_department_and_dates(client_as, org):
    services.department_update(actor=org.platform_admin, department=org.dept_a, name="sight")
    services.project_update(actor=org.dept_admin, project=org.project_a, name="cats")
    services.project_update(actor=org.platform_admin, project=org.project_b, name="words")
    client = client_as(org.platform_admin)

    def shown(query: str) -> list[str]:
        page = client.get(f"/audit/?{query}").context["page"]
        return [row.object_repr for row in page]

    assert shown("actor=dana") == ["cats"]
    assert shown("action=project.update") == ["words", "cats"]
    assert shown(f"department={org.dept_b.pk}") == ["words"]
    assert shown("object_type=department") == ["sight"]
    today = timezone.now().date()
    assert len(shown(f"since={today}&until={today}")) == 3
    assert shown(f"until={today - timedelta(days=1)}") == []


def test_the_audit_log_pages_through_long_histories(client_as, org):
    for n in range(55):
        services.department_update(actor=org.platform_admin, department=org.dept_a, name=f"v{n}")
    client = client_as(org.platform_admin)
    first = client.get("/audit/?action=department.update")
    assert len(first.context["page"]) == 50
    assert "?action=department.update&page=2" in first.content.decode()
    second = client.get("/audit/?action=department.update&page=2")
    assert [r.object_repr for r in second.context["page"]] == ["v4", "v3", "v2", "v1", "v0"]
    assert AuditLog.objects.count() == 55


def test_a_platform_admin_creates_and_edits_a_node_pool(client_as, org):
    client = client_as(org.platform_admin)
    client.post("/node-pools/new/", {"name": "h100", "placement": "spread"})
    pool = org.pool.__class__.objects.get(name="h100")
    client.post(
        f"/node-pools/{pool.pk}/", {"name": "h100", "placement": "binpack", "label_value": "x"}
    )
    pool.refresh_from_db()
    assert (pool.placement, pool.label_value) == ("binpack", "x")


def test_password_reset_mails_a_link_to_active_users_and_to_invited_ones(client, org):
    invited = User.objects.create(username="nia", email="nia@example.com")
    invited.set_unusable_password()
    invited.save()
    for address in ("rita@example.com", "NIA@example.com", "nobody@example.com"):
        response = client.post("/accounts/password-reset/", {"email": address})
        assert response["Location"] == "/accounts/password-reset/sent/"
    assert [m.to for m in mail.outbox] == [["rita@example.com"], ["nia@example.com"]]
    assert "/accounts/reset/" in mail.outbox[0].body


def test_a_deactivated_user_gets_no_reset_link(client, org):
    org.researcher.is_active = False
    org.researcher.save()
    client.post("/accounts/password-reset/", {"email": "rita@example.com"})
    assert mail.outbox == []


def test_the_audit_log_shows_what_changed_from_before_to_after(client_as, org):
    table = {org.pool: {"gpus": 3, "gpus_limit": 5}}
    services.quota_set(actor=org.dept_admin, owner=org.project_a, table=table)
    page = client_as(org.dept_admin).get("/audit/").content.decode()
    assert "<code>a100.gpus</code>: 4 → 3" in page
    assert "<code>a100.gpus_limit</code>: — → 5" in page
    assert "<code>a100.cpu</code>" not in page


def test_a_department_admin_finds_their_invitations_in_the_audit_log(client_as, org):
    services.user_invite(actor=org.dept_admin, email="nia@example.com", project=org.project_a)
    page = client_as(org.dept_admin).get("/audit/?action=user.invite").content.decode()
    assert "nia" in page


def test_an_admin_deactivating_themselves_is_told_why_in_a_plain_sentence(client_as, org):
    response = client_as(org.platform_admin).post(
        f"/users/{org.platform_admin.pk}/deactivate/", follow=True
    )
    page = response.content.decode()
    assert "You cannot deactivate yourself." in page and "__all__" not in page
    assert User.objects.get(pk=org.platform_admin.pk).is_active


def test_a_refused_department_delete_flashes_the_reason_and_goes_back_to_the_department(
    client_as, org
):
    client = client_as(org.platform_admin)
    response = client.post(f"/departments/{org.dept_a.pk}/delete/")
    assert response["Location"] == f"/departments/{org.dept_a.pk}/"
    page = client.get(response["Location"]).content.decode()
    assert "still has projects" in page
    assert Department.objects.filter(pk=org.dept_a.pk).exists()


def test_the_department_and_project_lists_show_each_quota_and_its_cap(client_as, org):
    ProjectQuota.objects.filter(project=org.project_a).update(gpus_limit=6)
    client = client_as(org.platform_admin)
    departments = client.get("/departments/").content.decode()
    projects = client.get("/projects/").content.decode()
    assert '<span class="badge">a100: 8</span>' in departments
    assert '<span class="badge">a100: 4 (max 6)</span>' in projects
    assert '<span class="badge">a100: 2</span>' in projects
