"""Django's admin (/django-admin/; platform admins and staff, portal.admin_site) writes the
same audit log as the portal.

Every ModelAdmin registered in the project derives from AuditedAdmin: adding, changing or
deleting a row there (one at a time, in bulk, or in an inline) records who did it, with
the row before and after, in the transaction that makes the change. The admins Django and
DRF register themselves (groups, API tokens) are registered again with it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from knox.admin import AuthTokenAdmin
from knox.models import AuthToken

from portal.audit import audit_log, snapshot
from portal.models import Department

PREFIX = "django-admin"


def _department(obj: Model) -> Department | None:
    """The department the row belongs to, when it has one (directly or by its project)."""
    for owner in (obj, getattr(obj, "project", None)):
        department = getattr(owner, "department", None)
        if isinstance(department, Department):
            return department
    return None


def _record(request: HttpRequest, verb: str, obj: Model, before: Any, after: Any) -> None:
    audit_log(
        actor=request.user,
        action=f"{PREFIX}.{obj._meta.model_name}.{verb}",
        obj=obj,
        before=before,
        after=after,
        department=_department(obj),
    )


class AuditedAdmin(admin.ModelAdmin):
    """A ModelAdmin whose every write is audited (see the module docstring)."""

    @transaction.atomic
    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        before = None
        if change and obj.pk is not None:
            stored = type(obj)._default_manager.filter(pk=obj.pk).first()
            before = snapshot(stored) if stored is not None else None
        super().save_model(request, obj, form, change)
        _record(request, "update" if change else "create", obj, before, snapshot(obj))

    @transaction.atomic
    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        before = snapshot(obj)
        _record(request, "delete", obj, before, None)
        super().delete_model(request, obj)

    @transaction.atomic
    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for obj in queryset:
            _record(request, "delete", obj, snapshot(obj), None)
        super().delete_queryset(request, queryset)

    @transaction.atomic
    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """Inline rows: each one added, changed or deleted is recorded too."""
        befores = {
            f.instance.pk: snapshot(type(f.instance)._default_manager.get(pk=f.instance.pk))
            for f in formset.forms
            if f.instance.pk is not None and f.has_changed()
        }
        super().save_formset(request, form, formset, change)
        for obj in formset.new_objects:
            _record(request, "create", obj, None, snapshot(obj))
        for obj, _fields in formset.changed_objects:
            _record(request, "update", obj, befores.get(obj.pk), snapshot(obj))
        for obj in formset.deleted_objects:
            _record(request, "delete", obj, snapshot(obj), None)


class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    pass


class AuditedTokenAdmin(AuditedAdmin, AuthTokenAdmin):
    """API tokens (hashed): an admin may issue one (shown once) or revoke one by deleting it."""


for model, model_admin in ((Group, AuditedGroupAdmin), (AuthToken, AuditedTokenAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
