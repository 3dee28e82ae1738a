"""List pages read a fixed number of queries however many rows they show (no N+1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal import services
from tests import factories as f

PAGES = ["/", "/departments/", "/projects/", "/users/", "/audit/", "/node-pools/"]


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def add_rows(org, start: int, n: int) -> None:
    """n more departments, each with a quota, a project with a quota, an admin and a member,
    all made through the services so the audit log grows too."""
    pool = f.make_pool("h100")
    for i in range(start, start + n):
        actor = org.platform_admin
        department = services.department_create(actor=actor, name=f"extra-{i}")
        f.make_department_quota(department, pool, gpus=4, gpus_limit=6)
        project = services.project_create(actor=actor, department=department, name=f"extra-{i}")
        f.make_project_quota(project, pool, gpus=2, gpus_limit=3)
        for role, where in ((f.Role.DEPARTMENT_ADMIN, {"department": department}),
                            (f.Role.RESEARCHER, {"project": project})):  # fmt: skip
            user = f.make_user(f"extra-{role[:4]}-{i}")
            services.membership_add(actor=actor, user=user, role=role, **where)


@pytest.mark.parametrize("url", PAGES)
def test_a_list_page_makes_as_many_queries_for_many_rows_as_for_a_few(client_as, org, url):
    client = client_as(org.platform_admin)
    add_rows(org, 0, 1)  # an empty audit page skips its row query: start with one of each
    client.get(url)  # warm the session and content-type caches
    few = queries(client, url)
    add_rows(org, 1, 6)
    assert queries(client, url) == few
