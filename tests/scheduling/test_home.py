"""The overview as a researcher's home: their own work and projects, launch buttons,
GPU-hours this month, a fragment that refreshes; admins keep their organisation overview,
with the node pools whose guarantees pass their GPUs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.cycle import cycle_run
from tests import factories as f
from tests.scheduling.conftest import outgrown

pytestmark = pytest.mark.django_db


def work_names(response) -> list[str]:
    return [row["name"] for row in response.context["work"]]


def test_a_researcher_sees_their_running_and_waiting_work_with_gpus_and_reason(
    client_as, org, cluster, submit
):
    submit(org.researcher, org.project_a, "train-a", gpus=2)
    outgrown(submit, org.researcher, org.project_a, "too-big", gpus=16)
    cycle_run()
    response = client_as(org.researcher).get("/")
    rows = {row["name"]: row for row in response.context["work"]}
    assert (rows["train-a"]["state"], rows["train-a"]["gpus"]) == ("admitted", "2")
    assert rows["too-big"]["state"] == "pending"
    assert rows["too-big"]["pending_reason"] == "Needs 16 GPUs in pool a100; 6 are free"
    page = response.content.decode()
    assert "Needs 16 GPUs in pool a100; 6 are free" in page
    assert 'href="/workloads/new/training/"' in page and 'href="/workspaces/new/"' in page
    assert 'id="my-gpu-hours"' in page and 'data-src="/home/fragment/"' in page
    assert '<span class="muted">allocated</span>' in page  # each figure labelled (issue 28)


def test_a_researcher_sees_neither_colleagues_nor_other_projects_work(
    client_as, org, cluster, submit
):
    colleague = f.make_user("cole")
    f.make_membership(colleague, role=f.Role.RESEARCHER, project=org.project_a)
    submit(org.researcher, org.project_a, "mine")
    submit(colleague, org.project_a, "colleagues")
    submit(org.outsider, org.project_b, "outsiders")
    assert work_names(client_as(org.researcher).get("/")) == ["mine"]
    assert work_names(client_as(org.outsider).get("/")) == ["outsiders"]


def test_my_projects_are_the_ones_i_belong_to_with_quota_use_and_fair_share(
    client_as, org, cluster, submit
):
    submit(org.researcher, org.project_a, "train-a", gpus=3)
    cycle_run()
    rows = client_as(org.researcher).get("/").context["my_projects"]
    assert [r.project.name for r in rows] == ["ml-vision"]
    row = rows[0]
    assert (row.deserved, row.allocated, row.running, row.waiting) == (4.0, 3.0, 1, 0)
    assert row.fair_share >= 3.0
    assert [r.project.name for r in client_as(org.outsider).get("/").context["my_projects"]] == [
        "nlp"
    ]


def test_the_fragment_refreshes_the_same_work_and_projects(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "mine")
    response = client_as(org.researcher).get("/home/fragment/")
    page = response.content.decode()
    assert response.status_code == 200 and "<html" not in page
    assert 'id="my-work"' in page and "mine" in page and 'data-project="ml-vision"' in page


def test_the_home_page_costs_the_same_queries_for_two_or_twelve_workloads(
    client_as, org, cluster, submit
):
    client = client_as(org.researcher)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/").status_code == 200
        return len(captured)

    for n in range(2):
        submit(org.researcher, org.project_a, f"w{n}", gpus=1)
    cycle_run()
    few = queries()
    for n in range(2, 12):
        submit(org.researcher, org.project_a, f"w{n}", gpus=1)
    cycle_run()
    assert queries() == few


def test_admins_keep_their_overview_and_see_over_committed_pools(client_as, org, cluster):
    response = client_as(org.platform_admin).get("/")
    assert response.context["departments"] is not None
    # 8 GPUs in pool a100, 16 guaranteed to departments (8 each).
    over = response.context["over_committed"]
    assert [(c.pool.name, c.gpus, c.departments, c.shortfall) for c in over] == [("a100", 8, 16, 8)]
    page = response.content.decode()
    assert 'data-over-committed="a100"' in page
    assert "Pool a100 guarantees 16 GPUs but has 8." in page


def test_researchers_see_no_capacity_or_organisation(client_as, org, cluster):
    response = client_as(org.researcher).get("/")
    assert "over_committed" not in response.context
    assert "Over-committed" not in response.content.decode()


def test_a_pool_that_holds_its_guarantees_raises_no_warning(client_as, org):
    from tests.scheduling.conftest import make_nodes

    make_nodes(org.pool, 4, 4)  # 16 GPUs for 16 guaranteed
    response = client_as(org.platform_admin).get("/")
    assert response.context["over_committed"] == []
    page = client_as(org.platform_admin).get(f"/departments/{org.dept_a.pk}/").content.decode()
    assert 'data-pool="a100"' in page and "data-over-committed" not in page


@pytest.mark.parametrize(
    "url",
    [
        "/departments/",
        "/departments/{dept}/",
        "/departments/{dept}/quotas/",
        "/projects/{proj}/quotas/",
    ],
)
def test_each_page_where_quotas_are_set_warns_of_over_commitment(client_as, org, cluster, url):
    url = url.format(dept=org.dept_a.pk, proj=org.project_a.pk)
    page = client_as(org.platform_admin).get(url).content.decode()
    assert 'id="pool-capacity"' in page
    assert "Pool a100 guarantees 16 GPUs but has 8." in page


def test_work_on_a_simulated_cluster_carries_the_badge(client_as, org, cluster, submit):
    submit(org.researcher, org.project_a, "sim-run", gpus=1)
    cycle_run()
    response = client_as(org.researcher).get("/")
    assert response.context["work"][0]["simulated"] is True
    assert "badge-simulated" in response.content.decode()


def test_the_capacity_table_costs_four_queries_whatever_the_pools(org, cluster):
    from portal.selectors import pool_capacity

    with CaptureQueriesContext(connection) as one:
        assert len(pool_capacity()) == 1
    for n in range(4):
        pool = f.make_pool(f"extra-{n}")
        f.make_department_quota(org.dept_a, pool, gpus=1)
    with CaptureQueriesContext(connection) as five:
        capacity = pool_capacity()
    assert len(one) == len(five) == 4
    assert [(c.pool.name, c.gpus, c.departments) for c in capacity][:2] == [
        ("a100", 8, 16),
        ("extra-0", 0, 1),
    ]
