"""The Django admin site at /django-admin/: a platform admin signed in to the portal is
let in with that session (no second sign-in, no `is_staff` flag to keep in step); anyone
else is refused as Django's admin refuses non-staff users."""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.http import HttpRequest

from portal.permissions import is_platform_admin


class PortalAdminSite(AdminSite):
    site_header = "GPUPool administration"
    site_title = "GPUPool admin"
    index_title = "Database tables"
    site_url = "/"

    def has_permission(self, request: HttpRequest) -> bool:
        return is_platform_admin(request.user) or super().has_permission(request)
