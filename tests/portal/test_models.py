"""The database itself refuses what no service should ever write."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from portal.models import Membership, Project, Role
from tests import factories as f


def test_a_researcher_membership_without_a_project_is_refused_by_the_database(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(user=org.outsider, role=Role.RESEARCHER, department=org.dept_a)


def test_a_department_admin_membership_on_a_project_is_refused_by_the_database(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(
            user=org.outsider, role=Role.DEPARTMENT_ADMIN, project=org.project_a
        )


def test_one_role_per_person_per_project(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        f.make_membership(org.researcher, role=Role.VIEWER, project=org.project_a)


def test_two_projects_cannot_share_a_namespace(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        Project.objects.create(department=org.dept_b, name="other", namespace="gp-ml-vision")


def test_one_quota_row_per_project_and_node_pool(org):
    with pytest.raises(IntegrityError), transaction.atomic():
        f.make_project_quota(org.project_a, org.pool, gpus=1)
