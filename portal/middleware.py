"""Refuse a NUL character (0x00) anywhere in a request's query or body, with a 400.

PostgreSQL can neither store nor compare a NUL in text: a filter (`?project=a%00`) or a
name looked up from a body raised DataError, a 500, wherever the value reached a query.
No GPUPool field takes one, so it is refused at the door, naming the parameter where it
can (Django's and DRF's own CharFields refuse it too, but lookups and filters do not).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from portal.errors import error_page

NUL = "\x00"
MESSAGE = "Null characters are not allowed."
# A JSON body spells NUL as an escape; a raw NUL byte is refused in any body.
BODY_MARKERS = (b"\x00", b"\\u0000")


def _fields_with_nul(request: HttpRequest) -> list[str]:
    fields = [
        name for name, values in request.GET.lists() if NUL in name or any(NUL in v for v in values)
    ]
    if request.method in {"POST", "PUT", "PATCH", "DELETE"}:
        if request.content_type in {"application/x-www-form-urlencoded", "multipart/form-data"}:
            fields += [n for n, vs in request.POST.lists() if NUL in n or any(NUL in v for v in vs)]
        elif any(marker in request.body for marker in BODY_MARKERS):
            fields.append("non_field_errors")
    return fields


class RefuseNullCharactersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        fields = _fields_with_nul(request)
        if not fields:
            return self.get_response(request)
        if request.path.startswith(("/api/", "/k8s/")):
            return JsonResponse({field: [MESSAGE] for field in fields}, status=400)
        return error_page(request, 400, f"{MESSAGE} ({', '.join(fields)})")
