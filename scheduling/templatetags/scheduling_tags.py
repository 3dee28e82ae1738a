"""Template tags for pages of other apps that show scheduling data."""

from __future__ import annotations

from typing import Any

from django import template

from scheduling.selectors import project_usage as _project_usage

register = template.Library()


@register.simple_tag
def project_usage(project: Any) -> dict[str, Any]:
    """Per-pool deserved, limit, fair share and allocated GPUs of a project."""
    return _project_usage(project)
