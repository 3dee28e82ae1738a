"""Say what is simulated: pages that chart or sum GPU use name the simulated clusters
whose numbers are in them, since the simulator makes those numbers up."""

from __future__ import annotations

from typing import Any

from django import template

from clusters.models import Backend, Cluster

register = template.Library()


@register.inclusion_tag("clusters/_simulated_notice.html")
def simulated_notice(what: str = "these numbers") -> dict[str, Any]:
    """A notice naming the enabled simulated clusters (nothing when there are none)."""
    names = Cluster.objects.filter(backend=Backend.SIMULATED, enabled=True).values_list(
        "name", flat=True
    )
    return {"names": list(names), "what": what}
