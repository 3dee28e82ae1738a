"""REST endpoints for node agents: sample ingestion and the pods placed on their node.

Agents authenticate with a per-node token (`Authorization: Bearer <token>`), not a user
account, so a leaked token can only write samples for its own node.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.metrics.models import NodeToken
from clusters.metrics.services import node_token_check, samples_ingest
from clusters.models import Gpu
from portal.errors import ValidationFailed
from portal.tokens import BearerTokenAuthentication
from scheduling.models import PodAllocation


class NodeTokenAuthentication(BearerTokenAuthentication):
    keywords = (b"bearer", b"nodetoken")
    refused = "Unknown or revoked node token."

    def check(self, token: str) -> NodeToken | None:
        return node_token_check(token)


class HasNodeToken(BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, NodeToken)


class AgentView(APIView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [HasNodeToken]


class MetricsIngestView(AgentView):
    """POST {"samples": [...]} (or a bare list); node_id is always the token's node."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Any) -> Response:
        body = request.data
        samples = body.get("samples") if isinstance(body, dict) else body
        if not isinstance(samples, list):
            return Response({"samples": ["Send a list of samples."]}, status=400)
        node = request.auth.node
        for item in samples:
            if isinstance(item, dict):
                # An agent speaks for its own node only, whatever the sample claims.
                item["node_id"] = node.pk
                item.pop("node", None)
                item.pop("cluster", None)
        try:
            count = samples_ingest(samples, agent_node_id=node.pk)
        except ValidationFailed as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        return Response({"accepted": count}, status=status.HTTP_201_CREATED)


def agent_pods(node_id: int) -> list[dict[str, Any]]:
    """The pods placed on a node, and for a sharer the device whose MPS daemon its agent
    must run (clusters.agent.mps): while any allocation shares a GPU, it stays shared. `id`:
    the allocation's, which the agent names when it reports that daemon running
    (clusters/mps_report.py)."""
    rows = list(
        PodAllocation.objects.filter(node_id=node_id).values(
            "id", "workload_id", "pod_index", "backend_ref", "gpu_indices", "shared_gpu_index"
        )
    )
    devices = dict(
        Gpu.objects.filter(node_id=node_id)
        .exclude(mps_device="")
        .values_list("index", "mps_device")
    )
    for row in rows:
        row["mps_device"] = devices.get(row["shared_gpu_index"], "")
    return rows


class AgentPodsView(AgentView):
    """The pods placed on the agent's node, so it can map processes to workloads and run
    the MPS daemons of its shared GPUs."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Any) -> Response:
        node = request.auth.node
        return Response({"node": node.name, "pods": agent_pods(node.pk)})
