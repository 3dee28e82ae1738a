"""HTML forms. They check types; the services check the rules and their messages come back
onto the right field through `show_errors`."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth.forms import PasswordResetForm

from clusters.manifest_kinds import platform_kinds
from clusters.models import Cluster, NodePool, PlacementStrategy
from portal import quota_rules
from portal.errors import ValidationFailed
from portal.models import Department, Project, Role, User
from portal.permissions import departments_for_admin, is_platform_admin, visible_projects
from portal.selectors import QuotaRow
from scheduling.bounds import date_error


def show_errors(form: forms.Form, exc: ValidationFailed) -> None:
    """Put a service's messages on the form's fields, or above the form if it has no such field."""
    for field, messages in exc.errors.items():
        for message in messages:
            form.add_error(field if field in form.fields else None, message)


class DepartmentForm(forms.Form):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class ProjectForm(forms.Form):
    department = forms.ModelChoiceField(queryset=Department.objects.none())
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and '-'.")
    namespace = forms.CharField(
        max_length=63, required=False, help_text="Kubernetes namespace; empty = gpupool-<name>."
    )
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    nonpreemptible_over_quota = forms.BooleanField(
        required=False,
        label="Non-preemptible work may go over quota",
        help_text="Off: non-preemptible workloads start only within the project's deserved"
        " quota, since nothing can evict them to give borrowed GPUs back. Platform admins only.",
    )
    enforce_scheduler = forms.BooleanField(
        required=False,
        label="Every pod in the namespace uses GPUPool's scheduler",
        help_text="Pods made in the project's namespace by kubectl, Helm or an operator are"
        " queued under this project's quota, as if they named GPUPool's scheduler (needs the"
        " pod webhook of deploy/webhook/).",
    )

    manifest_kinds = forms.MultipleChoiceField(
        required=False,
        label="Kinds of manifests",
        widget=forms.CheckboxSelectMultiple,
        help_text='What members may create from YAML (`gpupool submit -f`, "From YAML"), '
        "among the kinds the platform allows. New projects: Pod and Job.",
    )

    def __init__(self, *args: Any, user: Any, editing: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["manifest_kinds"].choices = [(k, k) for k in platform_kinds()]
        self.fields["department"].queryset = departments_for_admin(user)
        if editing:  # moving a project between departments would break both quota sums
            self.fields["department"].disabled = True
        if not is_platform_admin(user):
            self.fields["nonpreemptible_over_quota"].disabled = True


class NodePoolForm(forms.Form):
    name = forms.CharField(max_length=63)
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), required=False)
    label_value = forms.CharField(
        max_length=63, required=False, help_text="Node-pool label value; empty = the pool's name."
    )
    placement = forms.ChoiceField(choices=PlacementStrategy.choices)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


# --- Quota tables -----------------------------------------------------------------------------


def _number(label: str, required: bool = True) -> forms.DecimalField:
    attrs = {"step": "0.01", "class": "num"}
    return forms.DecimalField(
        label=label, required=required, decimal_places=None, widget=forms.NumberInput(attrs)
    )


class QuotaRowForm(forms.Form):
    gpus = _number("GPUs")
    gpus_limit = _number("GPU limit", required=False)
    cpu = _number("CPU cores")
    cpu_limit = _number("CPU limit", required=False)
    memory_gib = _number("Memory GiB")
    memory_gib_limit = _number("Memory limit", required=False)
    over_quota_weight = _number("Over-quota weight")
    over_quota_allowed = forms.BooleanField(required=False, label="May go over quota")


def _plain(value: Any) -> Any:
    """Show 12 rather than 12.00 in the inputs."""
    return quota_rules.fmt(value) if isinstance(value, Decimal) else value


ROW_INITIAL = {"gpus": 0, "cpu": 0, "memory_gib": 0, "over_quota_weight": 1}


class QuotaTableForm:
    """One QuotaRowForm per node pool, posted and saved together."""

    def __init__(self, rows: list[QuotaRow], data: Mapping[str, Any] | None = None):
        self.rows = [(row.pool, self._row_form(row, data)) for row in rows]
        self.non_field_errors: list[str] = []

    @staticmethod
    def _row_form(row: QuotaRow, data: Mapping[str, Any] | None) -> QuotaRowForm:
        initial = dict(ROW_INITIAL, over_quota_allowed=True)
        if row.quota is not None:
            initial = {
                field: _plain(getattr(row.quota, field)) for field in QuotaRowForm.base_fields
            }
        return QuotaRowForm(data, prefix=f"pool-{row.pool.pk}", initial=initial)

    def is_valid(self) -> bool:
        return all(form.is_valid() for _pool, form in self.rows)

    def table(self) -> dict[NodePool, dict[str, Any]]:
        return {pool: dict(form.cleaned_data) for pool, form in self.rows}

    def show_errors(self, exc: ValidationFailed) -> None:
        """Service keys look like '<pool name>.<field>'; others go above the table."""
        forms_by_pool = {pool.name: form for pool, form in self.rows}
        for key, messages in exc.errors.items():
            pool_name, _, field = key.partition(".")
            form = forms_by_pool.get(pool_name)
            if form is not None and field in form.fields:
                for message in messages:
                    form.add_error(field, message)
            else:
                self.non_field_errors.extend(messages)


# --- People -----------------------------------------------------------------------------------


class InviteForm(forms.Form):
    email = forms.EmailField()
    username = forms.CharField(max_length=150, required=False, help_text="Empty = from e-mail.")
    first_name = forms.CharField(max_length=150, required=False)
    last_name = forms.CharField(max_length=150, required=False)
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False)
    role = forms.ChoiceField(
        choices=[(Role.RESEARCHER, "Researcher"), (Role.VIEWER, "Viewer")], initial=Role.RESEARCHER
    )
    is_platform_admin = forms.BooleanField(required=False, label="Platform admin")

    def __init__(self, *args: Any, user: Any, platform: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = visible_projects(user).filter(
            department__in=departments_for_admin(user)
        )
        self.fields["project"].required = not platform
        if not platform:
            del self.fields["is_platform_admin"]


class MembershipForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False)
    department = forms.ModelChoiceField(
        queryset=Department.objects.none(), required=False, help_text="For department admins."
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        departments = departments_for_admin(user)
        self.fields["department"].queryset = departments
        self.fields["project"].queryset = Project.objects.filter(department__in=departments)


class UserEditForm(forms.Form):
    first_name = forms.CharField(max_length=150, required=False)
    last_name = forms.CharField(max_length=150, required=False)
    email = forms.EmailField()
    is_platform_admin = forms.BooleanField(required=False, label="Platform admin")

    def __init__(self, *args: Any, platform: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not platform:
            del self.fields["is_platform_admin"]


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, label="Actor (username)")
    action = forms.ChoiceField(required=False)
    object_type = forms.ChoiceField(required=False, label="Object type")
    department = forms.ModelChoiceField(queryset=Department.objects.none(), required=False)
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, user: Any, choices: dict[str, list[str]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["department"].queryset = departments_for_admin(user)
        self.fields["action"].choices = [("", "any"), *((c, c) for c in choices["actions"])]
        self.fields["object_type"].choices = [
            ("", "any"),
            *((c, c) for c in choices["object_types"]),
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for name in ("since", "until"):  # a day past year 9999 cannot even be computed
            if error := date_error(data.get(name)):
                self.add_error(name, error)
        return data


class InvitedUsersPasswordResetForm(PasswordResetForm):
    """Django's reset form skips accounts without a usable password; an invited person who
    lost their invitation has exactly such an account, so it may ask for a new link too."""

    def get_users(self, email: str) -> Any:
        return User.objects.filter(email__iexact=email, is_active=True)
