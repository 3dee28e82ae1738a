"""Small helpers the organisation's pages share."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.template import TemplateDoesNotExist
from django.template.loader import get_template


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
