"""What the cycle knows of elastic workloads: their submitted form and size changes.

Kept apart from actions/elastic.py so that the Context can hold it without importing
the actions (which import the Context).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.engine.state import PodSlot
from scheduling.engine.types import Workload


@dataclass(slots=True, eq=False)
class Change:
    """Pods one workload gained and lost this cycle (slots, as placed)."""

    added: list[PodSlot] = field(default_factory=list)
    removed: list[PodSlot] = field(default_factory=list)
    beneficiary: str | None = None


@dataclass(slots=True, eq=False)
class Book:
    """The cycle's elastic workloads as submitted, and how each changed size."""

    originals: dict[str, Workload] = field(default_factory=dict)
    changes: dict[str, Change] = field(default_factory=dict)


def fixed_slots(wl: Workload, slots: list[PodSlot]) -> list[PodSlot]:
    """The slots that count as non-preemptible work: none for preemptible work, and only
    the minimum of an elastic workload (its extras may always be taken back)."""
    if wl.preemptible:
        return []
    if not wl.elastic:
        return slots
    return sorted(slots, key=lambda slot: slot.pod)[: wl.gang_min]
