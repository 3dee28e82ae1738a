"""The project's exceptions share one base class, so callers can catch GPUPool's own;
and the pages a user sees when a request fails (400/403/404/500)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


class GPUPoolError(Exception):
    """Base of every GPUPool exception."""


class ValidationFailed(GPUPoolError):
    """A service refused input. `errors` maps a field name (or '__all__') to messages."""

    def __init__(self, errors: dict[str, list[str]] | str):
        if isinstance(errors, str):
            errors = {"__all__": [errors]}
        self.errors = errors
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))


# --- Error pages ------------------------------------------------------------------------------
# The handlers Django calls for 400/403/404/500 (portal/urls.py names them), and a middleware
# that shows the same pages under DEBUG to everyone but staff: Django's technical pages list
# settings, URL patterns and tracebacks, which a researcher must never see.

ERROR_TITLES = {
    400: "Bad request",
    403: "Forbidden",
    404: "Not found",
    429: "Too many requests",
    500: "Server error",
}


# What answers for an object a user may not see, as for one that does not exist: a page (or a
# workspace's link) with these words, and in the API DRF's own 404 body. One body per
# surface, whatever was not found: DRF's "No Workload matches the given query." named the
# model, and an unknown API address once answered with the page's words.
NOT_FOUND_MESSAGE = "There is nothing here, or nothing you may see."
API_NOT_FOUND = {"detail": str(NotFound.default_detail)}


def error_page(request: HttpRequest, status: int, message: str = "") -> HttpResponse:
    """The styled page (with the navigation), or JSON for the API; plain text if that fails."""
    if request.path.startswith(("/api/", "/k8s/")):  # /k8s/: kube-apiserver's webhook calls
        body = API_NOT_FOUND if status == 404 else {"detail": message or ERROR_TITLES[status]}
        # Compact, as DRF renders its own answers.
        return JsonResponse(body, status=status, json_dumps_params={"separators": (",", ":")})
    context = {"title": ERROR_TITLES[status], "message": message}
    try:
        return render(request, f"{status}.html", context, status=status)
    except Exception:
        # A page about a broken database must not need the database: no navigation then.
        logger.exception("Rendering the %s page failed", status)
        return HttpResponse(ERROR_TITLES[status], content_type="text/plain", status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 400, "The request could not be understood.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 403, str(exception or "") or "You may not open this page.")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return error_page(request, 404, NOT_FOUND_MESSAGE)


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF's handler (REST_FRAMEWORK's EXCEPTION_HANDLER), with one body for every 404."""
    return drf_exception_handler(NotFound() if isinstance(exc, Http404) else exc, context)


def server_error(request: HttpRequest) -> HttpResponse:
    return error_page(request, 500, "Something went wrong on our side; it has been logged.")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    return error_page(request, 403, "The form expired or came from elsewhere: reload and retry.")


class StyledErrorsUnderDebugMiddleware:
    """With DEBUG on, serve the styled error pages to all but staff (see above).

    A view's exception reaches process_exception; an unknown address never reaches a view,
    so it is resolved here first. With DEBUG off Django calls the handlers itself.
    """

    HANDLERS: dict[type[Exception], Callable[..., HttpResponse]] = {
        Http404: page_not_found,
        PermissionDenied: permission_denied,
        SuspiciousOperation: bad_request,
        BadRequest: bad_request,
    }

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self._styled(request):
            try:
                resolve(request.path_info, getattr(request, "urlconf", None))
            except Resolver404 as exc:
                # CommonMiddleware, outside this one, still redirects to the address with "/".
                return page_not_found(request, exc)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not self._styled(request):
            return None  # Django's own handling: technical pages under DEBUG, or our handlers
        for kind, handler in self.HANDLERS.items():
            if isinstance(exception, kind):
                return handler(request, exception)
        logger.error("Internal error on %s", request.path, exc_info=exception)
        return server_error(request)

    @staticmethod
    def _styled(request: HttpRequest) -> bool:
        user = getattr(request, "user", None)
        return settings.DEBUG and not (user is not None and user.is_staff)
