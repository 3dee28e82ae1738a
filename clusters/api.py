"""REST endpoints of the clusters app: clusters and their health (platform admins), nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters import selectors, services
from clusters.metrics.api import AgentView
from clusters.mig import mig_report_store
from clusters.models import Backend, Cluster, Node
from clusters.mps_report import mps_report_store
from portal.api import call, valid
from portal.errors import ValidationFailed
from portal.permissions import is_platform_admin, visible_projects
from portal.selectors import project_named
from scheduling.bounds import MANIFEST_MAX_BYTES


class ClusterSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=63)
    backend = serializers.ChoiceField(choices=Backend.choices)
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True)
    node_pool_label = serializers.CharField(max_length=253, default="gpupool.io/node-pool")
    topology_labels = serializers.ListField(child=serializers.CharField(), default=list)
    description = serializers.CharField(write_only=True, required=False, allow_blank=True)
    publish_ports = serializers.ChoiceField(
        choices=["", "nodeport", "ingress"], required=False, source="config.publish_ports"
    )
    ingress_class = serializers.CharField(
        max_length=253, required=False, allow_blank=True, source="config.ingress_class"
    )
    ingress_domain = serializers.CharField(
        max_length=253, required=False, allow_blank=True, source="config.ingress_domain"
    )
    enabled = serializers.BooleanField(read_only=True)
    reachable = serializers.BooleanField(read_only=True)
    last_contact_at = serializers.DateTimeField(read_only=True)
    last_error = serializers.CharField(read_only=True)


def _platform_admin(request: Request) -> None:
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform administrators manage clusters.")


class ClusterListView(APIView):
    @extend_schema(responses=ClusterSerializer(many=True))
    def get(self, request: Request) -> Response:
        _platform_admin(request)
        return Response(ClusterSerializer(Cluster.objects.all(), many=True).data)

    @extend_schema(request=ClusterSerializer, responses={201: ClusterSerializer})
    def post(self, request: Request) -> Response:
        _platform_admin(request)
        data = valid(ClusterSerializer, request.data)
        publishing = data.pop("config", {})  # publish_ports, ingress_class, ingress_domain
        cluster = call(services.cluster_register, actor=request.user, **data, **publishing)
        return Response(ClusterSerializer(cluster).data, status=status.HTTP_201_CREATED)


class ClusterDetailView(APIView):
    @extend_schema(responses=ClusterSerializer)
    def get(self, request: Request, pk: int) -> Response:
        _platform_admin(request)
        return Response(ClusterSerializer(get_object_or_404(Cluster, pk=pk)).data)


class ClusterTestView(APIView):
    @extend_schema(
        request=None,
        responses=inline_serializer(
            "ConnectionTest",
            {"ok": serializers.BooleanField(), "message": serializers.CharField()},
        ),
    )
    def post(self, request: Request, pk: int) -> Response:
        _platform_admin(request)
        cluster = get_object_or_404(Cluster, pk=pk)
        ok, message = services.cluster_test_connection(actor=request.user, cluster=cluster)
        return Response({"ok": ok, "message": message})


def _gpu(gpu: selectors.GpuUse) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "model": gpu.model,
        "memory_mib": gpu.memory_mib,
        "whole": gpu.whole,
        "shares": [{**s, "share": str(s["share"])} for s in gpu.shares],
    }


class NodeFilters(serializers.Serializer):
    """An id is a positive 64-bit integer: past that it is a 400, not a database overflow."""

    cluster = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    pool = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)


NODE_ROWS = inline_serializer(
    "NodeRow",
    {
        "id": serializers.IntegerField(),
        "name": serializers.CharField(),
        "cluster": serializers.CharField(),
        "pool": serializers.CharField(allow_null=True),
        "topology": serializers.DictField(),
        "schedulable": serializers.BooleanField(),
        "unschedulable_reason": serializers.CharField(),
        "foreign": serializers.DictField(allow_null=True),
        "gpus": serializers.ListField(child=serializers.DictField()),
    },
    many=True,
)


class NodeListView(APIView):
    """Every node with its GPUs and their holders; unseen projects' workloads are masked."""

    @extend_schema(
        parameters=[NodeFilters],
        responses=NODE_ROWS,
    )
    def get(self, request: Request) -> Response:
        filters = valid(NodeFilters, request.query_params)
        rows = selectors.node_rows(
            request.user, cluster_id=filters.get("cluster"), pool_id=filters.get("pool")
        )
        return Response(
            [
                {
                    "id": row.node.pk,
                    "name": row.node.name,
                    "cluster": row.node.cluster.name,
                    "pool": row.node.pool.name if row.node.pool else None,
                    "topology": row.node.topology,
                    "schedulable": row.node.schedulable,
                    "unschedulable_reason": row.node.unschedulable_reason,
                    # Held by pods GPUPool did not bind: {gpus, cpu, memory_mib, pods,
                    # names, text}, or null.
                    "foreign": row.foreign,
                    "gpus": [_gpu(g) for g in row.gpus],
                }
                for row in rows
            ]
        )


class NodeReportView(AgentView):
    """What a node's agent reports of its node (Kubernetes), stored under the token's node
    only (`store`, which refuses a malformed report whole); `said`: what the answer says."""

    store: Callable[[Node, Any], dict[str, Any]]
    said: Callable[[dict[str, Any]], dict[str, Any]]

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        node = request.auth.node
        try:
            stored = type(self).store(node, request.data)
        except ValidationFailed as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        return Response({"node": node.name, **type(self).said(stored)})


class NodeMigReportView(NodeReportView):
    """Its MIG devices (clusters/agent/kubenode.py): {"layout", "mig_mode", "devices",
    "errors"}."""

    store = staticmethod(mig_report_store)
    said = staticmethod(lambda stored: {"layout": stored["layout"]})


class NodeMpsReportView(NodeReportView):
    """The MPS daemons it runs, and for which allocations (clusters/mps_report.py):
    {"running": {device: [allocation id, ...]}}."""

    store = staticmethod(mps_report_store)
    said = staticmethod(lambda stored: {"devices": len(stored["running"])})


class ManifestSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=63, help_text="Project name or id.")
    cluster = serializers.CharField(
        max_length=63,
        required=False,
        allow_blank=True,
        help_text="Kubernetes cluster name or id; needed when the project has quota on several.",
    )
    manifest = serializers.CharField(
        trim_whitespace=False,
        help_text=f"One object as YAML (or JSON), at most {MANIFEST_MAX_BYTES // 1024} KiB: "
        "a kind the platform allows (Pod, batch/v1 Job by default).",
    )


SUBMITTED = inline_serializer(
    "SubmittedManifest",
    {
        "api_version": serializers.CharField(),
        "kind": serializers.CharField(),
        "name": serializers.CharField(),
        "namespace": serializers.CharField(),
        "cluster": serializers.CharField(),
        "uid": serializers.CharField(),
        "message": serializers.CharField(),
    },
)


class ManifestSubmitView(APIView):
    @extend_schema(request=ManifestSerializer, responses={201: SUBMITTED})
    def post(self, request: Request) -> Response:
        """Create a Kubernetes object (a Pod, a Job) from its YAML in the project's
        namespace, with GPUPool's scheduler named; the next reconcile pass queues it as a
        workload. Every refusal is a 400 naming its field (project, cluster, manifest)."""
        # Imported here: it imports `kubernetes`, seconds of every process's start.
        from clusters.manifest_submit import (  # noqa: PLC0415
            manifest_cluster,
            manifest_submit,
            submitted_message,
        )

        data = valid(ManifestSerializer, request.data)
        project = project_named(visible_projects(request.user), data["project"]).first()
        if project is None:
            raise serializers.ValidationError(
                {"project": [f"No project {data['project']} that you can see."]}
            )
        chosen = call(manifest_cluster, value=data["cluster"]) if data.get("cluster") else None
        made = call(
            manifest_submit,
            actor=request.user,
            project=project,
            text=data["manifest"],
            cluster=chosen,
        )
        body = {**asdict(made), "message": submitted_message(made, project)}
        return Response(body, status=status.HTTP_201_CREATED)
