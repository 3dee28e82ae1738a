"""django.contrib.admin with GPUPool's site (portal.admin_site); INSTALLED_APPS names this
class. Apart from the site's module so that loading the apps imports no model."""

from django.contrib.admin.apps import AdminConfig


class PortalAdminConfig(AdminConfig):
    default_site = "portal.admin_site.PortalAdminSite"
