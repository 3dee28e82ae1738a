"""Environments, templates and idle policies are also editable in Django's admin."""

from __future__ import annotations

from django.contrib import admin

from workspaces.models import Environment, IdlePolicy, WorkspaceTemplate

admin.site.register(Environment)
admin.site.register(WorkspaceTemplate)
admin.site.register(IdlePolicy)
