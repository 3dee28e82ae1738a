"""{% sso_provider %}: the identity provider's name when single sign-on is on, else ''."""

from django import template
from django.conf import settings

register = template.Library()


@register.simple_tag
def sso_provider() -> str:
    return settings.GPUPOOL_OIDC_PROVIDER_NAME if settings.GPUPOOL_OIDC_ISSUER else ""
