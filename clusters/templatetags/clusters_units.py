"""Sizes kept in MiB (nodes, GPUs, requests) shown in the unit a person reads them in.

Django's filesizeformat takes bytes: given MiB it showed a 1 TiB node as "1.0 MB".
"""

from __future__ import annotations

from django import template

register = template.Library()
UNITS = (("TiB", 1024 * 1024), ("GiB", 1024))


@register.filter
def mib(value: object) -> str:
    """81920 -> '80 GiB', 24064 -> '23.5 GiB', 1048576 -> '1 TiB', 512 -> '512 MiB'."""
    try:
        amount = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    for unit, size in UNITS:
        if abs(amount) >= size:
            return f"{round(amount / size, 1):g} {unit}"
    return f"{round(amount, 1):g} MiB"
