"""Root URLs. Each app owns its own urls.py (pages) and api_urls.py (REST, under /api/v1/)."""

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from clusters.webhook import pods_admission
from portal import api_schema  # noqa: F401 - registers the API's token schemes for the schema
from portal.throttles import sign_in_throttled
from scheduling.api import ApiDocsView

# The styled error pages (portal/errors.py), JSON under /api/.
handler400 = "portal.errors.bad_request"
handler403 = "portal.errors.permission_denied"
handler404 = "portal.errors.page_not_found"
handler500 = "portal.errors.server_error"

urlpatterns = [
    path("django-admin/login/", sign_in_throttled(admin.site.login), name="admin-login"),
    path("django-admin/", admin.site.urls),
    path("oidc/", include("mozilla_django_oidc.urls")),  # single sign-on (portal/sso.py)
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", login_required(ApiDocsView.as_view()), name="api-docs"),
    path("api/v1/", include("portal.api_urls")),
    path("api/v1/", include("scheduling.api_urls")),
    path("api/v1/", include("clusters.api_urls")),
    path("api/v1/", include("workspaces.api_urls")),
    path("api/v1/", include("clusters.metrics.api_urls")),
    # kube-apiserver's call to the pod webhook (clusters/webhook.py): no session, no CSRF.
    path("k8s/admission/<uuid:cluster_uid>/pods/", pods_admission, name="pods_admission"),
    path("workloads/", include("scheduling.urls")),
    path("clusters/", include("clusters.urls")),
    path("workspaces/", include("workspaces.urls")),
    path("", include("clusters.metrics.urls")),
    path("", include("portal.org_urls")),
]
