"""The organisation's REST API: validate the input's shape, call one service, return output.

Same rules as the pages: lists are cut to what the caller may see, objects outside their
view are 404, changes they may not make are 403, refused input is 400 with field messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import authenticate
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import Cluster, NodePool, PlacementStrategy
from portal import selectors, services
from portal.errors import ValidationFailed
from portal.models import Department, Project, SshKey
from portal.permissions import visible_projects
from portal.services.ssh_keys import ssh_key_add, ssh_key_remove
from portal.ssh_keys import KEY_TEXT_MAX
from portal.throttles import SIGN_IN_THROTTLES
from portal.tokens import api_token_issue
from scheduling.bounds import Bound


def call(service: Callable[..., Any], **kwargs: Any) -> Any:
    """Run a service; its refusals become DRF's 400 with the same field names."""
    try:
        return service(**kwargs)
    except ValidationFailed as exc:
        errors = {("non_field_errors" if k == "__all__" else k): v for k, v in exc.errors.items()}
        raise serializers.ValidationError(errors) from None


def valid(serializer_class: type[serializers.Serializer], data: Any, **kw: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data, **kw)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _help(bound: Bound, kwargs: dict[str, Any]) -> str:
    return " ".join(filter(None, [kwargs.pop("help_text", ""), bound.describe()]))


def bounded_integer(bound: Bound, **kwargs: Any) -> serializers.IntegerField:
    """A serializer field for a whole number within `bound` (scheduling.bounds)."""
    return serializers.IntegerField(
        min_value=int(bound.low),
        max_value=int(bound.high),
        help_text=_help(bound, kwargs),
        **kwargs,
    )


def bounded_decimal(bound: Bound, **kwargs: Any) -> serializers.DecimalField:
    """A serializer field for a number within `bound`, with at most its decimal places."""
    return serializers.DecimalField(
        max_digits=len(str(int(bound.high))) + bound.places,
        decimal_places=bound.places,
        min_value=bound.low,
        max_value=bound.high,
        help_text=_help(bound, kwargs),
        **kwargs,
    )


# --- Serializers ------------------------------------------------------------------------------


class TokenRequestSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(trim_whitespace=False)


class MembershipSerializer(serializers.Serializer):
    role = serializers.CharField()
    project = serializers.CharField(source="project.name", default=None)
    department = serializers.CharField(source="department.name", default=None)


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    email = serializers.EmailField()
    first_name = serializers.CharField()
    last_name = serializers.CharField()
    is_platform_admin = serializers.BooleanField()
    memberships = MembershipSerializer(many=True, source="memberships.all")


class DepartmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Department
        fields = ["id", "name", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        extra_kwargs = {"name": {"validators": []}}  # the service checks uniqueness, with a message


class ProjectSerializer(serializers.ModelSerializer):
    department = serializers.PrimaryKeyRelatedField(queryset=Department.objects.all())
    department_name = serializers.CharField(source="department.name", read_only=True)
    # "apiVersion kind" strings; the service checks each against the platform's list.
    manifest_kinds = serializers.ListField(
        child=serializers.CharField(max_length=120), max_length=32, required=False
    )

    class Meta:
        model = Project
        fields = [
            "id",
            "name",
            "namespace",
            "description",
            "department",
            "department_name",
            "nonpreemptible_over_quota",
            "enforce_scheduler",
            "manifest_kinds",
        ]
        read_only_fields = ["id"]
        extra_kwargs = {
            "name": {"validators": []},
            "namespace": {"validators": [], "required": False, "allow_blank": True},
        }


class NodePoolSerializer(serializers.ModelSerializer):
    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Cluster.objects.all(), allow_null=True, required=False
    )
    placement = serializers.ChoiceField(choices=PlacementStrategy.choices, required=False)

    class Meta:
        model = NodePool
        fields = ["id", "name", "cluster", "label_value", "placement", "description"]
        read_only_fields = ["id"]
        extra_kwargs = {"name": {"validators": []}}


def _decimal(required: bool = False) -> serializers.DecimalField:
    return serializers.DecimalField(
        max_digits=None, decimal_places=None, required=required, allow_null=not required
    )


class QuotaRowSerializer(serializers.Serializer):
    node_pool = serializers.SlugRelatedField(slug_field="name", queryset=NodePool.objects.all())
    gpus = _decimal()
    gpus_limit = _decimal()
    cpu = _decimal()
    cpu_limit = _decimal()
    memory_gib = _decimal()
    memory_gib_limit = _decimal()
    over_quota_weight = _decimal()
    over_quota_allowed = serializers.BooleanField(required=False)


def quota_rows(owner: Department | Project) -> list[dict[str, Any]]:
    """The pools where the owner has a quota row; decimals as strings, as everywhere."""
    return [
        dict(QuotaRowSerializer(row.quota).data)
        for row in selectors.quota_table(owner)
        if row.quota is not None
    ]


# --- Views ------------------------------------------------------------------------------------


TOKEN_ANSWER = inline_serializer(
    "IssuedToken",
    {
        "token": serializers.CharField(help_text="Send as `Authorization: Token <token>`."),
        "username": serializers.CharField(),
        "expiry": serializers.DateTimeField(),
    },
)


class TokenView(APIView):
    """POST username and password, get a new API token the CLI sends as `Token <key>`.

    The token is shown this once (only its digest is stored) and expires at `expiry`.
    """

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = SIGN_IN_THROTTLES

    @extend_schema(request=TokenRequestSerializer, responses=TOKEN_ANSWER)
    def post(self, request: Request) -> Response:
        data = valid(TokenRequestSerializer, request.data)
        user = authenticate(request, username=data["username"], password=data["password"])
        if user is None or not user.is_active:
            raise serializers.ValidationError(
                {"non_field_errors": ["Unknown username or wrong password."]}
            )
        stored, token = api_token_issue(user=user)
        return Response({"token": token, "username": user.username, "expiry": stored.expiry})


class MeView(APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(MeSerializer(request.user).data)


class ListCreateView(APIView):
    """GET the rows the caller may see; POST one through the create service."""

    serializer: type[serializers.ModelSerializer]

    def get_serializer_class(self) -> type[serializers.ModelSerializer]:
        return self.serializer  # for the OpenAPI schema, with `action`

    @property
    def action(self) -> str:
        """For the OpenAPI schema, as on a ViewSet: GET lists, POST creates (201)."""
        return "create" if self.request.method == "POST" else "list"

    def rows(self, request: Request) -> Any:
        raise NotImplementedError

    def create(self, actor: Any, data: dict[str, Any]) -> Any:
        raise NotImplementedError

    def get(self, request: Request) -> Response:
        return Response(self.serializer(self.rows(request), many=True).data)

    def post(self, request: Request) -> Response:
        data = valid(self.serializer, request.data)
        created = call(self.create, actor=request.user, data=data)
        return Response(self.serializer(created).data, status=status.HTTP_201_CREATED)


class DetailView(APIView):
    """GET one row; PATCH some of `fields` (the rest keep their values) through a service."""

    serializer: type[serializers.ModelSerializer]
    fields: tuple[str, ...]

    def get_serializer_class(self) -> type[serializers.ModelSerializer]:
        return self.serializer  # for the OpenAPI schema

    def object(self, request: Request, pk: int) -> Any:
        raise NotImplementedError

    def update(self, actor: Any, obj: Any, values: dict[str, Any]) -> Any:
        raise NotImplementedError

    def get(self, request: Request, pk: int) -> Response:
        return Response(self.serializer(self.object(request, pk)).data)

    def patch(self, request: Request, pk: int) -> Response:
        obj = self.object(request, pk)
        data = valid(self.serializer, request.data, instance=obj, partial=True)
        # Fields outside `fields` (a project's department) are never changed here.
        values = {f: getattr(obj, f) for f in self.fields} | {
            k: v for k, v in data.items() if k in self.fields
        }
        call(self.update, actor=request.user, obj=obj, values=values)
        return Response(self.serializer(obj).data)


class DetailDeleteView(DetailView):
    def remove(self, actor: Any, obj: Any) -> None:
        raise NotImplementedError

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        call(self.remove, actor=request.user, obj=self.object(request, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _department(request: Request, pk: int) -> Department:
    return get_object_or_404(selectors.department_list_for_user(request.user), pk=pk)


def _project(request: Request, pk: int) -> Project:
    return get_object_or_404(visible_projects(request.user).select_related("department"), pk=pk)


class DepartmentListView(ListCreateView):
    serializer = DepartmentSerializer

    def rows(self, request: Request) -> Any:
        return selectors.department_list_for_user(request.user)

    def create(self, actor: Any, data: dict[str, Any]) -> Department:
        return services.department_create(actor=actor, **data)


class DepartmentDetailView(DetailDeleteView):
    serializer = DepartmentSerializer
    fields = ("name", "description")

    def object(self, request: Request, pk: int) -> Department:
        return _department(request, pk)

    def update(self, actor: Any, obj: Department, values: dict[str, Any]) -> Department:
        return services.department_update(actor=actor, department=obj, **values)

    def remove(self, actor: Any, obj: Department) -> None:
        services.department_delete(actor=actor, department=obj)


class ProjectListView(ListCreateView):
    serializer = ProjectSerializer

    def rows(self, request: Request) -> Any:
        return selectors.project_list_for_user(request.user)

    def create(self, actor: Any, data: dict[str, Any]) -> Project:
        return services.project_create(actor=actor, **data)


class ProjectDetailView(DetailDeleteView):
    serializer = ProjectSerializer
    # A project stays in its department.
    fields = (
        "name", "namespace", "description", "nonpreemptible_over_quota", "enforce_scheduler",
        "manifest_kinds",
    )  # fmt: skip

    def object(self, request: Request, pk: int) -> Project:
        return _project(request, pk)

    def update(self, actor: Any, obj: Project, values: dict[str, Any]) -> Project:
        return services.project_update(actor=actor, project=obj, **values)

    def remove(self, actor: Any, obj: Project) -> None:
        services.project_delete(actor=actor, project=obj)


class QuotaView(APIView):
    """GET the owner's quota rows; PUT a list of rows (one per pool), all or nothing."""

    def owner(self, request: Request, pk: int) -> Department | Project:
        raise NotImplementedError

    @extend_schema(responses=QuotaRowSerializer(many=True))
    def get(self, request: Request, pk: int) -> Response:
        return Response(quota_rows(self.owner(request, pk)))

    @extend_schema(request=QuotaRowSerializer(many=True), responses=QuotaRowSerializer(many=True))
    def put(self, request: Request, pk: int) -> Response:
        owner = self.owner(request, pk)
        rows = valid(_QuotaTable, {"rows": request.data})["rows"]
        pools = [row["node_pool"].name for row in rows]
        twice = sorted({name for name in pools if pools.count(name) > 1})
        if twice:  # a later row would silently replace an earlier one
            message = f"{', '.join(twice)} appears more than once: one row per pool."
            raise serializers.ValidationError({"node_pool": [message]})
        table = {row.pop("node_pool"): row for row in rows}
        call(services.quota_set, actor=request.user, owner=owner, table=table)
        return Response(quota_rows(owner))


class _QuotaTable(serializers.Serializer):
    rows = QuotaRowSerializer(many=True)


class DepartmentQuotaView(QuotaView):
    def owner(self, request: Request, pk: int) -> Department:
        return _department(request, pk)


class ProjectQuotaView(QuotaView):
    def owner(self, request: Request, pk: int) -> Project:
        return _project(request, pk)


class NodePoolListView(ListCreateView):
    serializer = NodePoolSerializer

    def rows(self, request: Request) -> Any:
        return NodePool.objects.all()

    def create(self, actor: Any, data: dict[str, Any]) -> NodePool:
        return services.node_pool_create(actor=actor, **data)


class NodePoolDetailView(DetailView):
    serializer = NodePoolSerializer
    fields = services.organisation.POOL_FIELDS

    def object(self, request: Request, pk: int) -> NodePool:
        return get_object_or_404(NodePool, pk=pk)

    def update(self, actor: Any, obj: NodePool, values: dict[str, Any]) -> NodePool:
        return services.node_pool_update(actor=actor, pool=obj, **values)


class SshKeySerializer(serializers.ModelSerializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)
    public_key = serializers.CharField(
        max_length=KEY_TEXT_MAX, write_only=True, help_text="One line of a .pub file."
    )

    class Meta:
        model = SshKey
        fields = ["id", "name", "public_key", "key_type", "bits", "fingerprint", "comment",
                  "created_at"]  # fmt: skip
        read_only_fields = ["key_type", "bits", "fingerprint", "comment", "created_at"]


class SshKeyListView(ListCreateView):
    """The caller's own SSH public keys (GET), and a new one (POST), refused with the reason
    when it does not parse or is too weak."""

    serializer = SshKeySerializer

    def rows(self, request: Request) -> Any:
        return request.user.ssh_keys.all()

    def create(self, actor: Any, data: dict[str, Any]) -> SshKey:
        return ssh_key_add(actor=actor, user=actor, name=data.get("name", ""),
                           public_key=data["public_key"])  # fmt: skip


class SshKeyDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        ssh_key_remove(actor=request.user, key=get_object_or_404(request.user.ssh_keys, pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
