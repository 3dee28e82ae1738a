"""A text in a node's or GPU's number (issue 27, bad rows; SQLite keeps one) is written
again by the next inventory sync, as the cluster reports it: the cycle keeps work off such
a node only until then (tests/scheduling/test_unreadable_inventory.py)."""

from __future__ import annotations

import pytest
from django.db import connection

from clusters.inventory import inventory_sync
from clusters.models import Gpu, Node
from tests.clusters.test_reconcile_targeted import sim  # noqa: F401 - the fixture
from tests.planted import plant_text

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL refuses the text")

NODE = ["cpu_cores", "memory_mib", "foreign_gpus", "foreign_cpu", "foreign_memory_mib"]


def gpus_of(node: Node) -> list[tuple[int, int]]:
    return list(Gpu.objects.filter(node=node).order_by("index").values_list("index", "memory_mib"))


@pytest.mark.parametrize("column", NODE)
def test_the_next_sync_writes_a_nodes_number_again(sim, column):  # noqa: F811
    node = Node.objects.get(name="node-0")
    stored = Node.objects.filter(pk=node.pk).values_list(column, flat=True)
    before = stored.get()
    assert plant_text(node, **{column: "abc"}) == ("text",)

    inventory_sync(sim)

    assert stored.get() == before


@pytest.mark.parametrize("column", ["index", "memory_mib"])
def test_the_next_sync_writes_a_gpus_number_again(sim, column):  # noqa: F811
    node = Node.objects.get(name="node-0")
    before = gpus_of(node)
    assert plant_text(Gpu.objects.get(node=node, index=1), **{column: "abc"}) == ("text",)

    inventory_sync(sim)

    assert gpus_of(node) == before
