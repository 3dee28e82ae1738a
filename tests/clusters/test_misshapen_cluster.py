"""A Cluster row of the wrong shape (issue 27, bad rows): `config` that is no object or holds
a key of the wrong kind, `topology_labels` that are no list of names, as another database
writer could leave them. That cluster's reconcile and inventory sync skip it, marking it
unreachable with the reason (shown on the clusters page, so the cycle places nothing there);
the other cluster is reconciled and synced; pages and a researcher's submit answer."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.urls import reverse
from django.utils.html import escape

from clusters.backends.simulated import description_parse
from clusters.inventory import inventory_sync
from clusters.models import Backend, Cluster, Node
from clusters.tasks import reconcile_cluster, sync_inventory
from clusters.webhook import _context
from scheduling.isolation import pools_without_isolation
from tests.clusters.conftest import make_cluster
from tests.clusters.test_reconcile_targeted import sim  # noqa: F401 - the fixture
from tests.planted import plant_text

pytestmark = pytest.mark.django_db(transaction=True)

GROUPS = {"groups": [{"prefix": "spare", "count": 2, "gpus": 4}]}

# column -> (a value as JSON, what the reason says); a top-level shape PostgreSQL's CHECK
# refuses (clusters 0015) is planted on SQLite only, as rows written before it hold it.
MISSHAPEN = {
    "config-list": ("config", ["groups"], "config is a list, not an object"),
    "config-text": ("config", "groups", "config is a text, not an object"),
    "topology-object": ("topology_labels", {"rack": 1}, "topology_labels is not a list of"),
    "topology-number": ("topology_labels", ["rack", 7], "topology_labels is not a list of"),
    "number-text": ("config", {**GROUPS, "stop_delay_s": "soon"}, "config.stop_delay_s is not"),
    "number-infinite": ("config", {**GROUPS, "stop_delay_s": 1e308 * 10}, "config.stop_delay"),
    "boolean-text": ("config", {**GROUPS, "mps": "no"}, "config.mps is a text, not a boolean"),
    "nodes-unreadable": ("config", {"groups": [{"count": "x"}]}, "config's nodes cannot be read"),
    "labels-numbers": ("config", {**GROUPS, "labels": {"a": 1}}, "config.labels is not an"),
}


def top_level(column: str, value: object) -> bool:
    """A value of the wrong JSON type for its column as a whole."""
    return not isinstance(value, dict if column == "config" else list)


def plant(cluster: Cluster, column: str, value: object) -> None:
    if top_level(column, value) and connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's CHECK refuses it")
    plant_text(cluster, **{column: json.dumps(value)})  # Infinity: Python's json writes it


@pytest.fixture
def broken(db):
    cluster = make_cluster(
        "broken", Backend.SIMULATED, config=description_parse(json.dumps(GROUPS))
    )
    inventory_sync(cluster)
    return cluster


@pytest.mark.parametrize("case", MISSHAPEN)
def test_that_cluster_is_skipped_saying_why_and_the_other_goes_on(
    sim,  # noqa: F811
    broken,
    org,
    client_as,
    case,
):
    column, value, reason = MISSHAPEN[case]
    if case == "number-infinite" and connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb holds no Infinity")
    plant(broken, column, value)
    Node.objects.filter(cluster=sim).delete()  # the good one's sync makes them again

    assert reconcile_cluster(broken.pk)["errors"] == [Cluster.objects.get(pk=broken.pk).last_error]
    assert sync_inventory(broken.pk) is None
    assert reconcile_cluster(sim.pk)["errors"] == []
    assert sync_inventory(sim.pk)["nodes"] == 8

    broken.refresh_from_db()
    assert not broken.reachable and reason in broken.last_error, broken.last_error
    assert broken.last_error.startswith("Its record cannot be read")
    assert Cluster.objects.get(pk=sim.pk).reachable
    page = client_as(org.platform_admin).get(reverse("cluster_list"))
    assert page.status_code == 200 and escape(reason) in page.content.decode()
    edit = client_as(org.platform_admin).get(reverse("cluster_edit", args=[broken.pk]))
    assert edit.status_code == 200
    assert client_as(org.platform_admin).get(reverse("node_list")).status_code == 200


@pytest.mark.parametrize("case", ["config-list", "number-text", "topology-number"])
def test_a_local_cluster_whose_record_cannot_be_read_isolates_no_one_and_breaks_no_submit(
    org, client_as, case
):
    column, value, reason = MISSHAPEN[case]
    if column == "config" and isinstance(value, dict):
        value = {key: item for key, item in value.items() if key != "groups"}
    local = make_cluster("here", Backend.LOCAL)
    Node.objects.create(cluster=local, name="here", pool=org.pool, cpu_cores=8)
    plant(local, column, value)
    local = Cluster.objects.get(pk=local.pk)

    assert not local.isolation.available and reason in local.isolation.reason
    assert not local.limits.available and reason in local.limits.reason
    assert reason in pools_without_isolation()[org.pool.name]
    page = client_as(org.platform_admin).get(reverse("cluster_list"))
    assert page.status_code == 200 and escape(reason) in page.content.decode()


def test_the_pod_webhook_answers_for_a_cluster_whose_config_is_no_object(org):
    cluster = make_cluster("kube", Backend.KUBERNETES)
    plant(cluster, "config", ["scheduler_name"])
    context = _context(Cluster.objects.get(pk=cluster.pk), org.project_a.namespace, "uid-1")
    assert context is not None and context.mps_root == ""
