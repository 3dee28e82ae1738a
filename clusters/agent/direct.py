"""Direct mode: the agent on the portal's own machine (the local backend's collector).

Instead of posting over HTTP with a node token, it writes through samples_ingest in the
same database. Buffering and retries work as in HTTP mode: a database that is away keeps
samples in the buffer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, close_old_connections, connection

from clusters.agent.shipper import Shipper
from clusters.metrics.services import samples_ingest
from clusters.models import Node
from portal.errors import ValidationFailed
from scheduling.models import PodAllocation

log = logging.getLogger("gpupool.agent")


def node_id_for(name: str) -> int:
    """`cluster/node` or a node name that is unique across clusters."""
    cluster, _, node = name.rpartition("/")
    nodes = Node.objects.filter(name=node)
    if cluster:
        nodes = nodes.filter(cluster__name=cluster)
    found = list(nodes.values_list("id", flat=True)[:2])
    if len(found) != 1:
        raise SystemExit(f"gpupool agent: no single node called {name!r} in the portal")
    return found[0]


@dataclass
class DirectShipper(Shipper):
    node_id: int = 0

    def _post(self, batch: list[dict[str, Any]]) -> int | None:
        # A long-lived process must drop a connection the database closed (a restart), as
        # Django does around each request; never inside a transaction someone else holds.
        if not connection.in_atomic_block:
            close_old_connections()
        try:
            samples_ingest([{**s, "node_id": self.node_id} for s in batch])
        except ValidationFailed as exc:
            log.error("samples refused: %s", exc)
            return 400
        except DatabaseError as exc:
            log.warning("database unavailable (%s); %d samples buffered", exc, len(self.buffer))
            return None
        return 201

    def pods(self) -> list[dict[str, Any]] | None:
        try:
            return list(
                PodAllocation.objects.filter(node_id=self.node_id).values(
                    "workload_id", "pod_index", "backend_ref"
                )
            )
        except DatabaseError as exc:
            log.warning("could not read this node's pods: %s", exc)
            return None
