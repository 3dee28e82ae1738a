"""Workloads, the queue and policies over REST (/api/v1/). Same rules as the pages: lists
hold what the caller may see, other objects are 404, forbidden changes 403, refused input
400 with the field's messages."""

from __future__ import annotations

from decimal import InvalidOperation
from typing import Any

from django.db import models
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from clusters.selectors import (
    enforced_limits,
    pod_limits,
    pool_backends,
    pools_with_gpus,
    workload_pod_logs,
)
from portal.api import bounded_decimal, bounded_integer, call
from portal.models import Department, Project
from portal.pagination import BoundedPagination, query_number
from portal.permissions import (
    departments_for_admin,
    is_admin,
    is_platform_admin,
    visible_projects,
)
from portal.queueing import deferrals, deferred_notice
from portal.selectors import project_named
from portal.tokens import BearerTokenAuthentication
from scheduling import bounds, checkpoints, selectors, services
from scheduling.models import (
    CycleRun,
    GpuRequestKind,
    PodAllocation,
    PriorityClass,
    Workload,
    WorkloadKind,
    WorkloadPolicy,
    WorkloadState,
)
from scheduling.policies import FIELDS as POLICY_FIELDS
from scheduling.policies import policy_owner
from scheduling.specs import SCALE_TARGET, SCALE_TARGET_REQUESTS, SPEC_KEYS

MAX_LOG_LINES = int(bounds.LOG_LINES.high)
SHAPE_KEYS = ("project", "kind", "name")


class AllocationSerializer(serializers.Serializer):
    pod_index = serializers.IntegerField()
    cluster = serializers.CharField(source="node.cluster.name")
    node = serializers.CharField(source="node.name")
    gpu_indices = serializers.ListField(child=serializers.IntegerField())
    shared_gpu_index = serializers.IntegerField(allow_null=True)
    gpu_share = serializers.DecimalField(max_digits=6, decimal_places=3, allow_null=True)
    gpu_memory_mib = serializers.IntegerField()
    # A MIG instance: its GPU, profile and first memory slice (null / "" otherwise).
    mig_gpu_index = serializers.IntegerField(allow_null=True)
    mig_profile = serializers.CharField()
    mig_start = serializers.IntegerField(allow_null=True)
    # What MPS enforces on a sharer (clusters.sharing): {"mechanism": "mps",
    # "gpu_memory_mib", "active_thread_percentage"}; null for whole GPUs.
    enforced_limits = serializers.SerializerMethodField()
    # A local pod's cgroup limits: {"limited": true, "version", "memory_mib", "cpus",
    # "pids"} or {"limited": false, "reason"}; null on other backends or with no pod.
    pod_limits = serializers.SerializerMethodField()
    phase = serializers.CharField()
    endpoint = serializers.CharField()

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_enforced_limits(self, allocation: PodAllocation) -> dict[str, Any] | None:
        return enforced_limits(allocation)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_pod_limits(self, allocation: PodAllocation) -> dict[str, Any] | None:
        return pod_limits(allocation)


class StoredDecimalField(serializers.DecimalField):
    """A stored number as it is, even one its column cannot hold (planted out of range on
    SQLite; the cycle fails such a row): one row must not make the whole list a 500."""

    def to_representation(self, value: Any) -> Any:
        try:
            return super().to_representation(value)
        except InvalidOperation:
            as_string = getattr(self, "coerce_to_string", api_settings.COERCE_DECIMAL_TO_STRING)
            return f"{value:f}" if as_string else value


WHY_HELP = (
    "What it waits for (pending, or admitted while the cluster holds its pods back), or why "
    "it failed, stopped or was preempted."
)


class WorkloadSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DecimalField: StoredDecimalField,
    }
    project = serializers.CharField(source="project.name")
    submitted_by = serializers.CharField(source="submitted_by.username")
    allocations = AllocationSerializer(many=True, read_only=True)
    gpus_allocated = serializers.SerializerMethodField()
    gpus_requested = serializers.SerializerMethodField(
        help_text="What the whole workload asks for, as the pages show it: GPUs per pod x"
        " pods, or 'pods x MiB' for a request by GPU memory."
    )
    links = serializers.SerializerMethodField(
        help_text="ports: name, port, protocol and (HTTP) the proxy's path; ssh: user, path."
    )
    size = serializers.SerializerMethodField(help_text="pods running now, and the range")
    why = serializers.SerializerMethodField(help_text=WHY_HELP)
    runs = serializers.SerializerMethodField(
        help_text="Whether its code really runs: simulated (true: nothing runs; false: it "
        "runs; null: pending where pools of both kinds may take it), a summary in words, and "
        "the pools with real nodes."
    )

    origin = serializers.SerializerMethodField(
        help_text="For work made outside GPUPool (kubectl, Helm, an operator): its owner "
        "object (api_version, kind, name, namespace), who made it (manager), its pods and a "
        "summary; null for work submitted to GPUPool."
    )

    class Meta:
        model = Workload
        fields = [
            "id", "project", "submitted_by", "parent", "kind", "name", "image", "command",
            "args", "env", "gpu_request", "gpus", "gpu_memory_mib", "mig_profile", "cpu",
            "memory_mib", "pids_max", "pods", "min_pods", "node_pools", "gpu_model",
            "topology_level", "topology_required",
            "priority_class", "priority", "preemptible", "max_runtime_s", "checkpoint_dir",
            "checkpoint_interval_s", "last_checkpoint_at", "spec", "state", "pending_reason",
            "message", "exit_code", "restart_count",
            "created_at", "queued_at", "admitted_at", "started_at", "finished_at",
            "allocations", "gpus_allocated", "gpus_requested", "links", "elastic",
            "handles_resize", "resized_at", "size", "min_gpus", "runs", "why", "origin",
        ]  # fmt: skip

    def get_gpus_allocated(self, wl: Workload) -> str:
        return f"{selectors.gpus_allocated(wl).normalize():f}"

    def get_gpus_requested(self, wl: Workload) -> str:
        return selectors.gpus_requested(wl)

    def get_links(self, wl: Workload) -> dict[str, Any]:
        return selectors.workload_links(wl)

    def get_size(self, wl: Workload) -> dict[str, int]:
        return selectors.workload_size(wl)

    def get_why(self, wl: Workload) -> str:
        return selectors.workload_why(wl)

    def get_origin(self, wl: Workload) -> dict[str, Any] | None:
        return selectors.workload_origin(wl)

    def get_runs(self, wl: Workload) -> dict[str, Any]:
        # Read once per answer: a list's items share the root serializer's context.
        if "pool_backends" not in self.context:
            self.context["pool_backends"] = pool_backends()
            self.context["gpu_pools"] = pools_with_gpus()
        context = self.context
        return selectors.workload_runs(wl, context["pool_backends"], context["gpu_pools"])


class EventSerializer(serializers.Serializer):
    created_at = serializers.DateTimeField()
    type = serializers.CharField()
    reason = serializers.CharField()
    message = serializers.CharField()


class SubmitSerializer(serializers.Serializer):
    """The shape of a submission; workload_submit judges the rest of its fields."""

    project = serializers.CharField(help_text="Project name or id.")
    kind = serializers.ChoiceField(choices=WorkloadKind.choices)
    name = serializers.CharField(max_length=63)

    def validate_kind(self, kind: str) -> str:
        # A workspace is more than a workload: its environment's tool, the token the
        # portal's proxy adds, idle culling. Launched here it could never be opened.
        if kind == WorkloadKind.WORKSPACE:
            raise serializers.ValidationError(
                "Launch workspaces at /api/v1/workspaces/ (or `gpupool submit workspace`): "
                "they need an environment."
            )
        return kind


class SubmitSpecSerializer(SubmitSerializer):
    """The schema of a submission's fields with their bounds, for the API's documentation
    (and generated clients); workload_submit checks them, with the same bounds."""

    image = serializers.CharField(max_length=300)
    command = serializers.ListField(child=serializers.CharField(), required=False)
    args = serializers.ListField(child=serializers.CharField(), required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    gpu_request = serializers.ChoiceField(choices=GpuRequestKind.choices, required=False)
    gpus = bounded_decimal(bounds.GPUS, required=False)
    gpu_memory_mib = bounded_integer(bounds.GPU_MEMORY_MIB, required=False)
    mig_profile = serializers.CharField(
        max_length=16,
        required=False,
        help_text="gpu_request mig: a profile such as 1g.10gb, "
        "or auto (the smallest profile holding gpu_memory_mib)",
    )
    cpu = bounded_decimal(bounds.CPU, required=False)
    memory_mib = bounded_integer(bounds.MEMORY_MIB, required=False)
    pids_max = bounded_integer(
        bounds.PIDS_MAX,
        required=False,
        help_text="processes and threads per pod (local clusters), at most the cluster's "
        "pids_max; omitted: the cluster's (1024 unless its admin set another)",
    )
    workers = bounded_integer(bounds.PODS, required=False, help_text="distributed")
    master = serializers.BooleanField(required=False, help_text="distributed")
    min_pods = bounded_integer(
        bounds.PODS, required=False, help_text="distributed gang minimum; elastic minimum"
    )
    max_pods = bounded_integer(bounds.PODS, required=False, help_text="training: elastic maximum")
    handles_resize = serializers.BooleanField(
        required=False, help_text="elastic: no restart from checkpoint on a size change"
    )
    min_gpus = bounded_integer(bounds.GPU_RANGE, required=False, help_text="training: GPU range")
    max_gpus = bounded_integer(
        bounds.GPU_RANGE, required=False, help_text="training: GPU range (replaces gpus)"
    )
    replicas = bounded_integer(bounds.PODS, required=False, help_text="inference")
    min_replicas = bounded_integer(bounds.PODS, required=False, help_text="inference, elastic")
    max_replicas = bounded_integer(bounds.PODS, required=False, help_text="inference, elastic")
    scale_target = bounded_decimal(
        SCALE_TARGET, required=False, help_text="elastic inference: GPU utilization, percent"
    )
    scale_target_requests = bounded_integer(
        SCALE_TARGET_REQUESTS,
        required=False,
        help_text="elastic inference: requests per replica per minute (through the proxy)",
    )
    scale_cooldown_s = bounded_integer(
        bounds.GRACE_S, required=False, help_text="elastic inference: seconds between changes"
    )
    ports = serializers.ListField(
        child=inline_serializer(
            "Port",
            {
                "name": serializers.CharField(max_length=15),
                "port": bounded_integer(bounds.PORT),
                "protocol": serializers.ChoiceField(choices=["http", "tcp"], required=False),
            },
        ),
        max_length=bounds.PORTS_MAX,
        required=False,
    )
    node_pools = serializers.ListField(child=serializers.CharField(), required=False)
    gpu_model = serializers.CharField(max_length=200, required=False)
    topology_level = serializers.CharField(max_length=63, required=False)
    topology_required = serializers.BooleanField(required=False)
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, required=False)
    preemptible = serializers.BooleanField(required=False)
    max_runtime_s = bounded_integer(bounds.RUNTIME_S, required=False)
    checkpoint_dir = serializers.CharField(max_length=500, required=False)
    checkpoint_interval_s = bounded_integer(
        bounds.CHECKPOINT_INTERVAL_S,
        required=False,
        help_text="training: how often it saves a checkpoint; preemption for over-quota work may"
        " wait for one due soon (an owner taking back its guaranteed quota never waits)",
    )
    duration_s = bounded_integer(bounds.DURATION_S, required=False)
    ssh = serializers.BooleanField(
        required=False, help_text="Start an SSH server with your keys (`gpupool ssh`)."
    )
    search = serializers.DictField(required=False, help_text="hpo: method, parameters, ...")


def _project_for(user: Any, value: str) -> Project:
    projects = visible_projects(user)
    found = project_named(projects, value).first()
    if found is None:
        raise serializers.ValidationError({"project": [f"No project {value} that you can see."]})
    return found


def _workload_for(request: Request, pk: int) -> Workload:
    visible = Workload.objects.filter(project__in=visible_projects(request.user))
    return get_object_or_404(visible.select_related("project", "submitted_by"), pk=pk)


class LogsSerializer(serializers.Serializer):
    pods = inline_serializer(
        "PodLog", {"pod": serializers.IntegerField(), "log": serializers.CharField()}, many=True
    )
    unavailable = serializers.CharField(help_text="Why there are no logs; empty when there are.")
    state = serializers.CharField(help_text="The workload's state: `gpupool logs -f` follows "
                                  "until it has ended.")  # fmt: skip
    why = serializers.CharField(help_text=WHY_HELP)


class QueueSerializer(serializers.Serializer):
    queues = inline_serializer(
        "QueueStanding",
        {
            "project": serializers.CharField(),
            "department": serializers.CharField(),
            "deserved": serializers.FloatField(help_text="GPUs, all pools."),
            "fair_share": serializers.FloatField(),
            "allocated": serializers.FloatField(),
            "over_quota": serializers.FloatField(),
            "pending": serializers.IntegerField(),
        },
        many=True,
        help_text="Most starved first.",
    )
    pending = inline_serializer(
        "QueuedWorkload",
        {
            "position": serializers.IntegerField(),
            "id": serializers.IntegerField(),
            "name": serializers.CharField(),
            "project": serializers.CharField(),
            "priority_class": serializers.CharField(),
            "gpus": serializers.CharField(),
            "queued_at": serializers.DateTimeField(),
            "reason": serializers.CharField(),
        },
        many=True,
        help_text="In the order the scheduler considers them.",
    )


LIST_PARAMETERS = [
    OpenApiParameter("project", str, description="Project name or id."),
    OpenApiParameter("kind", str, enum=WorkloadKind.values),
    OpenApiParameter("state", str, enum=WorkloadState.values),
    OpenApiParameter("user", str, description="Username of the submitter."),
    OpenApiParameter("parent", int, description="The id of the HPO sweep whose trials to list."),
    OpenApiParameter("sort", str, enum=[k for key in selectors.SORTS for k in (key, f"-{key}")]),
    OpenApiParameter("limit", int, description=bounds.PAGE_LIMIT.describe()),
    OpenApiParameter("offset", int, description=bounds.PAGE_OFFSET.describe()),
]
WORKLOAD_PAGE = inline_serializer(
    "WorkloadPage",
    {
        "count": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": WorkloadSerializer(many=True),
    },
)


class WorkloadListView(APIView):
    @extend_schema(
        operation_id="v1_workloads_list", parameters=LIST_PARAMETERS, responses=WORKLOAD_PAGE
    )
    def get(self, request: Request) -> Response:
        """Workloads you can see; filters: project, kind, state, user, parent; sort."""
        for name in ("parent", "cluster"):  # an id no row can have is a 400, not an overflow
            if request.query_params.get(name, "").isdigit():
                query_number(request, name, bounds.ID)
        qs = selectors.workload_list(request.user, request.query_params).prefetch_related(
            "allocations__node__cluster"
        )
        paginator = BoundedPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(WorkloadSerializer(page, many=True).data)

    @extend_schema(request=SubmitSpecSerializer, responses={201: WorkloadSerializer})
    def post(self, request: Request) -> Response:
        """Submit a workload: project, kind, name and the kind's fields (see the forms). A
        `notice` in the answer says the work is stored but the scheduler could not be told
        at once (its queue unreachable): the next periodic cycle picks it up."""
        shape = SubmitSerializer(data=request.data)
        shape.is_valid(raise_exception=True)
        spec = {k: v for k, v in request.data.items() if k not in SHAPE_KEYS}
        # Only the spec's own fields reach the service: never `actor` or anything else.
        if unknown := sorted(set(spec) - SPEC_KEYS):
            raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        with deferrals() as deferred:
            workload = call(
                services.workload_submit,
                actor=request.user,
                project=_project_for(request.user, shape.validated_data["project"]),
                kind=shape.validated_data["kind"],
                name=shape.validated_data["name"],
                **spec,
            )
        body = WorkloadSerializer(workload).data
        if notice := deferred_notice(deferred):
            body["notice"] = notice  # stored: a retry would submit it twice
        return Response(body, status=status.HTTP_201_CREATED)


class WorkloadDetailView(APIView):
    @extend_schema(responses=WorkloadSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(WorkloadSerializer(_workload_for(request, pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        call(services.workload_delete, actor=request.user, workload=_workload_for(request, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WorkloadStopView(APIView):
    @extend_schema(request=None, responses=WorkloadSerializer)
    def post(self, request: Request, pk: int) -> Response:
        workload = call(
            services.workload_stop, actor=request.user, workload=_workload_for(request, pk)
        )
        return Response(WorkloadSerializer(workload).data)


class CheckpointTokenAuthentication(BearerTokenAuthentication):
    """A workload's own pod (scheduling.checkpoints): request.auth is its workload's id."""

    refused = "Not a checkpoint token."

    def check(self, token: str) -> int | None:
        return checkpoints.workload_token_check(token)


class HoldsThisWorkloadsToken(BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return request.auth is not None and request.auth == view.kwargs.get("pk")


class WorkloadCheckpointView(APIView):
    authentication_classes = [CheckpointTokenAuthentication]
    permission_classes = [HoldsThisWorkloadsToken]

    @extend_schema(
        request=None,
        responses=inline_serializer(
            "CheckpointSaved", {"last_checkpoint_at": serializers.DateTimeField()}
        ),
    )
    def post(self, request: Request, pk: int) -> Response:
        """A running workload's pod says it saved a checkpoint now (its own token only)."""
        saved = call(checkpoints.workload_checkpoint_record, workload_id=pk)
        return Response({"last_checkpoint_at": saved})


class WorkloadEventsView(APIView):
    @extend_schema(responses=EventSerializer(many=True))
    def get(self, request: Request, pk: int) -> Response:
        events = _workload_for(request, pk).events.all()
        return Response(EventSerializer(events, many=True).data)


class WorkloadLogsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("tail", int, description=f"Lines, 1 to {MAX_LOG_LINES}."),
            OpenApiParameter("pod", int, description="Only this pod (0 to pods - 1)."),
        ],
        responses=LogsSerializer,
    )
    def get(self, request: Request, pk: int) -> Response:
        """Each pod's recent output (or one pod's), or why logs are unavailable."""
        workload = _workload_for(request, pk)
        tail = query_number(request, "tail", bounds.LOG_LINES, 500)
        pods = bounds.pod_index(workload.pods)
        pod = query_number(request, "pod", pods, None)
        found, unavailable = workload_pod_logs(workload, tail_lines=tail, pod=pod)
        data = {
            "pods": [{"pod": i, "log": text} for i, text in found],
            "unavailable": unavailable,
            "state": workload.state,
            "why": selectors.workload_why(workload),
        }
        return Response(data)


class QueueView(APIView):
    @extend_schema(responses=QueueSerializer)
    def get(self, request: Request) -> Response:
        """Queues most starved first, and pending work in the order it will be considered."""
        rows, order = selectors.queue_order(request.user)
        queues = [
            {
                "project": r.project.name,
                "department": r.project.department.name,
                "deserved": r.deserved,
                "fair_share": r.fair_share,
                "allocated": r.allocated,
                "over_quota": r.over_quota,
                "pending": len(r.pending),
            }
            for r in rows
        ]
        pending = [
            {
                "position": n,
                "id": wl.pk,
                "name": wl.name,
                "project": wl.project.name,
                "priority_class": wl.priority_class,
                "gpus": selectors.gpus_requested(wl),
                "queued_at": wl.queued_at,
                "reason": wl.pending_reason,
            }
            for n, wl in order
        ]
        return Response({"queues": queues, "pending": pending})


class PolicySerializer(serializers.Serializer):
    max_gpus_per_workload = bounded_decimal(bounds.POLICY_GPUS, allow_null=True, required=False)
    allowed_kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=WorkloadKind.choices), allow_null=True, required=False
    )
    default_runtime_s = bounded_integer(bounds.RUNTIME_S, allow_null=True, required=False)
    max_runtime_s = bounded_integer(bounds.RUNTIME_S, allow_null=True, required=False)
    preemptible_classes = serializers.ListField(
        child=serializers.CharField(), allow_null=True, required=False
    )
    termination_grace_s = bounded_integer(bounds.GRACE_S, allow_null=True, required=False)


class PolicyOutSerializer(PolicySerializer):
    scope = serializers.ChoiceField(["department", "project"])
    id = serializers.IntegerField(help_text="The department's or project's id.")
    name = serializers.CharField()


def _policy_data(policy: WorkloadPolicy) -> dict[str, Any]:
    data = PolicySerializer(policy).data
    scope = "project" if policy.project_id else "department"
    owner = policy.project or policy.department
    return {"scope": scope, "id": owner.pk, "name": owner.name, **data}


class PolicyListView(APIView):
    @extend_schema(responses=PolicyOutSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Policies of the departments you administer and their projects."""
        if not is_admin(request.user):
            raise PermissionDenied("Only administrators see policies.")
        departments = departments_for_admin(request.user)
        policies = WorkloadPolicy.objects.filter(
            department__in=departments
        ) | WorkloadPolicy.objects.filter(project__department__in=departments)
        policies = policies.select_related("project", "department").order_by("pk")
        return Response([_policy_data(p) for p in policies])


class PolicyDetailView(APIView):
    @extend_schema(request=PolicySerializer, responses=PolicyOutSerializer)
    def put(self, request: Request, scope: str, pk: int) -> Response:
        """Set a department's or project's policy (admins of its department)."""
        owner = _policy_owner(request, scope, pk)
        serializer = PolicySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = {k: serializer.validated_data[k] for k in POLICY_FIELDS if k in request.data}
        policy = call(services.policy_set, actor=request.user, **{scope: owner}, **values)
        return Response(_policy_data(policy))

    @extend_schema(responses=PolicyOutSerializer)
    def get(self, request: Request, scope: str, pk: int) -> Response:
        owner = _policy_owner(request, scope, pk)
        policy = WorkloadPolicy.objects.filter(**{scope: owner}).first()
        if policy is None:
            return Response({"scope": scope, "id": owner.pk, "name": owner.name})
        return Response(_policy_data(policy))


def _policy_owner(request: Request, scope: str, pk: int) -> Department | Project:
    if scope not in ("department", "project"):
        raise serializers.ValidationError({"scope": ["A policy's scope is department or project."]})
    return policy_owner(request.user, scope, pk)


class CycleSerializer(serializers.ModelSerializer):
    class Meta:
        model = CycleRun
        fields = [
            "id", "started_at", "duration_ms", "engine_ms", "workloads", "nodes", "admitted",
            "admitted_at_release", "evicted", "stopped", "pending", "ok", "error",
        ]  # fmt: skip


class CycleListView(APIView):
    @extend_schema(responses=CycleSerializer(many=True))
    def get(self, request: Request) -> Response:
        """The last scheduling cycles (platform admins)."""
        if not is_platform_admin(request.user):
            raise PermissionDenied("Only platform administrators see scheduling cycles.")
        fields = CycleSerializer.Meta.fields
        return Response(list(CycleRun.objects.values(*fields)[:100]))


class ApiDocsView(SpectacularSwaggerView):
    """Swagger UI served from this server (drf-spectacular-sidecar; SPECTACULAR_SETTINGS
    names it). Nothing comes from another host: Redoc, used before, loads its logo from
    cdn.redoc.ly whatever its options, and drf-spectacular's page for it Google Fonts."""

    url_name = "api-schema"
