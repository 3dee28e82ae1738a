"""The agent against the real portal: NVML stand-in -> HTTP -> ingestion -> database."""

from __future__ import annotations

import time

import pytest

from clusters.agent.main import Agent, main
from clusters.agent.nvml import Sampler
from clusters.agent.shipper import Shipper
from clusters.metrics.models import GpuProcessSample, GpuSample
from clusters.metrics.services import node_token_issue
from tests import factories as f
from tests.metrics.fake_nvml import FakeNvml
from tests.metrics.helpers import T0, allocate, make_node, make_workload


@pytest.mark.django_db(transaction=True)
def test_the_agent_posts_readings_that_the_portal_stores_under_its_node(live_server):
    pool = f.make_pool("a100")
    node = make_node(pool)
    project = f.make_project(f.make_department("vision"), "ml-vision")
    work = make_workload(project, f.make_user("rita"))
    allocation = allocate(work, node, [0], at=T0)
    allocation.backend_ref = "4242:1234.5"  # the local backend: "<pid>:<start time>"
    allocation.save()
    _, token = node_token_issue(actor=None, node=node)

    agent = Agent(Sampler(FakeNvml()), Shipper(live_server.url, token), sleep=lambda s: None)
    agent.run(ticks=2)

    rows = list(GpuSample.objects.order_by("ts", "gpu_index").values_list(
        "node_id", "gpu_index", "util_pct", "mem_used_mib", "power_w", "workload_id"
    ))  # fmt: skip
    assert rows[:2] == [
        (node.pk, 0, 97.0, 58368, 312.456, work.pk),
        (node.pk, 1, 0.0, 4, 61.027, None),
    ]
    assert len(rows) == 4
    process = GpuProcessSample.objects.first()
    assert (process.pid, process.used_mib, process.workload_id) == (4242, 57344, work.pk)


@pytest.mark.django_db
def test_in_direct_mode_the_agent_writes_to_the_database_as_its_node(capsys):
    pool = f.make_pool("a100")
    node = make_node(pool, name="local")
    code = main(["--direct", "sim/local", "--ticks", "2", "--interval", "0"], nvml=FakeNvml())
    assert code == 0
    assert sorted(GpuSample.objects.values_list("node_id", "gpu_index", "util_pct")) == [
        (node.pk, 0, 97.0), (node.pk, 0, 97.0), (node.pk, 1, 0.0), (node.pk, 1, 0.0)
    ]  # fmt: skip


@pytest.mark.django_db
def test_direct_mode_refuses_a_node_the_portal_does_not_know():
    with pytest.raises(SystemExit, match="no single node called 'sim/ghost'"):
        main(["--direct", "sim/ghost", "--ticks", "1"], nvml=FakeNvml())


@pytest.mark.django_db(transaction=True)
def test_a_sample_the_portal_refuses_is_dropped_alone_and_the_reason_logged(live_server, caplog):
    node = make_node(f.make_pool("a100"))
    _, token = node_token_issue(actor=None, node=node)
    now = time.time()
    good = {"gpu_index": 0, "util_pct": 5.0, "mem_used_mib": 1, "mem_total_mib": 2}
    shipper = Shipper(live_server.url, token)
    shipper.add([{**good, "ts": now}, {**good, "ts": now + 86_400}, {**good, "ts": now + 1}])

    assert shipper.flush() is True
    assert (shipper.sent, shipper.rejected, len(shipper.buffer)) == (2, 1, 0)
    assert GpuSample.objects.filter(node_id=node.pk).count() == 2
    assert "is in the future; check the node's clock" in caplog.text
