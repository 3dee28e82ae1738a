"""Where a workspace may land: only where its process really runs, unless the user picks a
simulated pool. The demo's trap: a CPU notebook on "Any node pool" went to the simulated
cluster, where nothing runs, and "Open JupyterLab" never appeared."""

from __future__ import annotations

import sys
from decimal import Decimal

import pytest

from clusters.models import Backend, Cluster, Node, NodePool
from portal.errors import ValidationFailed
from scheduling.models import Workload
from scheduling.tasks import run_cycle
from tests import factories as f
from workspaces.forms import LaunchForm
from workspaces.models import Environment
from workspaces.services import LaunchRequest, workspace_launch

pytestmark = pytest.mark.django_db


@pytest.fixture
def jupyterlab(db):
    return Environment.objects.create(
        name="JupyterLab",
        image="quay.io/jupyter/minimal-notebook",
        command=[sys.executable, "-m", "jupyter", "lab"],
    )


def _cluster(name: str, backend: str, pool: NodePool, nodes: int = 1) -> Cluster:
    cluster = Cluster.objects.create(name=name, backend=backend)
    pool.cluster = cluster
    pool.save(update_fields=["cluster"])
    for index in range(nodes):
        Node.objects.create(
            cluster=cluster, name=f"{name}-{index}", pool=pool, cpu_cores=64, memory_mib=262144
        )
    return cluster


@pytest.fixture
def demo_like(org):
    """A big simulated cluster in pool a100 (the org's quota pool) and this machine in
    pool local, like `make demo`."""
    _cluster("sim", Backend.SIMULATED, org.pool, nodes=4)
    local = f.make_pool("local")
    f.make_department_quota(org.dept_a, local, gpus=0)
    _cluster("local", Backend.LOCAL, local)
    return local


def _launch(org, jupyterlab, **extra) -> Workload:
    request = LaunchRequest(name="nb", environment=jupyterlab, **extra)
    return workspace_launch(actor=org.researcher, project=org.project_a, request=request).workload


def test_any_node_pool_means_pools_that_run_real_processes(org, jupyterlab, demo_like):
    workload = _launch(org, jupyterlab)
    assert workload.node_pools == ["local"]
    assert workload.env["WORKSPACE_BIND_HOST"] == "127.0.0.1"  # only the local backend


def test_the_cycle_places_a_cpu_workspace_on_the_local_node_not_the_emptier_simulated_ones(
    org, jupyterlab, demo_like
):
    workload = _launch(org, jupyterlab, cpu=Decimal("1"), memory_mib=2048)
    run_cycle()
    workload.refresh_from_db()
    assert workload.state == "admitted", workload.pending_reason
    assert list(workload.allocations.values_list("node__name", flat=True)) == ["local-0"]


def test_a_simulated_pool_the_user_picks_is_honoured(org, jupyterlab, demo_like):
    workload = _launch(org, jupyterlab, node_pool=org.pool)
    assert workload.node_pools == ["a100"]


def test_with_only_simulated_pools_the_launch_asks_for_an_explicit_pool(org, jupyterlab):
    _cluster("sim", Backend.SIMULATED, org.pool)
    with pytest.raises(ValidationFailed) as caught:
        _launch(org, jupyterlab)
    assert "only simulated ones" in caught.value.errors["node_pool"][0]
    assert not Workload.objects.exists()
    assert _launch(org, jupyterlab, node_pool=org.pool).node_pools == ["a100"]


def test_a_pool_of_a_disabled_cluster_is_not_offered_as_real(org, jupyterlab, demo_like):
    Cluster.objects.filter(name="local").update(enabled=False)
    with pytest.raises(ValidationFailed):
        _launch(org, jupyterlab)


def test_the_form_labels_simulated_pools_and_shows_the_refusal_on_the_pool(
    client_as, org, jupyterlab
):
    _cluster("sim", Backend.SIMULATED, org.pool)
    form = LaunchForm(projects=org.project_a.department.projects.all())
    labels = [label for _, label in form.fields["node_pool"].choices]
    assert labels == ["Any node pool that runs real processes", "a100 (simulated: no process runs)"]
    response = client_as(org.researcher).post(
        "/workspaces/new/",
        {"project": org.project_a.pk, "environment": jupyterlab.pk, "name": "nb",
         "gpu_request": "whole", "gpus": "0", "gpu_memory_gib": "0", "cpu": "1",
         "memory_gib": "2", "env": ""},
    )  # fmt: skip
    assert response.status_code == 200
    assert "only simulated ones" in " ".join(response.context["form"].errors["node_pool"])


def test_a_data_volume_must_be_a_directory_or_a_pvc_name(org, jupyterlab):
    with pytest.raises(ValidationFailed) as caught:
        _launch(org, jupyterlab, data_volume="My Notebooks")
    assert list(caught.value.errors) == ["data_volume"]
    workload = _launch(org, jupyterlab, data_volume="rita-notebooks")
    assert workload.spec["volumes"] == [
        {"name": "data", "claim": "rita-notebooks", "mount_path": "/data"}
    ]
    assert "--ServerApp.root_dir=/data" in workload.command


def test_a_data_volume_must_suit_the_backend_the_workspace_lands_on(
    org, jupyterlab, demo_like, tmp_path
):
    """On the local backend a directory that exists; on Kubernetes a PVC: said at launch,
    not by a workspace that fails to start later."""

    def refusal(**extra) -> str:
        with pytest.raises(ValidationFailed) as caught:
            _launch(org, jupyterlab, **extra)
        assert list(caught.value.errors) == ["data_volume"]
        return caught.value.errors["data_volume"][0]

    # "Any node pool" here is the local pool (the other one is simulated).
    assert "needs a Kubernetes node pool" in refusal(data_volume="rita-notebooks")
    assert "no directory /nowhere/at-all" in refusal(data_volume="/nowhere/at-all")
    # A directory only under the roots the administrator gave the local cluster.
    assert "not under a data-volume root" in refusal(data_volume=str(tmp_path))
    Cluster.objects.filter(name="local").update(data_volume_roots=[str(tmp_path)])
    workload = _launch(org, jupyterlab, data_volume=str(tmp_path))
    assert f"--ServerApp.root_dir={tmp_path}" in workload.command

    kube_pool = f.make_pool("kube")
    _cluster("kube", Backend.KUBERNETES, kube_pool)
    assert "for the local backend" in refusal(data_volume=str(tmp_path), node_pool=kube_pool)
