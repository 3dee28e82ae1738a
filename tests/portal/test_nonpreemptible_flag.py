"""A project's permission to run non-preemptible work over its deserved quota (issue 17):
only a platform admin changes it, in the project form and the API, and the engine gets it."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal import services
from portal.errors import ValidationFailed
from portal.models import AuditLog
from scheduling.adapters import project_queue, read_snapshot

REFUSED = ["Only a platform admin may allow non-preemptible work over quota."]


def _update(actor, project, **kw):
    values = {"name": project.name, "namespace": project.namespace} | kw
    return services.project_update(actor=actor, project=project, **values)


def test_a_platform_admin_allows_it_and_the_change_is_audited(org):
    _update(org.platform_admin, org.project_a, nonpreemptible_over_quota=True)
    org.project_a.refresh_from_db()
    assert org.project_a.nonpreemptible_over_quota
    assert AuditLog.objects.latest("pk").after["nonpreemptible_over_quota"] is True


def test_a_department_admin_may_not_change_it_but_edits_the_rest(org):
    with pytest.raises(ValidationFailed) as exc:
        _update(org.dept_admin, org.project_a, nonpreemptible_over_quota=True)
    assert exc.value.errors == {"nonpreemptible_over_quota": REFUSED}
    with pytest.raises(ValidationFailed):
        services.project_create(
            actor=org.dept_admin, department=org.dept_a, name="np", nonpreemptible_over_quota=True
        )
    _update(org.platform_admin, org.project_a, nonpreemptible_over_quota=True)
    _update(org.dept_admin, org.project_a, description="Cameras")  # the flag stays as it is
    org.project_a.refresh_from_db()
    assert org.project_a.nonpreemptible_over_quota and org.project_a.description == "Cameras"


def test_the_api_shows_it_and_refuses_a_department_admin_with_a_400_naming_the_field(org):
    url = f"/api/v1/projects/{org.project_a.pk}/"
    dana, admin = APIClient(), APIClient()
    dana.force_authenticate(org.dept_admin)
    admin.force_authenticate(org.platform_admin)
    assert dana.get(url).json()["nonpreemptible_over_quota"] is False
    refused = dana.patch(url, {"nonpreemptible_over_quota": True}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"nonpreemptible_over_quota": REFUSED}
    bad = admin.patch(url, {"nonpreemptible_over_quota": "sometimes"}, format="json")
    assert bad.status_code == 400 and "nonpreemptible_over_quota" in bad.json()
    done = admin.patch(url, {"nonpreemptible_over_quota": True}, format="json")
    assert done.status_code == 200 and done.json()["nonpreemptible_over_quota"] is True
    assert dana.patch(url, {"description": "x"}, format="json").status_code == 200


def test_the_project_form_offers_it_to_platform_admins_only(client_as, org):
    url = f"/projects/{org.project_a.pk}/edit/"
    page = client_as(org.dept_admin).get(url).content.decode()
    field = page[page.index('name="nonpreemptible_over_quota"') - 80 :][:200]
    assert "disabled" in field
    # A department admin's post cannot switch it on: the disabled field keeps its value.
    data = {"name": "ml-vision", "namespace": "gp-ml-vision", "nonpreemptible_over_quota": "on"}
    assert client_as(org.dept_admin).post(url, data).status_code == 302
    org.project_a.refresh_from_db()
    assert not org.project_a.nonpreemptible_over_quota
    assert client_as(org.platform_admin).post(url, data).status_code == 302
    org.project_a.refresh_from_db()
    assert org.project_a.nonpreemptible_over_quota


def test_the_engine_snapshot_carries_it_on_the_projects_queue(org):
    _update(org.platform_admin, org.project_b, nonpreemptible_over_quota=True)
    queues = {q.id: q for q in read_snapshot().snapshot.queues}
    assert queues[project_queue(org.project_b.pk)].nonpreemptible_over_quota
    assert not queues[project_queue(org.project_a.pk)].nonpreemptible_over_quota
