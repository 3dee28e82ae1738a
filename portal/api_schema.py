"""The OpenAPI schema (/api/schema/) as a contract: documented errors, enforced enums.

- An integer parameter declares the most the database can hold (64 bits), so that clients,
  and the schemathesis run in the tests, know where the range ends.
- Every operation documents the errors it can answer: 400 (refused input, messages per field)
  where it takes a body or query parameters, 401 and 403 where it needs a signed-in caller,
  404 where the path names an object, 429 on the sign-in endpoint.
- The two token schemes are described (registered when portal/urls.py imports this module).
- A query parameter the schema declares with an enum (?kind=, ?state=, ?sort=) accepts only
  those values: anything else is a 400 naming the parameter, where it would have been an empty
  list, or the default order, without a word. The middleware reads the enums from the schema
  itself, so the documented values and the enforced ones cannot drift apart.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.plumbing import build_bearer_security_scheme_object

logger = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1
FIELD_ERRORS = {
    "type": "object",
    "description": "Messages per field; non_field_errors for the request as a whole.",
    "additionalProperties": {"type": "array", "items": {"type": "string"}},
}
DETAIL = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
ERRORS = {
    "400": ("Refused input: messages per field.", "FieldErrors"),
    "401": ("Not signed in: send `Authorization: Token <key>` (POST /api/v1/auth/token).", None),
    "403": ("Signed in, but not allowed to do this.", None),
    "404": ("No such object, or none that you can see.", None),
    "429": ("Too many attempts: wait for Retry-After seconds.", None),
}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """People's API tokens (portal.tokens): `Authorization: Token <key>`."""

    target_class = "portal.tokens.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object("Authorization", "Token")


class NodeTokenScheme(OpenApiAuthenticationExtension):
    """Node agents' tokens (clusters.metrics): `Authorization: Bearer <key>`."""

    target_class = "clusters.metrics.api.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object("Authorization", "Bearer")


class CheckpointTokenScheme(OpenApiAuthenticationExtension):
    """A workload pod's checkpoint token (scheduling.checkpoints): `Authorization: Bearer`."""

    target_class = "scheduling.api.CheckpointTokenAuthentication"
    name = "checkpointToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object("Authorization", "Bearer")


def _errors_for(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    codes = []
    takes_input = method in {"post", "put", "patch"} or any(
        p.get("in") == "query" for p in operation.get("parameters", [])
    )
    if takes_input:
        codes.append("400")
    if any(operation.get("security", [])):  # [{}] or none: open to anyone
        codes += ["401", "403"]
    else:  # open to anyone: the sign-in endpoint, throttled instead
        codes.append("429")
    if "{" in path:
        codes.append("404")
    return codes


def _bound_integer(schema: dict[str, Any]) -> None:
    """An integer parameter is at most what the database stores (a 64-bit integer)."""
    if schema.get("type") == "integer" and "maximum" not in schema:
        schema.setdefault("format", "int64")
        schema["maximum"] = INT64_MAX


def document_errors(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: the error answers of every operation (see the module)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["FieldErrors"], schemas["ErrorDetail"] = FIELD_ERRORS, DETAIL
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                _bound_integer(parameter.get("schema", {}))
            responses = operation.setdefault("responses", {})
            for code in _errors_for(path, method, operation):
                description, component = ERRORS[code]
                ref = {"$ref": f"#/components/schemas/{component or 'ErrorDetail'}"}
                responses.setdefault(
                    code,
                    {"description": description, "content": {"application/json": {"schema": ref}}},
                )
    return result


@functools.cache
def declared_enums() -> dict[tuple[Callable[..., Any], str], dict[str, list[str]]]:
    """(view callback, METHOD) -> {query parameter: its allowed values}, from the schema."""
    generator = SchemaGenerator()
    try:
        with GENERATOR_STATS.silence():
            paths = generator.get_schema(request=None, public=True)["paths"]
            views = generator._get_paths_and_endpoints()  # the schema's paths, endpoint order
    except Exception:  # a view the schema cannot describe must not take the API down with it
        logger.exception("The OpenAPI schema failed to build: query enums are not enforced")
        return {}
    enums = {}
    for (_, _, method, callback), (path, _, _, _) in zip(generator.endpoints, views, strict=True):
        operation = paths.get(path, {}).get(method.lower(), {})
        enums[(callback, method)] = {
            p["name"]: [str(v) for v in p["schema"]["enum"]]
            for p in operation.get("parameters", [])
            if p.get("in") == "query" and "enum" in p.get("schema", {})
        }
    return enums


class EnforceSchemaEnumsMiddleware:
    """A query parameter outside its documented enum is a 400 naming it (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponse | None:
        if not request.GET or not request.path.startswith("/api/"):
            return None
        allowed = declared_enums().get((view, request.method), {})
        errors = {
            name: [f"Must be one of: {', '.join(allowed[name])}."]
            for name in allowed
            if any(value not in allowed[name] for value in request.GET.getlist(name) if value)
        }
        return JsonResponse(errors, status=400) if errors else None
