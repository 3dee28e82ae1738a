"""REST API of workspaces: list, launch, look at one, keep it running. Never the token."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import NodePool
from portal.api import bounded_decimal, bounded_integer
from portal.errors import ValidationFailed
from portal.models import Project
from scheduling import bounds
from scheduling.models import GpuRequestKind
from workspaces import selectors, services
from workspaces.models import Environment, Workspace


class EnvironmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Environment
        fields = ["id", "name", "description", "image", "tool_kind", "port", "default_gpus",
                  "default_cpu", "default_memory_mib"]  # fmt: skip


class WorkspaceSerializer(serializers.ModelSerializer):
    id = serializers.IntegerField(source="workload_id")
    name = serializers.CharField(source="workload.name")
    project = serializers.CharField(source="workload.project.name")
    owner = serializers.CharField(source="workload.submitted_by.username")
    state = serializers.CharField(source="workload.state")
    pending_reason = serializers.CharField(source="workload.pending_reason")
    environment = serializers.CharField(source="environment.name", default=None)
    url = serializers.CharField(source="lab_url")

    class Meta:
        model = Workspace
        fields = ["id", "name", "project", "owner", "state", "pending_reason", "environment",
                  "url", "shared_with_project", "data_volume", "idle_state", "warned_at",
                  "last_activity_at", "kept_alive_at"]  # fmt: skip


class LaunchSerializer(serializers.Serializer):
    project = serializers.SlugRelatedField(slug_field="name", queryset=Project.objects.all())
    environment = serializers.SlugRelatedField(
        slug_field="name", queryset=Environment.objects.filter(enabled=True)
    )
    name = serializers.CharField(max_length=63)
    gpu_request = serializers.ChoiceField(GpuRequestKind.choices, default=GpuRequestKind.WHOLE)
    gpus = bounded_decimal(bounds.GPUS, default=0)
    gpu_memory_mib = bounded_integer(bounds.GPU_MEMORY_MIB, default=0)
    cpu = bounded_decimal(bounds.CPU, default=1)
    memory_mib = bounded_integer(bounds.MEMORY_MIB, default=4096)
    node_pool = serializers.SlugRelatedField(
        slug_field="name", queryset=NodePool.objects.all(), required=False, allow_null=True
    )
    data_volume = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500
    )
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), default=dict)
    shared_with_project = serializers.BooleanField(default=False)
    ports = serializers.ListField(
        child=serializers.DictField(), max_length=bounds.PORTS_MAX, default=list,
        help_text="Ports of your own beside the tool's: {name, port, protocol: http|tcp}.",
    )  # fmt: skip
    ssh = serializers.BooleanField(
        default=False, help_text="Start an SSH server with your keys (`gpupool ssh`)."
    )

    def launch_request(self) -> services.LaunchRequest:
        data = dict(self.validated_data)
        data.pop("project")
        return services.LaunchRequest(**data)


class WorkspaceListApi(APIView):
    @extend_schema(responses=WorkspaceSerializer(many=True))
    def get(self, request: Request) -> Response:
        workspaces = selectors.workspace_list_for_user(request.user)
        return Response(WorkspaceSerializer(workspaces, many=True).data)

    @extend_schema(request=LaunchSerializer, responses={201: WorkspaceSerializer})
    def post(self, request: Request) -> Response:
        serializer = LaunchSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            workspace = services.workspace_launch(
                actor=request.user,
                project=serializer.validated_data["project"],
                request=serializer.launch_request(),
            )
        except ValidationFailed as exc:
            raise ValidationError(exc.errors) from exc
        except PermissionDenied as exc:
            raise ApiPermissionDenied(str(exc)) from exc
        return Response(WorkspaceSerializer(workspace).data, status=status.HTTP_201_CREATED)


def _visible(request: Request, workspace_id: int) -> Workspace:
    workspace = selectors.workspace_get(workspace_id)
    if workspace is None or not selectors.can_view_workspace(request.user, workspace):
        raise Http404
    return workspace


class WorkspaceDetailApi(APIView):
    @extend_schema(responses=WorkspaceSerializer)
    def get(self, request: Request, workspace_id: int) -> Response:
        return Response(WorkspaceSerializer(_visible(request, workspace_id)).data)


class WorkspaceKeepAliveApi(APIView):
    @extend_schema(request=None, responses=WorkspaceSerializer)
    def post(self, request: Request, workspace_id: int) -> Response:
        workspace = _visible(request, workspace_id)
        try:
            services.workspace_keep_alive(actor=request.user, workspace=workspace)
        except PermissionDenied as exc:
            raise ApiPermissionDenied(str(exc)) from exc
        return Response(WorkspaceSerializer(workspace).data)


class EnvironmentListApi(APIView):
    @extend_schema(responses=EnvironmentSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(EnvironmentSerializer(selectors.environment_list(), many=True).data)
