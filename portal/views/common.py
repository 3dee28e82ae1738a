"""Small helpers the organisation's pages share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template

from portal.errors import ValidationFailed
from portal.forms import show_errors


def posted(request: HttpRequest) -> Any:
    """The POST data for a bound form, or None on GET (an unbound form)."""
    return request.POST if request.method == "POST" else None


def optional_template(name: str) -> str | None:
    """The template's name if some app provides it; pages include such partials only then."""
    try:
        get_template(name)
    except TemplateDoesNotExist:
        return None
    return name


def form_saved(
    request: HttpRequest,
    form: Any,
    save: Callable[[], Any],
    *,
    message: Callable[[Any], str],
    then: Callable[[Any], HttpResponse],
    show: Callable[[Any, ValidationFailed], None] = show_errors,
) -> HttpResponse | None:
    """Post a valid form to its service: a success message and the next page, or None when
    the page must be shown again (not posted, invalid, or refused with the reasons on the form).

    `save` runs the service; `message` and `then` get what it returned.
    """
    # A quota table with no pools is valid even unposted, so posting is checked, not assumed.
    if request.method != "POST" or not form.is_valid():
        return None
    try:
        result = save()
    except ValidationFailed as exc:
        show(form, exc)
        return None
    messages.success(request, message(result))
    return then(result)


def refusal(exc: ValidationFailed) -> str:
    """A service's refusal as one sentence for a flash message."""
    return " ".join(exc.errors.get("__all__", [str(exc)]))


def confirmed(
    request: HttpRequest,
    page: tuple[str, dict[str, Any]],
    act: Callable[[], Any],
    *,
    message: str,
    then: HttpResponse,
    back: HttpResponse,
) -> HttpResponse:
    """A destructive action behind a confirmation page: GET shows `page` (template, context),
    POST runs `act`; a refusal is flashed and leads `back`, success leads to `then`."""
    if request.method != "POST":
        return render(request, *page)
    try:
        act()
    except ValidationFailed as exc:
        messages.error(request, refusal(exc))
        return back
    messages.success(request, message)
    return then
