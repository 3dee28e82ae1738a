"""The door work made in a cluster comes in by: pods made outside GPUPool (kubectl, Helm, an
operator) that name its scheduler, grouped by clusters/native.py, are queued here with the
checks every submit gets. Imports nothing of clusters (tests/test_app_boundaries.py)."""

from __future__ import annotations

from typing import Any

from portal.errors import ValidationFailed
from portal.models import Project
from scheduling.kept import reads_kept as intake_pass
from scheduling.models import Workload
from scheduling.services import Checked, workload_check, workloads_create_checked

# `with intake_pass():` the submits of one intake pass read what they share once (the
# nodes' sizes, the pools' names, each project's policy).
__all__ = ["Checked", "intake_pass", "workload_check_native", "workloads_submit_native"]


def workload_check_native(
    *, actor: Any, project: Project, kind: str, name: str, spec: dict, extra: dict, origin: str
) -> Checked:
    """Check the pods someone made in the project's namespace with our scheduler's name as
    any submit is checked (bounds, the project's policy); `extra` are fields the form has
    none for (the cluster its pods are on, Workload.spec["native"]); `origin` says where it
    came from, in its first event. The namespace is the project's, so there is no
    permission to check: who may create pods there is the cluster's RBAC. The caller chose
    a name it read free in the project. Raises ValidationFailed as a submit does; writes
    nothing (`workloads_submit_native` queues what passed, together)."""
    return workload_check(
        actor, project, kind, name, spec, extra=extra, origin=origin, name_free=True
    )


def workloads_submit_native(
    *, actor: Any, checked: list[Checked]
) -> list[Workload | ValidationFailed]:
    """Queue the checked submits of one intake pass together (a few statements for all);
    each answer is its workload, or why it was refused (a name taken meanwhile)."""
    return workloads_create_checked(actor, checked)
