"""Environments, templates and idle policies are also editable in Django's admin."""

from __future__ import annotations

from django.contrib import admin

from portal.admin import AuditedAdmin
from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate

admin.site.register(Environment, AuditedAdmin)
admin.site.register(WorkspaceTemplate, AuditedAdmin)
admin.site.register(IdlePolicy, AuditedAdmin)
