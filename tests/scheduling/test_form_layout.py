"""The sectioned launch form: the platform's choices instead of free text, fields that do
not apply explained or left out, each project's policy limits beside the fields."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import Backend, Cluster, Gpu, Node, NodePool
from scheduling.models import Workload, WorkloadPolicy
from tests import factories as f
from tests.scheduling.conftest import make_nodes
from workspaces.models import Environment

pytestmark = pytest.mark.django_db

BASE = {"image": "img", "gpu_request": "whole", "gpus": "1", "cpu": "1", "memory_mib": "100"}


def form_page(client, kind: str = "training"):
    return client.get(f"/workloads/new/{kind}/")


def test_the_form_comes_in_sections_with_advanced_fields_folded(client_as, org, cluster):
    response = form_page(client_as(org.researcher))
    sections = response.context["sections"]
    assert [s.title for s in sections] == [
        "General",
        "Environment",
        "Compute",
        "Data",
        "Ports and SSH",
        "Scheduling",
    ]
    by_title = {s.title: s for s in sections}
    assert [b.name for b in by_title["Environment"].advanced] == ["args", "env"]
    assert [b.name for b in by_title["Scheduling"].fields] == [
        "node_pools", "gpu_model", "priority_class", "max_runtime_s", "duration_s"
    ]  # fmt: skip
    assert [b.name for b in by_title["Compute"].advanced] == [
        "pids_max", "min_pods", "max_pods", "handles_resize"
    ]  # fmt: skip
    page = response.content.decode()
    assert page.count('<details class="advanced">') == 3  # folded: nothing filled in
    hpo = [s.title for s in form_page(client_as(org.researcher), "hpo").context["sections"]]
    assert hpo == ["General", "Environment", "Compute", "Sweep", "Ports and SSH", "Scheduling"]


def test_an_error_in_a_folded_field_unfolds_it(client_as, org, cluster):
    client = client_as(org.researcher)
    data = {**BASE, "project": org.project_a.pk, "name": "x", "topology_required": "on"}
    response = client.post("/workloads/new/training/", data)
    assert response.status_code == 200
    assert '<details class="advanced" open>' in response.content.decode()


def test_node_pools_and_gpu_models_are_the_inventorys(client_as, org, cluster):
    h100 = f.make_pool("h100")
    make_nodes(h100, 1, 2)
    Gpu.objects.filter(node__pool=h100).update(model="H100")
    NodePool.objects.create(name="future")
    form = form_page(client_as(org.researcher)).context["form"]
    assert form.fields["node_pools"].choices == [
        ("a100", "a100 (simulated)"),
        ("future", "future (no cluster yet)"),
        ("h100", "h100 (simulated)"),
    ]
    assert form.fields["gpu_model"].choices == [("A100", "A100"), ("H100", "H100")]


def test_ticked_pools_and_models_or_the_same_as_text_make_the_same_workload(
    client_as, org, cluster
):
    h100 = f.make_pool("h100")
    make_nodes(h100, 1, 4)
    Gpu.objects.filter(node__pool=h100).update(model="H100")
    client = client_as(org.researcher)
    ticked = {"node_pools": ["h100", "a100"], "gpu_model": ["A100", "H100"]}
    as_text = {"node_pools": "h100, a100", "gpu_model": "A100|H100"}
    for name, extra in (("ticked", ticked), ("text", as_text)):
        data = {**BASE, "project": org.project_a.pk, "name": name, **extra}
        assert client.post("/workloads/new/training/", data).status_code == 302
        wl = Workload.objects.get(name=name)
        assert (wl.node_pools, wl.gpu_model) == (["h100", "a100"], "A100|H100")


def test_an_unknown_pool_or_model_is_refused_on_its_field(client_as, org, cluster):
    data = {**BASE, "project": org.project_a.pk, "name": "x", "node_pools": "nowhere",
            "gpu_model": "K80"}  # fmt: skip
    errors = client_as(org.researcher).post("/workloads/new/training/", data).context["form"].errors
    assert errors["node_pools"] == ["No such node pool: nowhere."]
    assert errors["gpu_model"] == ["No GPU of model K80 in any cluster."]


def local_only(pool) -> Cluster:
    cluster = Cluster.objects.create(name="here", backend=Backend.LOCAL)
    Node.objects.create(cluster=cluster, name="box", pool=pool, cpu_cores=8, memory_mib=8192)
    return cluster


def test_without_a_simulated_cluster_there_is_no_duration_and_the_image_is_explained(
    client_as, org
):
    local_only(org.pool)
    response = form_page(client_as(org.researcher))
    assert "duration_s" not in response.context["form"].fields
    assert response.context["image_help"] == [
        "The local machine does not use the image: the command runs in this host's own "
        "environment (its Python and packages), in a sandbox."
    ]
    assert response.context["form"].fields["node_pools"].choices == [
        ("a100", "a100 (local machine)")
    ]


def test_with_a_simulated_cluster_the_duration_says_where_it_applies(client_as, org, cluster):
    local_only(f.make_pool("cpu"))
    response = form_page(client_as(org.researcher))
    assert "Only on simulated clusters" in response.context["form"].fields["duration_s"].help_text
    assert response.context["simulated_pools"] == ["a100"]
    assert response.context["real_pools"] == ["cpu"]
    assert len(response.context["image_help"]) == 2


def test_each_projects_policy_limits_sit_beside_their_fields(client_as, org, cluster):
    WorkloadPolicy.objects.create(project=org.project_a, max_gpus_per_workload=2, max_runtime_s=600)
    WorkloadPolicy.objects.create(department=org.dept_b, allowed_kinds=["inference"])
    admin_limits = form_page(client_as(org.platform_admin)).context["limits"]
    assert admin_limits[org.project_a.pk]["gpus"] == (
        "At most 2 GPUs per workload, all pods together (project ml-vision)."
    )
    assert admin_limits[org.project_a.pk]["max_runtime_s"] == (
        "Policy: at most 600 s (project ml-vision)."
    )
    assert admin_limits[org.project_b.pk]["project"].startswith("This kind is not allowed here")
    response = form_page(client_as(org.researcher))
    assert set(response.context["limits"]) == {org.project_a.pk}  # only where rita may submit
    assert "At most 2 GPUs per workload" in response.content.decode()


def test_the_form_costs_the_same_queries_for_three_or_nine_projects(client_as, org, cluster):
    client = client_as(org.platform_admin)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert form_page(client).status_code == 200
        return len(captured)

    few = queries()
    for n in range(6):
        project = f.make_project(org.dept_a, f"extra-{n}")
        WorkloadPolicy.objects.create(project=project, max_gpus_per_workload=1)
    assert queries() == few


def test_an_environment_fills_in_the_image_and_is_not_submitted(client_as, org, cluster):
    env = Environment.objects.create(name="torch", image="pytorch/pytorch:2.3", command=["x"])
    client = client_as(org.researcher)
    response = form_page(client)
    assert response.context["environment_images"] == {str(env.pk): "pytorch/pytorch:2.3"}
    data = {**BASE, "project": org.project_a.pk, "name": "e", "environment": str(env.pk)}
    assert client.post("/workloads/new/training/", data).status_code == 302
    assert Workload.objects.get(name="e").image == "img"
