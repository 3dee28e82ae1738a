"""The door work made in a cluster comes in by: pods made outside GPUPool (kubectl, Helm, an
operator) that name its scheduler, grouped by clusters/native.py, are queued here with the
checks every submit gets. Imports nothing of clusters (tests/test_app_boundaries.py)."""

from __future__ import annotations

from typing import Any

from portal.models import Project
from scheduling.kept import reads_kept as intake_pass
from scheduling.models import Workload
from scheduling.services import workload_create_checked

# `with intake_pass():` the submits of one intake pass read what they share once (the
# nodes' sizes, the pools' names, each project's policy).
__all__ = ["intake_pass", "workload_submit_native"]


def workload_submit_native(
    *, actor: Any, project: Project, kind: str, name: str, spec: dict, extra: dict, origin: str
) -> Workload:
    """Queue the pods someone made in the project's namespace with our scheduler's name:
    checked as any submit (bounds, the project's policy, a name free in the project);
    `extra` are fields the form has none for (the cluster its pods are on,
    Workload.spec["native"]); `origin` says where it came from, in its first event. The
    namespace is the project's, so there is no permission to check: who may create pods
    there is the cluster's RBAC. The caller chose a name it read free in the project.
    Raises ValidationFailed as a submit does."""
    return workload_create_checked(
        actor, project, kind, name, spec, extra=extra, origin=origin, name_free=True
    )
