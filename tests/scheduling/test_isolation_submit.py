"""A researcher whose work a pool cannot isolate is told so when submitting (issue 27):
a local cluster that cannot sandbox pods runs only a platform admin's work, and a submit
naming only its pools was admitted and then failed a second later."""

from __future__ import annotations

import pytest

from clusters.backends.simulated import description_parse
from clusters.models import Backend, Cluster
from clusters.tasks import sync_inventory
from portal.errors import ValidationFailed
from scheduling.isolation import pools_without_isolation
from scheduling.models import Workload
from scheduling.services import workload_submit
from tests import factories as f

pytestmark = pytest.mark.django_db

JOB = {"image": "python", "command": ["true"], "gpus": 0}


@pytest.fixture
def unsandboxed(org):
    """This machine as a local cluster whose sandboxing is turned off, in pool `local`."""
    cluster = Cluster.objects.create(
        name="here", backend=Backend.LOCAL,
        config={"pool": "local", "node_name": "here", "sandbox": False},
    )  # fmt: skip
    sync_inventory(cluster.id)
    f.make_project_quota(org.project_a, f.make_pool("local"), gpus=0)
    return cluster


def test_the_pools_a_local_cluster_cannot_isolate_are_named_with_why(unsandboxed):
    assert pools_without_isolation() == {
        "local": "sandboxing is turned off in the cluster's configuration"
    }


def test_a_researcher_naming_only_such_a_pool_is_refused_on_node_pools(org, unsandboxed):
    with pytest.raises(ValidationFailed) as refused:
        workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                        name="j", node_pools=["local"], **JOB)  # fmt: skip
    (message,) = refused.value.errors["node_pools"]
    assert "without isolating tenants" in message and "sandboxing is turned off" in message
    assert not Workload.objects.exists()


@pytest.fixture
def simulated(org):
    """A simulated cluster (its pods are not this machine's processes) in pool a100."""
    cluster = Cluster.objects.create(
        name="sim", backend=Backend.SIMULATED,
        config=description_parse("groups: [{prefix: a100, count: 1, gpus: 4, "
                                 "labels: {gpupool.io/node-pool: a100}}]"),
    )  # fmt: skip
    sync_inventory(cluster.id)
    return cluster


def test_an_admin_and_work_that_may_run_elsewhere_are_queued(org, unsandboxed, simulated):
    workload_submit(actor=org.platform_admin, project=org.project_a, kind="training",
                    name="admins", node_pools=["local"], **JOB)  # fmt: skip
    workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                    name="either", node_pools=["local", "a100"], **JOB)  # fmt: skip
    workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                    name="anywhere", **JOB)  # fmt: skip
    assert Workload.objects.count() == 3


def test_work_naming_no_pool_is_kept_to_the_pools_that_isolate_it(org, unsandboxed, simulated):
    # The scheduler tries every pool for work that names none: a researcher's would have
    # been placed on `local` and failed at its start.
    mine = workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                           name="anywhere", **JOB)  # fmt: skip
    assert mine.node_pools == ["a100"]
    admins = workload_submit(actor=org.platform_admin, project=org.project_a, kind="training",
                             name="admins", **JOB)  # fmt: skip
    assert admins.node_pools == []  # an admin's work may run unsandboxed


def test_work_naming_no_pool_is_refused_where_no_pool_isolates_it(org, unsandboxed):
    with pytest.raises(ValidationFailed) as refused:
        workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                        name="anywhere", **JOB)  # fmt: skip
    (message,) = refused.value.errors["node_pools"]
    assert "local: sandboxing is turned off" in message
    assert not Workload.objects.exists()


def test_without_unsafe_pools_work_naming_none_may_use_any(org, simulated):
    mine = workload_submit(actor=org.researcher, project=org.project_a, kind="training",
                           name="anywhere", **JOB)  # fmt: skip
    assert mine.node_pools == []  # pools added later are used too


def test_the_api_answers_400_naming_node_pools(client, org, unsandboxed):
    client.force_login(org.researcher)
    answer = client.post(
        "/api/v1/workloads/",
        {"project": "ml-vision", "kind": "training", "name": "j", "node_pools": ["local"], **JOB},
        content_type="application/json",
    )
    assert answer.status_code == 400 and "without isolating" in answer.json()["node_pools"][0]
