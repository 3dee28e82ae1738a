"""A workspace on Kubernetes (the fake API server): its data volume, a PVC, is mounted at
the notebook directory, and JupyterLab listens where the Service reaches it."""

from __future__ import annotations

import pytest

from clusters.reconcile import cluster_reconcile
from scheduling.tasks import run_cycle
from tests.clusters.kube import k8s_name, kube  # noqa: F401 - the fixture
from workspaces.models import Environment
from workspaces.selectors import workspace_upstream
from workspaces.services import LaunchRequest, workspace_launch

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]


def test_a_launched_workspace_mounts_its_pvc_at_the_notebook_directory(kube, org):  # noqa: F811
    fake = kube.require_fake()
    cluster = kube.cluster()
    kube.nodes(cluster)  # pool a100 is now this cluster's: a pool that runs real processes
    lab = Environment.objects.create(
        name="Lab", image="jupyter/minimal", command=["jupyter", "lab"]
    )
    workspace = workspace_launch(
        actor=org.researcher,
        project=org.project_a,
        request=LaunchRequest(name="nb", environment=lab, data_volume="rita-notebooks"),
    )
    workload = workspace.workload
    assert workload.node_pools == ["a100"]
    run_cycle()
    cluster_reconcile(cluster)
    name = k8s_name(cluster, f"gp-{workload.pk}-0")
    pod = fake.pod("gp-ml-vision", name)
    assert pod is not None, workload.pending_reason
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert spec["volumes"] == [
        {
            "name": "data",
            "persistentVolumeClaim": {"claimName": "rita-notebooks", "readOnly": False},
        }
    ]
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data", "readOnly": False}]
    assert "--ServerApp.root_dir=/data" in container["command"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["WORKSPACE_BIND_HOST"] == "0.0.0.0"  # the Service must reach the pod
    # $(GPUPOOL_PORT) in the command is expanded by the kubelet from the pod's environment.
    assert "--ServerApp.port=$(GPUPOOL_PORT)" in container["command"]
    assert (env["GPUPOOL_PORT"], env["GPUPOOL_PORT_HTTP"]) == ("8888", "8888")
    workload.refresh_from_db()
    assert workload.allocations.get().endpoint == f"{name}.gp-ml-vision.svc:8888"
    # Before an endpoint is recorded the proxy falls back to the Service's DNS name: the
    # same name, with this installation's and cluster record's identities.
    workload.allocations.update(endpoint="")
    assert workspace_upstream(workspace) == f"{name}.gp-ml-vision.svc:8888"
