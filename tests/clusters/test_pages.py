"""Cluster pages for each persona, registration with its audit rows, and the nodes page."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.files.uploadedfile import SimpleUploadedFile

from clusters.models import Backend, Cluster, Node
from portal.models import AuditLog
from tests.clusters.conftest import admit, make_cluster, make_node, make_workload
from tests.conftest import PERSONAS

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: s3cret-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
SIMULATED = "groups: [{prefix: sim, count: 2, gpus: 4, labels: {gpupool.io/node-pool: a100}}]"
ADMIN_PAGES = ["/clusters/", "/clusters/new/"]


@pytest.mark.parametrize("persona", PERSONAS)
def test_cluster_pages_are_for_platform_admins_only(org, client_as, persona):
    cluster = make_cluster("sim", Backend.SIMULATED)
    client = client_as(getattr(org, persona))
    expected = 200 if persona == "platform_admin" else 403
    for url in [*ADMIN_PAGES, f"/clusters/{cluster.pk}/edit/"]:
        assert client.get(url).status_code == expected, url
    for url in (f"/clusters/{cluster.pk}/test/", f"/clusters/{cluster.pk}/sync/"):
        assert client.post(url).status_code == (302 if expected == 200 else 403)


def test_anonymous_visitors_are_sent_to_log_in(client):
    for url in [*ADMIN_PAGES, "/clusters/nodes/"]:
        response = client.get(url)
        assert response.status_code == 302 and "/login" in response["Location"]


def test_registering_a_simulated_cluster_syncs_its_nodes_and_audits_it(
    org, client_as, django_capture_on_commit_callbacks
):
    client = client_as(org.platform_admin)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/clusters/new/",
            {
                "name": "sim",
                "backend": "simulated",
                "node_pool_label": "gpupool.io/node-pool",
                "topology_labels": "gpupool.io/rack",
                "description": SIMULATED,
            },
        )
    assert response.status_code == 302
    cluster = Cluster.objects.get(name="sim")
    assert cluster.topology_labels == ["gpupool.io/rack"]
    assert sorted(Node.objects.filter(cluster=cluster).values_list("name", flat=True)) == [
        "sim-0",
        "sim-1",
    ]
    audit = AuditLog.objects.get(action="cluster.register")
    assert audit.actor == org.platform_admin and audit.after["backend"] == "simulated"
    page = client.get("/clusters/").content.decode()
    assert "sim" in page and "reachable" in page


def test_a_bad_description_is_shown_on_its_field(org, client_as):
    client = client_as(org.platform_admin)
    response = client.post(
        "/clusters/new/",
        {
            "name": "sim",
            "backend": "simulated",
            "description": "groups: []",
            "node_pool_label": "x",
        },
    )
    assert response.status_code == 200
    assert response.context["form"].errors["description"] == ["Describe at least one node."]
    assert not Cluster.objects.exists()


def test_a_topology_label_that_is_no_label_key_is_shown_on_its_field(org, client_as):
    response = client_as(org.platform_admin).post(
        "/clusters/new/",
        {
            "name": "sim",
            "backend": "simulated",
            "description": "nodes: [{name: n0}]",
            "node_pool_label": "gpupool.io/node-pool",
            "topology_labels": "topology.kubernetes.io/zone, rack number",
        },
    )
    assert response.status_code == 200
    [error] = response.context["form"].errors["topology_labels"]
    assert error.startswith("'rack number' is not a label key")
    assert not Cluster.objects.exists()


def test_kubernetes_registration_is_refused_without_the_encryption_key(org, client_as, settings):
    settings.GPUPOOL_KUBECONFIG_KEY = ""
    client = client_as(org.platform_admin)
    upload = SimpleUploadedFile("config", KUBECONFIG.encode())
    response = client.post(
        "/clusters/new/",
        {
            "name": "prod",
            "backend": "kubernetes",
            "kubeconfig": upload,
            "node_pool_label": "gpupool.io/node-pool",
        },
    )
    assert response.status_code == 200
    assert "GPUPOOL_KUBECONFIG_KEY is not set" in response.context["form"].errors["kubeconfig"][0]
    assert not Cluster.objects.exists()


def test_a_kubeconfig_is_stored_encrypted_and_never_shown_or_audited(
    org, client_as, settings, django_capture_on_commit_callbacks
):
    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()
    client = client_as(org.platform_admin)
    upload = SimpleUploadedFile("config", KUBECONFIG.encode())
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/clusters/new/",
            {
                "name": "prod",
                "backend": "kubernetes",
                "kubeconfig": upload,
                "node_pool_label": "gpupool.io/node-pool",
            },
        )
    assert response.status_code == 302
    cluster = Cluster.objects.get(name="prod")
    assert "s3cret-token" not in cluster.kubeconfig_encrypted
    edit = client.get(f"/clusters/{cluster.pk}/edit/").content.decode()
    assert "s3cret-token" not in edit and "A kubeconfig is stored" in edit
    assert "s3cret" not in str(list(AuditLog.objects.values("before", "after")))
    # The sync after registration could not reach 10.0.0.1: the cluster says so.
    cluster.refresh_from_db()
    assert cluster.reachable is False and cluster.last_error


def test_editing_a_cluster_keeps_its_kubeconfig_and_audits_before_and_after(org, client_as):
    cluster = make_cluster("loc", Backend.LOCAL)
    client = client_as(org.platform_admin)
    response = client.post(
        f"/clusters/{cluster.pk}/edit/",
        {"name": "loc", "node_pool_label": "pool", "topology_labels": "zone", "enabled": ""},
    )
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert (cluster.node_pool_label, cluster.topology_labels, cluster.enabled) == (
        "pool",
        ["zone"],
        False,
    )
    audit = AuditLog.objects.get(action="cluster.update")
    assert audit.before["enabled"] is True and audit.after["enabled"] is False


def test_test_connection_reports_success_and_failure(org, client_as, settings):
    client = client_as(org.platform_admin)
    local = make_cluster("loc", Backend.LOCAL)
    response = client.post(f"/clusters/{local.pk}/test/", follow=True)
    assert "Local machine" in response.content.decode()
    settings.GPUPOOL_KUBECONFIG_KEY = Fernet.generate_key().decode()
    broken = make_cluster("k", Backend.KUBERNETES, kubeconfig_encrypted="not-a-token")
    response = client.post(f"/clusters/{broken.pk}/test/", follow=True)
    assert "cannot be reached" in response.content.decode()
    broken.refresh_from_db()
    assert broken.reachable is False


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_nodes_page_shows_gpu_holders_and_hides_names_of_unseen_projects(
    org, client_as, persona
):
    cluster = make_cluster("sim", Backend.SIMULATED)
    node = make_node(cluster, "n1", gpus=4, pool=org.pool)
    whole = make_workload(org.project_a, org.researcher, "whole-job")
    half = make_workload(org.project_b, org.outsider, "half-job")
    admit(whole, node, pods=[{"gpu_indices": [0, 1]}])
    admit(half, node, pods=[{"shared_gpu_index": 2, "gpu_share": 0.5}])
    page = client_as(getattr(org, persona)).get(f"/clusters/nodes/?cluster={cluster.pk}")
    assert page.status_code == 200
    text = page.content.decode()
    assert "3 of 4 GPUs in use" in text
    sees_a = persona in ("platform_admin", "dept_admin", "researcher")
    sees_b = persona in ("platform_admin", "outsider")
    assert ("ml-vision/whole-job" in text) is sees_a
    assert ("nlp/half-job" in text) is sees_b
    assert "another project" in text or (sees_a and sees_b)
    assert "\u00d70.5" in text  # the multiplication sign


def test_the_nodes_page_says_why_a_node_takes_no_new_pods(org, client_as):
    cluster = make_cluster("sim", Backend.SIMULATED)
    make_node(cluster, "n1", gpus=1, pool=org.pool)
    Node.objects.filter(name="n1").update(schedulable=False, unschedulable_reason="NotReady")
    text = client_as(org.researcher).get("/clusters/nodes/").content.decode()
    assert '<div class="muted">NotReady</div>' in text


def test_a_second_local_cluster_is_refused(org, client_as):
    make_cluster("here", Backend.LOCAL)
    response = client_as(org.platform_admin).post(
        "/clusters/new/", {"name": "again", "backend": "local", "node_pool_label": "p"}
    )
    assert response.context["form"].errors["backend"] == [
        "This machine is registered already: here."
    ]


def test_a_manual_sync_is_audited_with_its_counts(org, client_as):
    from clusters.backends.simulated import description_parse

    cluster = make_cluster("sim", Backend.SIMULATED, config=description_parse(SIMULATED))
    client_as(org.platform_admin).post(f"/clusters/{cluster.pk}/sync/")
    audit = AuditLog.objects.get(action="cluster.sync_inventory")
    assert audit.after == {"nodes": 2, "gpus": 8, "vanished": 0}
    assert audit.actor == org.platform_admin


def test_the_nodes_page_shows_node_and_gpu_memory_in_gib_not_as_bytes(org, client_as):
    cluster = make_cluster("sim", Backend.SIMULATED)
    node = make_node(cluster, "dgx-0", gpus=1, pool=org.pool)  # GPUs of 81920 MiB
    Node.objects.filter(pk=node.pk).update(memory_mib=1024 * 1024)
    Node.objects.filter(pk=make_node(cluster, "small").pk).update(memory_mib=24064)
    frac = make_workload(org.project_a, org.researcher, "mem-share")
    admit(frac, node, pods=[{"shared_gpu_index": 0, "gpu_share": 0.25}])
    frac.allocations.update(gpu_memory_mib=20480)
    text = client_as(org.platform_admin).get(f"/clusters/nodes/?cluster={cluster.pk}")
    text = text.content.decode()
    assert "8 CPUs, 1 TiB" in text and "8 CPUs, 23.5 GiB" in text
    assert "A100, 80 GiB" in text and "(20 GiB)" in text
    # Held by one sharer, a quarter of the device: said so, not "shared (0.25 used)".
    assert "shared by 1, 25 % of it held:" in text
    assert " MB<" not in text and " KB<" not in text


@pytest.mark.parametrize(
    ("mib", "shown"),
    [(512, "512 MiB"), (1024, "1 GiB"), (24064, "23.5 GiB"), (81920, "80 GiB"),
     (1048576, "1 TiB"), (1572864, "1.5 TiB"), (0, "0 MiB"), (None, ""), ("x", "")],
)  # fmt: skip
def test_the_mib_filter_picks_the_unit_a_person_reads(mib, shown):
    from clusters.templatetags.clusters_units import mib as mib_filter

    assert mib_filter(mib) == shown


FOREIGN = {
    "foreign_gpus": 2,
    "foreign_cpu": 4,
    "foreign_memory_mib": 16384,
    "foreign_pods": {
        "count": 3,
        "names": ["kube-system/dcgm-exporter-x", "default/train-x", "other/theirs"],
    },
}


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_nodes_page_shows_what_pods_gpupool_did_not_bind_hold(org, client_as, persona):
    cluster = make_cluster("kube", Backend.KUBERNETES)
    node = make_node(cluster, "gpu-a", gpus=8, pool=org.pool)
    Node.objects.filter(pk=node.pk).update(**FOREIGN)
    admit(make_workload(org.project_a, org.researcher, "job"), node, pods=[{"gpu_indices": [0]}])
    text = client_as(getattr(org, persona)).get("/clusters/nodes/").content.decode()
    said = "2 GPUs, 4 CPU, 16 GiB used by 3 pods not scheduled by GPUPool"
    # Other tenants' pod names are for platform admins; everyone sees what they hold.
    names = ": kube-system/dcgm-exporter-x, default/train-x, other/theirs</div>"
    assert (said + names in text) == (persona == "platform_admin")
    assert said in text
    assert "3 of 8 GPUs in use" in text
