"""Submission policies: what a project's (or its department's) admins allow.

A project's policy overrides its department's field by field; a field neither sets
falls back to the defaults below. Violations name the rule and where it was set.
The termination grace period falls back to the cluster's (`clusters.reconcile`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404

from portal.models import Department, Project
from portal.permissions import can_admin_department, visible_projects
from portal.selectors import department_list_for_user
from scheduling.models import GpuRequestKind, WorkloadPolicy
from scheduling.specs import DEFAULT_PREEMPTIBLE_CLASSES, range_fields

if TYPE_CHECKING:
    from collections.abc import Iterable

FIELDS = (
    "max_gpus_per_workload",
    "allowed_kinds",
    "default_runtime_s",
    "max_runtime_s",
    "preemptible_classes",
    "termination_grace_s",
)
RULE_NAMES = {
    "max_gpus_per_workload": "max GPUs per workload",
    "allowed_kinds": "allowed kinds",
    "max_runtime_s": "max runtime",
    "preemptible_classes": "preemptible classes",
    "termination_grace_s": "termination grace period",
}


@dataclass(frozen=True)
class EffectivePolicy:
    max_gpus_per_workload: Decimal | None = None
    allowed_kinds: list[str] | None = None
    default_runtime_s: int | None = None
    max_runtime_s: int | None = None
    preemptible_classes: list[str] = field(
        default_factory=lambda: [str(c) for c in DEFAULT_PREEMPTIBLE_CLASSES]
    )
    # None: the cluster's default (Cluster.config grace_period_s) applies.
    termination_grace_s: int | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def rule(self, name: str) -> str:
        """'max runtime' of project ml-vision — how a refusal names the rule."""
        return f"policy '{RULE_NAMES[name]}' of {self.sources.get(name, 'the platform')}"


def policy_owner(user: Any, scope: str, pk: int) -> Department | Project:
    """The department or project whose policy `user` manages. Http404 for one he may not
    see, as for one that does not exist (a 403 told him it exists); PermissionDenied for
    one he sees but does not administer."""
    if scope == "department":
        owner: Department | Project = get_object_or_404(department_list_for_user(user), pk=pk)
        department = owner
    elif scope == "project":
        owner = get_object_or_404(visible_projects(user).select_related("department"), pk=pk)
        department = owner.department
    else:
        raise Http404("Policies belong to a department or a project.")
    if not can_admin_department(user, department):
        raise PermissionDenied("Only the department's administrators manage its policies.")
    return owner


def effective_policy(project: Project) -> EffectivePolicy:
    """The project's policy merged over its department's over the defaults."""
    return effective_policies([project])[project.pk]


def effective_policies(projects: Iterable[Project]) -> dict[int, EffectivePolicy]:
    """Project id -> its effective policy: one query whatever the number of projects
    (the launch forms show the limits of every project the user may submit to)."""
    projects = list(projects)
    rows = WorkloadPolicy.objects.filter(
        Q(project_id__in=[p.pk for p in projects])
        | Q(department_id__in={p.department_id for p in projects})
    )
    own = {r.project_id: r for r in rows if r.project_id is not None}
    inherited = {r.department_id: r for r in rows if r.project_id is None}
    return {
        p.pk: _merged(
            (
                ("department", p.department.name, inherited.get(p.department_id)),
                ("project", p.name, own.get(p.pk)),
            )
        )
        for p in projects
    }


def _merged(layers: Iterable[tuple[str, str, WorkloadPolicy | None]]) -> EffectivePolicy:
    """Policies from the widest scope to the narrowest: a set field wins over the ones before."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for scope, owner, row in layers:
        for name in FIELDS if row else ():
            value = getattr(row, name)
            if value is not None and value != []:
                values[name] = value
                sources[name] = f"{scope} {owner}"
    return EffectivePolicy(**values, sources=sources)


def termination_grace_periods(projects: Iterable[Project]) -> dict[int, int]:
    """Project id -> seconds between SIGTERM and SIGKILL, for the projects whose policy
    (or whose department's) sets one; the others get the cluster's default. One query
    whatever the number of projects: reconciliation asks for every pod it deletes."""
    by_project = {p.pk: p.department_id for p in projects}
    rows = WorkloadPolicy.objects.filter(termination_grace_s__isnull=False).filter(
        Q(project_id__in=by_project) | Q(department_id__in=set(by_project.values()))
    )
    own, inherited = {}, {}
    for row in rows.values("project_id", "department_id", "termination_grace_s"):
        if row["project_id"] is not None:
            own[row["project_id"]] = row["termination_grace_s"]
        else:
            inherited[row["department_id"]] = row["termination_grace_s"]
    graces = {pid: inherited[dept] for pid, dept in by_project.items() if dept in inherited}
    graces.update(own)
    return graces


def workload_gpus(fields: dict[str, Any]) -> Decimal:
    """GPUs a workload holds at most: a pod asking for GPU memory counts as one device."""
    per_pod = fields.get("gpus") or Decimal(0)
    if fields.get("gpu_request") == GpuRequestKind.MEMORY:
        per_pod = Decimal(1)
    return per_pod * int(fields.get("pods") or 1)


def policy_errors(policy: EffectivePolicy, kind: str, fields: dict[str, Any]) -> dict[str, list]:
    """Refusals per field, each naming the rule that refuses."""
    errors: dict[str, list[str]] = {}
    if policy.allowed_kinds and kind not in policy.allowed_kinds:
        allowed = ", ".join(policy.allowed_kinds)
        errors["kind"] = [f"Refused by {policy.rule('allowed_kinds')}: only {allowed}."]
    cap, asked = policy.max_gpus_per_workload, workload_gpus(fields)
    if cap is not None and asked > cap:
        # An elastic workload's maximum is what asks too much: name the field that sets it.
        name = range_fields(kind)[1] if fields.get("elastic") else "gpus"
        name = "max_gpus" if fields.get("min_gpus") is not None else name
        at_most = " at its maximum" if fields.get("elastic") else ""
        errors[name] = [
            f"Refused by {policy.rule('max_gpus_per_workload')}: this workload asks for "
            f"{asked.normalize():f} GPUs{at_most}, at most {cap.normalize():f} are allowed."
        ]
    runtime = fields.get("max_runtime_s")
    if policy.max_runtime_s and runtime and runtime > policy.max_runtime_s:
        errors["max_runtime_s"] = [
            f"Refused by {policy.rule('max_runtime_s')}: at most {policy.max_runtime_s} s."
        ]
    if fields.get("preemptible") is False and fields["priority_class"] in (
        policy.preemptible_classes
    ):
        errors["preemptible"] = [
            f"Refused by {policy.rule('preemptible_classes')}: "
            f"{fields['priority_class']} workloads may be preempted here."
        ]
    return errors


def apply_defaults(policy: EffectivePolicy, fields: dict[str, Any]) -> None:
    """Fill what the submitter left to the policy: preemptible and max runtime."""
    if fields.get("preemptible") is None:
        fields["preemptible"] = fields["priority_class"] in policy.preemptible_classes
    if not fields.get("max_runtime_s"):
        # A default set in one place (a project) never exceeds a maximum set in another
        # (its department): what nobody asked for must not be refused.
        limits = [v for v in (policy.default_runtime_s, policy.max_runtime_s) if v]
        fields["max_runtime_s"] = min(limits) if limits else None
