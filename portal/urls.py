"""Root URLs. Each app owns its own urls.py (pages) and api_urls.py (REST, under /api/v1/)."""

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from scheduling.api import ApiDocsView

urlpatterns = [
    path("django-admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),  # single sign-on (portal/sso.py)
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", login_required(ApiDocsView.as_view()), name="api-docs"),
    path("api/v1/", include("portal.api_urls")),
    path("api/v1/", include("scheduling.api_urls")),
    path("api/v1/", include("clusters.api_urls")),
    path("api/v1/", include("workspaces.api_urls")),
    path("api/v1/", include("clusters.metrics.api_urls")),
    path("workloads/", include("scheduling.urls")),
    path("clusters/", include("clusters.urls")),
    path("workspaces/", include("workspaces.urls")),
    path("", include("clusters.metrics.urls")),
    path("", include("portal.org_urls")),
]
