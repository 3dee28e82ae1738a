"""GPUPool's scheduler: pure Python, no Django, Celery or Kubernetes import.

Entry point: schedule(snapshot, config, now) -> CycleResult; data model in types.
"""

from __future__ import annotations

from scheduling.engine.cycle import schedule

__all__ = ["schedule"]
