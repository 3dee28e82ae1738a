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


@register.filter
def duration(seconds: Any) -> str:
    """3725 -> '1 h 2 min', 75 -> '1 min 15 s', None -> a dash: how long something has run."""
    if seconds in (None, ""):
        return "\u2013"  # an en dash: no value
    total = int(seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
