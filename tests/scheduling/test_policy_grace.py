"""The termination grace period of a policy: set, inherited, shown, and refused when absurd."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from portal.errors import ValidationFailed
from portal.models import AuditLog
from scheduling.models import WorkloadPolicy
from scheduling.policies import effective_policy, termination_grace_periods
from scheduling.services import policy_set

pytestmark = pytest.mark.django_db


def test_a_project_grace_period_overrides_its_department_and_unset_projects_inherit(org):
    policy_set(actor=org.dept_admin, department=org.dept_a, termination_grace_s=120)
    policy_set(actor=org.dept_admin, project=org.project_a, termination_grace_s=5)
    graces = termination_grace_periods([org.project_a, org.project_a2, org.project_b])
    # project_b's department sets nothing: absent, so the cluster's default applies.
    assert graces == {org.project_a.pk: 5, org.project_a2.pk: 120}


def test_a_grace_period_of_zero_is_a_setting_not_an_absence(org):
    policy_set(actor=org.dept_admin, department=org.dept_a, termination_grace_s=90)
    policy_set(actor=org.dept_admin, project=org.project_a, termination_grace_s=0)
    assert termination_grace_periods([org.project_a]) == {org.project_a.pk: 0}
    effective = effective_policy(org.project_a)
    assert (effective.termination_grace_s, effective.sources["termination_grace_s"]) == (
        0,
        "project ml-vision",
    )


def test_other_policy_fields_do_not_make_a_project_override_the_department_grace(org):
    policy_set(actor=org.dept_admin, department=org.dept_a, termination_grace_s=60)
    policy_set(actor=org.dept_admin, project=org.project_a, max_runtime_s=3600)
    assert termination_grace_periods([org.project_a]) == {org.project_a.pk: 60}
    assert effective_policy(org.project_a).termination_grace_s == 60


def test_setting_the_grace_period_is_audited_with_before_and_after(org):
    policy_set(actor=org.dept_admin, project=org.project_a, termination_grace_s=30)
    policy_set(actor=org.dept_admin, project=org.project_a, termination_grace_s=300)
    row = AuditLog.objects.filter(action="policy.set").latest("pk")
    assert (row.before["termination_grace_s"], row.after["termination_grace_s"]) == (30, 300)
    assert row.actor == org.dept_admin


def test_a_grace_period_over_a_day_is_refused_and_only_admins_may_set_one(org):
    with pytest.raises(ValidationFailed) as caught:
        policy_set(actor=org.dept_admin, project=org.project_a, termination_grace_s=86_401)
    assert caught.value.errors == {
        "termination_grace_s": ["Enter a whole number from 0 to 86400 seconds."]
    }
    with pytest.raises(PermissionDenied):
        policy_set(actor=org.researcher, project=org.project_a, termination_grace_s=10)
    assert not WorkloadPolicy.objects.exists()


def test_the_policy_form_edits_the_grace_period_and_the_pages_show_it(client_as, org):
    client = client_as(org.dept_admin)
    url = f"/workloads/policies/project/{org.project_a.pk}/"
    assert "Termination grace period (s)" in client.get(url).content.decode()
    response = client.post(url, {"termination_grace_s": "45"})
    assert response.status_code == 302
    assert WorkloadPolicy.objects.get(project=org.project_a).termination_grace_s == 45
    form = client.get(url).content.decode()
    assert 'name="termination_grace_s" value="45"' in form
    assert "termination grace period: 45 s" in form
    listing = client.get("/workloads/policies/").content.decode()
    assert '<td class="num">45</td>' in listing


def test_the_policy_form_refuses_a_negative_grace_period(client_as, org):
    client = client_as(org.dept_admin)
    url = f"/workloads/policies/project/{org.project_a.pk}/"
    response = client.post(url, {"termination_grace_s": "-1"})
    assert response.status_code == 200
    assert "Ensure this value is greater than or equal to 0." in response.content.decode()
    assert not WorkloadPolicy.objects.exists()


def test_the_api_sets_and_returns_the_grace_period(client_as, org):
    client = client_as(org.dept_admin)
    url = f"/api/v1/policies/department/{org.dept_a.pk}/"
    response = client.put(url, {"termination_grace_s": 600}, content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["termination_grace_s"] == 600
    assert client.get(url).json()["termination_grace_s"] == 600
    refused = client.put(url, {"termination_grace_s": -5}, content_type="application/json")
    assert refused.status_code == 400
