"""The clusters REST API for each persona."""

from __future__ import annotations

import pytest

from clusters.metrics.services import node_token_issue
from clusters.models import Backend, Cluster, Node
from clusters.mps_report import mps_running_for
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.conftest import PERSONAS

SIMULATED = "nodes: [{name: n0, gpus: 2, labels: {gpupool.io/node-pool: a100}}]"


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_platform_admins_list_and_register_clusters(org, client_as, persona):
    make_cluster("loc", Backend.LOCAL)
    client = client_as(getattr(org, persona))
    listed = client.get("/api/v1/clusters/")
    created = client.post(
        "/api/v1/clusters/",
        {"name": "sim", "backend": "simulated", "description": SIMULATED},
        content_type="application/json",
    )
    if persona == "platform_admin":
        assert listed.status_code == 200 and listed.json()[0]["name"] == "loc"
        assert "kubeconfig" not in listed.json()[0]
        assert created.status_code == 201 and created.json()["backend"] == "simulated"
    else:
        assert (listed.status_code, created.status_code) == (403, 403)
        assert not Cluster.objects.filter(name="sim").exists()


def test_refused_input_is_a_400_on_the_field(org, client_as):
    response = client_as(org.platform_admin).post(
        "/api/v1/clusters/",
        {"name": "k", "backend": "kubernetes"},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json() == {"kubeconfig": ["A Kubernetes cluster needs a kubeconfig."]}


def test_test_connection_answers_ok_and_a_message(org, client_as):
    cluster = make_cluster("loc", Backend.LOCAL)
    response = client_as(org.platform_admin).post(f"/api/v1/clusters/{cluster.pk}/test/")
    assert response.status_code == 200
    assert response.json()["ok"] is True and "Local machine" in response.json()["message"]


@pytest.mark.parametrize("persona", PERSONAS)
def test_nodes_list_gpu_holders_masking_projects_the_caller_cannot_see(org, client_as, persona):
    cluster = make_cluster("sim", Backend.SIMULATED)
    node = make_node(cluster, "n1", gpus=2, pool=org.pool)
    admit(make_workload(org.project_a, org.researcher, "job"), node, pods=[{"gpu_indices": [1]}])
    response = client_as(getattr(org, persona)).get(f"/api/v1/nodes/?cluster={cluster.pk}")
    assert response.status_code == 200
    [row] = response.json()
    assert (row["name"], row["pool"], row["gpus"][0]["whole"]) == ("n1", "a100", None)
    holder = row["gpus"][1]["whole"]
    if persona == "outsider":
        assert holder["name"] == "another project" and holder["workload_id"] is None
    else:
        assert holder["name"] == "ml-vision/job"


def test_anonymous_callers_are_refused(client):
    assert client.get("/api/v1/nodes/").status_code in (401, 403)


def test_label_keys_that_kubernetes_would_refuse_are_a_400_on_their_field(org, client_as):
    response = client_as(org.platform_admin).post(
        "/api/v1/clusters/",
        {
            "name": "sim",
            "backend": "simulated",
            "description": SIMULATED,
            "node_pool_label": "gpupool.io/node pool",
            "topology_labels": ["topology.kubernetes.io/zone", "Rack_/x", "-rack"],
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == ["node_pool_label", "topology_labels"]
    assert "'gpupool.io/node pool' is not a label key" in errors["node_pool_label"][0]
    assert [e.split(" is not")[0] for e in errors["topology_labels"]] == ["'Rack_/x'", "'-rack'"]
    assert not Cluster.objects.filter(name="sim").exists()


# --- a node's agent reports its MIG devices (Kubernetes) ------------------------------------

REPORT = "/api/v1/nodes/mig-report"
GOOD = {
    "layout": "0123456789abcdef",
    "mig_mode": [6, 7],
    "devices": {"6": {"4": "MIG-0e5b2c3a-1f8d-5a4e-9b7c-6d2e1f0a3b4c"}},
    "errors": ["GPU 7: cannot create 1g.10gb at 0: Insufficient Resources"],
}


def _agent(node):
    _, token = node_token_issue(actor=None, node=node)
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_a_nodes_agent_stores_its_mig_report_under_its_own_node_only(db, client):
    cluster = make_cluster("k", Backend.KUBERNETES)
    mine, other = make_node(cluster, "gpu-m", gpus=8), make_node(cluster, "gpu-o", gpus=8)
    response = client.post(
        REPORT, {**GOOD, "node": "gpu-o"}, content_type="application/json", **_agent(mine)
    )
    assert response.status_code == 200
    assert response.json() == {"node": "gpu-m", "layout": GOOD["layout"]}
    mine.refresh_from_db()
    other.refresh_from_db()
    stored = {k: v for k, v in mine.mig_report.items() if k != "at"}
    assert stored == {**GOOD, "devices": {"6": {"4": GOOD["devices"]["6"]["4"]}}}
    assert other.mig_report == {}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"layout": "not-an-id"}, "layout"),
        ({"mig_mode": list(range(65))}, "mig_mode"),
        ({"mig_mode": ["6; drop"]}, "mig_mode"),
        ({"devices": {"6": {"8": "MIG-x"}}}, "devices.6"),
        ({"devices": {"6": {"0": "GPU-not-a-mig-device"}}}, "devices.6"),
        ({"devices": {"64": {}}}, "devices"),
        ({"errors": ["x"] * 17}, "errors"),
    ],
)
def test_a_malformed_mig_report_is_a_400_naming_its_field_and_changes_nothing(
    db, client, change, field
):
    node = make_node(make_cluster("k", Backend.KUBERNETES), "gpu-m", gpus=8)
    response = client.post(
        REPORT, {**GOOD, **change}, content_type="application/json", **_agent(node)
    )
    assert response.status_code == 400
    assert list(response.json()) == [field]
    node.refresh_from_db()
    assert node.mig_report == {}


@pytest.mark.parametrize("persona", [None, *PERSONAS])
@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/nodes/mig-report", GOOD, "mig_report"),
        ("/api/v1/nodes/mps-report", {"running": {"GPU-x": [1]}}, "mps_report"),
    ],
)
def test_only_a_node_token_may_report_its_node(org, client, client_as, persona, url, body, field):
    node = make_node(make_cluster("k", Backend.KUBERNETES), "gpu-m", gpus=8)
    who = client if persona is None else client_as(getattr(org, persona))
    response = who.post(url, body, content_type="application/json")
    assert response.status_code in (401, 403)
    node.refresh_from_db()
    assert getattr(node, field) == {}


# --- a node's agent reports the MPS daemons it runs (Kubernetes native sharers) ------------

MPS_REPORT = "/api/v1/nodes/mps-report"


def test_a_nodes_agent_stores_its_mps_report_under_its_own_node_only(db, client):
    cluster = make_cluster("k", Backend.KUBERNETES)
    mine, other = make_node(cluster, "gpu-m", gpus=8), make_node(cluster, "gpu-o", gpus=8)
    body = {"running": {"GPU-8f2c": [7, 3, 7]}, "node": "gpu-o"}
    response = client.post(MPS_REPORT, body, content_type="application/json", **_agent(mine))
    assert response.status_code == 200
    assert response.json() == {"node": "gpu-m", "devices": 1}
    mine.refresh_from_db()
    other.refresh_from_db()
    assert mine.mps_report["running"] == {"GPU-8f2c": [3, 7]}
    assert mps_running_for(mine.mps_report, 3) == ("GPU-8f2c",)
    assert mps_running_for(mine.mps_report, 4) == ()
    assert other.mps_report == {}
    # The next report replaces it: a daemon stopped is no longer said to run.
    client.post(MPS_REPORT, {"running": {}}, content_type="application/json", **_agent(mine))
    mine.refresh_from_db()
    assert mps_running_for(mine.mps_report, 3) == ()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"running": []},
        {"running": {"../etc": [1]}},
        {"running": {"GPU-x": [1, "2"]}},
        {"running": {"GPU-x": [0]}},
        {"running": {"GPU-x": [True]}},
        {"running": {"GPU-x": 1}},
        {"running": {f"GPU-{i}": [] for i in range(65)}},
    ],
)
def test_a_malformed_mps_report_is_a_400_and_changes_nothing(db, client, body):
    node = make_node(make_cluster("k", Backend.KUBERNETES), "gpu-m", gpus=8)
    response = client.post(MPS_REPORT, body, content_type="application/json", **_agent(node))
    assert response.status_code == 400
    assert list(response.json()) == ["running"]
    node.refresh_from_db()
    assert node.mps_report == {}


@pytest.mark.parametrize("stored", [[], "x", {"running": []}, {"running": {"GPU-x": "3"}}])
def test_a_stored_mps_report_of_another_shape_says_no_daemon_runs(stored):
    assert mps_running_for(stored, 3) == ()


@pytest.mark.parametrize("persona", PERSONAS)
def test_nodes_list_what_pods_gpupool_did_not_bind_hold(org, client_as, persona):
    cluster = make_cluster("kube", Backend.KUBERNETES)
    node = make_node(cluster, "gpu-a", gpus=8, pool=org.pool)
    make_node(cluster, "gpu-b", gpus=8, pool=org.pool)
    Node.objects.filter(pk=node.pk).update(
        foreign_gpus=1,
        foreign_cpu="0.5",
        foreign_memory_mib=512,
        foreign_pods={"count": 1, "names": ["default/debug"]},
    )
    rows = client_as(getattr(org, persona)).get(f"/api/v1/nodes/?cluster={cluster.pk}").json()
    admin = persona == "platform_admin"
    assert {row["name"]: row["foreign"] for row in rows} == {
        "gpu-a": {
            "gpus": 1,
            "cpu": 0.5,
            "memory_mib": 512,
            "pods": 1,
            "names": ["default/debug"] if admin else [],
            "text": "1 GPU, 0.5 CPU, 512 MiB used by 1 pod not scheduled by GPUPool"
            + (": default/debug" if admin else ""),
        },
        "gpu-b": None,
    }
