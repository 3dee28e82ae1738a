"""Writes on workloads: submit, stop, delete, and the policies that govern them.

Every service takes the acting user as `actor=`, checks permissions, writes an audit row
in the same transaction, and asks for a scheduling cycle only once the change commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from portal.audit import audit_entry, audit_log, audit_log_many, snapshot
from portal.errors import ValidationFailed
from portal.models import AuditLog, Department, Project
from portal.permissions import can_admin_department, can_admin_project, can_submit_to_project
from scheduling import bounds, sweeps
from scheduling.isolation import isolation_errors
from scheduling.kept import kept
from scheduling.lifecycle import workload_event, workload_transition
from scheduling.models import (
    FINISHED_STATES,
    PriorityClass,
    Workload,
    WorkloadEvent,
    WorkloadKind,
    WorkloadPolicy,
    WorkloadState,
)
from scheduling.policies import FIELDS as POLICY_FIELDS
from scheduling.policies import apply_defaults, effective_policy, policy_errors
from scheduling.signals import clusters_reconcile, cycle_request
from scheduling.specs import clean_spec

# Policy numbers and the bound each must keep.
POLICY_BOUNDS = {
    "max_gpus_per_workload": bounds.POLICY_GPUS,
    "default_runtime_s": bounds.RUNTIME_S,
    "max_runtime_s": bounds.RUNTIME_S,
    "termination_grace_s": bounds.GRACE_S,
}
AUDIT_FIELDS = ["kind", "name", "image", "gpus", "pods", "priority_class", "preemptible", "state"]


def workload_submit(*, actor: Any, project: Project, kind: str, name: str, **spec: Any) -> Workload:
    """Validate, apply the project's policy and queue a new workload (Pending).

    An HPO sweep also creates its trials, each a training workload with its parameters
    in its environment; the cycle admits at most `parallelism` of them at once.
    """
    if not can_submit_to_project(actor, project):
        raise PermissionDenied(f"You may not submit work to project {project.name}.")
    name = (name or "").strip()
    return workload_create_checked(actor, project, kind, name, spec)


def workload_create_checked(
    actor: Any, project: Project, kind: str, name: str, spec: dict, **check: Any
) -> Workload:
    """Create a workload after the checks every submit gets (`workload_check`, whose
    options `check` are), whoever asked (permission is the caller's)."""
    return _create_refusing_taken(actor, workload_check(actor, project, kind, name, spec, **check))


@dataclass(frozen=True, slots=True)
class Checked:
    """A submit that passed every check, not yet written: its row's fields."""

    project: Project
    kind: str
    name: str
    fields: dict[str, Any]
    origin: str


def workload_check(
    actor: Any,
    project: Project,
    kind: str,
    name: str,
    spec: dict,
    *,
    extra: dict | None = None,
    origin: str = "",
    name_free: bool = False,
) -> Checked:
    """The checks every submit gets (bounds, the project's policy, a name free in the
    project), writing nothing; raises ValidationFailed. `extra` are fields the form has
    none for (its `spec` merged into the checked one); `origin` says where the submit came
    from, in its first event. `name_free`: the caller chose a name it read free (a native
    intake pass reads the names of all its groups at once); a name taken meanwhile is
    still refused, by the table's unique constraint, when the row is written."""
    fields, errors = clean_spec(kind, name, spec)
    if not errors:
        policy = kept(("policy", project.pk), lambda: effective_policy(project))
        apply_defaults(policy, fields)
        errors = policy_errors(policy, kind, fields) or isolation_errors(actor, fields)
    if "name" not in errors and not (name_free and kind != WorkloadKind.HPO):
        _check_names_free(project, name, kind, fields, errors)
    if errors:
        raise ValidationFailed(errors)
    extra = dict(extra or {})
    fields["spec"] = {**fields.get("spec", {}), **extra.pop("spec", {})}
    return Checked(project, kind, name, {**fields, **extra}, origin)


def workloads_create_checked(
    actor: Any, submits: list[Checked]
) -> list[Workload | ValidationFailed]:
    """Create many checked submits of one actor together (a native intake pass queues up to
    thousands): one INSERT each for the rows, their first events and their audit rows, in
    one transaction, and one cycle asked for. Each answer is the workload, or why it was
    refused: a name taken since it was read free refuses that submit alone (the batch is
    then written one by one). A sweep (its trials) goes one by one too, as does everything
    where the database gives no primary keys back from a bulk INSERT."""
    one_by_one = not connection.features.can_return_rows_from_bulk_insert  # no pks back
    if one_by_one or len(submits) < 2 or any(s.kind == WorkloadKind.HPO for s in submits):
        return [_created_or_refused(actor, s) for s in submits]
    rows = [_row(actor, s) for s in submits]
    try:
        with transaction.atomic():
            Workload.objects.bulk_create(rows)
            WorkloadEvent.objects.bulk_create(
                _submitted(row, s.origin, actor) for row, s in zip(rows, submits, strict=True)
            )
            audit_log_many([_audit_submit(actor, row) for row in rows])
    except DatabaseError:
        # A name taken since its check, or a row the database refuses: one by one, so
        # that only that submit fails (as it did when each was its own submit).
        return [_created_or_refused(actor, s) for s in submits]
    cycle_request()
    return list(rows)


def _created_or_refused(actor: Any, checked: Checked) -> Workload | ValidationFailed:
    try:
        return _create_refusing_taken(actor, checked)
    except ValidationFailed as exc:
        return exc


def _create_refusing_taken(actor: Any, checked: Checked) -> Workload:
    try:
        with transaction.atomic():
            return _create(actor, checked)
    except IntegrityError as exc:  # a concurrent submit took the name between check and insert
        raise ValidationFailed(
            {"name": [f"{checked.name} is already taken in {checked.project.name}."]}
        ) from exc


def _check_names_free(
    project: Project, name: str, kind: str, fields: dict, errors: dict[str, list[str]]
) -> None:
    """The name, and for a sweep its trials' names, must be free in the project."""
    names = [name]
    if kind == WorkloadKind.HPO and "search" not in errors:
        names += [trial_name(name, i) for i in range(sweeps.trial_count(fields["spec"]["search"]))]
    taken = set(
        Workload.objects.filter(project=project, name__in=names).values_list("name", flat=True)
    )
    if name in taken:
        errors["name"] = [f"Project {project.name} already has a workload named {name}."]
    elif taken:
        first = min(taken, key=names.index)
        errors["name"] = [
            f"Project {project.name} already has a workload named {first}, "
            "a name this sweep's trials need."
        ]


def trial_name(sweep_name: str, index: int) -> str:
    return f"{sweep_name}-trial-{index}"


def _row(actor: Any, checked: Checked) -> Workload:
    """The new row, not yet written (its version a fresh one, from the field's default)."""
    return Workload(
        project=checked.project,
        submitted_by=actor,
        kind=checked.kind,
        name=checked.name,
        queued_at=timezone.now(),
        **checked.fields,
    )


def _submitted(workload: Workload, origin: str, actor: Any) -> WorkloadEvent:
    return WorkloadEvent(
        workload=workload, type="pending", reason="Submitted", message=origin or f"By {actor}."
    )


def _audit_submit(actor: Any, workload: Workload) -> AuditLog:
    return audit_entry(
        actor=actor,
        action="workload.submit",
        obj=workload,
        after=snapshot(workload, AUDIT_FIELDS),
        department=workload.project.department,
    )


def _create(actor: Any, checked: Checked) -> Workload:
    workload = _row(actor, checked)
    workload.save(force_insert=True)
    _submitted(workload, checked.origin, actor).save(force_insert=True)
    if checked.kind == WorkloadKind.HPO:
        _create_trials(workload)
    audit_log_many([_audit_submit(actor, workload)])
    cycle_request()
    return workload


def _create_trials(sweep: Workload) -> None:
    search = sweep.spec["search"]
    copied = {
        f.name: getattr(sweep, f.name)
        for f in Workload._meta.concrete_fields
        if f.name
        not in ("id", "kind", "name", "env", "spec", "parent", "state", "created_at", "queued_at")
    }
    trials = [
        Workload(
            **copied,
            kind=WorkloadKind.TRAINING,
            parent=sweep,
            name=trial_name(sweep.name, index),
            env=sweeps.trial_env(sweep.env, index, params),
            spec={"params": params, "trial": index, **_trial_extras(sweep.spec)},
            state=WorkloadState.PENDING,
            queued_at=sweep.queued_at,
        )
        for index, params in enumerate(sweeps.trial_params(search))
    ]
    Workload.objects.bulk_create(trials)
    for trial in Workload.objects.filter(parent=sweep):
        workload_event(trial, type="pending", reason="Submitted", message=f"Trial of {sweep}.")


def _trial_extras(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k in ("duration_s", "ports")}


def workload_stop(
    *, actor: Any, workload: Workload, reason: str = "StoppedByUser", message: str = ""
) -> Workload:
    """Stop a workload (and a sweep's trials). Its GPUs stay held until the cluster
    confirms its pods are gone; reconciliation then releases them.

    `actor=None` is the system itself (idle culling, a policy): no permission to check,
    and the audit row has no actor but says why (`reason`, `message`).
    """
    if actor is not None and not can_submit_to_project(actor, workload.project):
        raise PermissionDenied("You may not stop work in this project.")
    with transaction.atomic():
        # Locked, then read again: reconciliation may have finished it meanwhile, and a
        # stop must not overwrite that (reconcile locks the same row).
        Workload.objects.select_for_update().filter(pk=workload.pk).first()
        workload.refresh_from_db()
        if workload.state in FINISHED_STATES:
            raise ValidationFailed({"state": [f"{workload.name} has already {workload.state}."]})
        before = snapshot(workload, AUDIT_FIELDS)
        text = message or f"By {'the system' if actor is None else actor.username}."
        for stopped in [*workload.children.exclude(state__in=FINISHED_STATES), workload]:
            workload_transition(stopped, WorkloadState.STOPPED, reason=reason, message=text)
            # Kept on the row too: the home page, lists and `describe` say why it stopped.
            stopped.message = text[:1000]
            stopped.save(update_fields=["message"])
        audit_log(
            actor=actor,
            action="workload.stop",
            obj=workload,
            before=before,
            after={**snapshot(workload, AUDIT_FIELDS), "reason": reason, "message": text},
            department=workload.project.department,
        )
        _after_commit_reconcile(workload)
    return workload


def _after_commit_reconcile(workload: Workload) -> None:
    cluster_ids = set(workload.allocations.values_list("node__cluster_id", flat=True)) | set(
        Workload.objects.filter(parent=workload).values_list(
            "allocations__node__cluster_id", flat=True
        )
    )
    clusters_reconcile(cluster_ids)
    cycle_request()


def workload_delete(*, actor: Any, workload: Workload) -> None:
    """Delete a finished (or never admitted) workload and its history."""
    if not can_submit_to_project(actor, workload.project):
        raise PermissionDenied("You may not delete work in this project.")
    if workload.state not in (*FINISHED_STATES, WorkloadState.PENDING):
        raise ValidationFailed({"state": [f"Stop {workload.name} before deleting it."]})
    busy = Workload.objects.filter(pk=workload.pk) | workload.children.all()
    if busy.filter(allocations__isnull=False).exists():
        raise ValidationFailed({"state": [f"The pods of {workload.name} are still stopping."]})
    if workload.children.exclude(state__in=(*FINISHED_STATES, WorkloadState.PENDING)).exists():
        raise ValidationFailed({"state": [f"Stop the trials of {workload.name} first."]})
    with transaction.atomic():
        audit_log(
            actor=actor,
            action="workload.delete",
            obj=workload,
            before=snapshot(workload, AUDIT_FIELDS),
            department=workload.project.department,
        )
        workload.delete()


def policy_set(
    *,
    actor: Any,
    project: Project | None = None,
    department: Department | None = None,
    **values: Any,
) -> WorkloadPolicy:
    """Create or change the workload policy of one project or one department."""
    if (project is None) == (department is None):
        raise ValidationFailed("Set a policy on exactly one project or one department.")
    allowed = (
        can_admin_project(actor, project) if project else can_admin_department(actor, department)
    )
    if not allowed:
        raise PermissionDenied("Only the department's administrators may change its policies.")
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise ValidationFailed({"__all__": [f"Unknown policy fields: {', '.join(unknown)}."]})
    _check_policy(values)
    with transaction.atomic():
        policy, _ = WorkloadPolicy.objects.get_or_create(project=project, department=department)
        before = snapshot(policy, list(POLICY_FIELDS))
        for name, value in values.items():
            setattr(policy, name, value)
        policy.save()
        audit_log(
            actor=actor,
            action="policy.set",
            obj=policy,
            before=before,
            after=snapshot(policy, list(POLICY_FIELDS)),
            department=department or project.department,
        )
    return policy


def _check_policy(values: dict[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    kinds = values.get("allowed_kinds") or []
    if set(kinds) - set(WorkloadKind.values):
        errors["allowed_kinds"] = [f"Kinds are among {', '.join(WorkloadKind)}."]
    classes = values.get("preemptible_classes") or []
    if set(classes) - set(PriorityClass.values):
        errors["preemptible_classes"] = [f"Classes are among {', '.join(PriorityClass)}."]
    for field, bound in POLICY_BOUNDS.items():
        if values.get(field) is not None and (error := bound.check(values[field])[1]):
            errors[field] = [error]
    default, cap = values.get("default_runtime_s"), values.get("max_runtime_s")
    if default and cap and not errors and default > cap:
        errors["default_runtime_s"] = ["The default runtime cannot exceed the maximum."]
    if errors:
        raise ValidationFailed(errors)
