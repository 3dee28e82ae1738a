"""Single sign-on through OpenID Connect, on top of mozilla-django-oidc.

A login is matched to an account by its verified e-mail (case-insensitive), or makes one when
GPUPOOL_OIDC_CREATE_USERS allows; otherwise, and for deactivated accounts, it is refused with a
page that says why and a row in the audit log. Group claims then set the memberships that
GPUPOOL_OIDC_GROUP_ROLES governs (portal/sso_mapping.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.db import transaction
from django.http import Http404
from django.shortcuts import render
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from portal.audit import audit_log, snapshot
from portal.models import Department, Membership, Project, User
from portal.services.common import create_audited, save_audited
from portal.services.users import USER_FIELDS, _username_from
from portal.sso_mapping import claim_groups, desired_roles, verified_email

logger = logging.getLogger(__name__)

_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
REFUSAL_ATTRIBUTE = "gpupool_sso_refusal"


class SsoUnavailable(Exception):
    """The identity provider's discovery document cannot be read or does not fit."""


def enabled() -> bool:
    return bool(settings.GPUPOOL_OIDC_ISSUER)


def provider_metadata() -> dict[str, Any]:
    """The provider's discovery document, checked, and cached for an hour."""
    url = settings.GPUPOOL_OIDC_DISCOVERY_URL
    key = f"gpupool:oidc-discovery:{url}"
    if (cached := cache.get(key)) is not None:
        return cached
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise SsoUnavailable(f"cannot read {url}: {exc}") from None
    if not isinstance(document, dict) or document.get("issuer", "").rstrip("/") != (
        settings.GPUPOOL_OIDC_ISSUER
    ):
        raise SsoUnavailable(f"{url} names another issuer than {settings.GPUPOOL_OIDC_ISSUER}")
    missing = [field for field in _ENDPOINTS.values() if not document.get(field)]
    if missing:
        raise SsoUnavailable(f"{url} lacks {', '.join(missing)}")
    cache.set(key, document, 3600)
    return document


def _setting(attr: str, *default: Any) -> Any:
    if attr in _ENDPOINTS:
        return provider_metadata()[_ENDPOINTS[attr]]
    return getattr(settings, attr, *default)


@dataclass(frozen=True)
class SsoIdentity:
    """Who tried to sign in, for the audit log when there is no account to name."""

    email: str
    pk: str = ""

    def __str__(self) -> str:
        return self.email or "(no e-mail)"


def _refuse(request: Any, email: str, reason: str) -> None:
    setattr(request, REFUSAL_ATTRIBUTE, reason)
    with transaction.atomic():
        audit_log(
            actor=None,
            action="sso.login_refused",
            obj=SsoIdentity(email),
            after={"email": email, "reason": reason},
        )
    logger.info("SSO login refused for %s: %s", email or "(no e-mail)", reason)


class SsoBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with endpoints from discovery, read only when used."""

    get_settings = staticmethod(_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads every endpoint here; Django makes a backend on each request of a
        # signed-in user, which must not need the provider.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = User

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # the parent's attribute names
        return _setting("OIDC_OP_TOKEN_ENDPOINT")

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return _setting("OIDC_OP_USER_ENDPOINT")

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:
        return _setting("OIDC_OP_JWKS_ENDPOINT")

    def get_user(self, user_id: Any) -> User | None:
        # The parent's get_user would keep a deactivated person signed in; Django's does not.
        return ModelBackend.get_user(self, user_id)

    def authenticate(self, request: Any, **kwargs: Any) -> User | None:
        if not enabled():
            return None
        return super().authenticate(request, **kwargs)

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict) -> User | None:
        claims = self.get_userinfo(access_token, id_token, payload)
        if claims.get("sub") != payload.get("sub"):  # OIDC Core 5.3.2
            _refuse(self.request, "", "the provider's user info names another subject")
            return None
        return sso_login_user(self.request, claims)


def sso_login_user(request: Any, claims: dict[str, Any]) -> User | None:
    """The account for these claims, created and its memberships synced; None when refused."""
    email = verified_email(claims, require_verified=settings.GPUPOOL_OIDC_REQUIRE_VERIFIED_EMAIL)
    shown = str(claims.get("email") or "")[:254]
    if email is None:
        _refuse(request, shown, "the identity provider sent no verified e-mail address")
        return None
    users = list(User.objects.filter(email__iexact=email)[:2])
    if len(users) > 1:
        _refuse(request, email, "several accounts have this e-mail address")
        return None
    if not users and not settings.GPUPOOL_OIDC_CREATE_USERS:
        _refuse(request, email, "there is no GPUPool account with this e-mail address")
        return None
    if users and not users[0].is_active:
        _refuse(request, email, "this account is deactivated")
        return None
    with transaction.atomic():
        user = users[0] if users else _user_create(email, claims)
        if settings.GPUPOOL_OIDC_GROUPS_CLAIM:
            sync_memberships(user, claim_groups(claims, settings.GPUPOOL_OIDC_GROUPS_CLAIM))
    return user


def _user_create(email: str, claims: dict[str, Any]) -> User:
    user = User(
        username=_username_from(email),
        email=email,
        first_name=str(claims.get("given_name") or "")[:150],
        last_name=str(claims.get("family_name") or "")[:150],
    )
    user.set_unusable_password()
    user.save()
    audit_log(
        actor=None,
        action="sso.user_create",
        obj=user,
        after={**snapshot(user, USER_FIELDS), "source": "sso"},
    )
    return user


def sync_memberships(user: User, groups: frozenset[str]) -> None:
    """Make the places the mapping governs match the groups; audit each change."""
    desired = desired_roles(groups, settings.GPUPOOL_OIDC_GROUP_ROLES)
    if desired.platform_admin is not None and user.is_platform_admin != desired.platform_admin:
        save_audited(
            user,
            {"is_platform_admin": desired.platform_admin},
            actor=None,
            action="sso.platform_admin_set",
            fields=USER_FIELDS,
            update_fields=["is_platform_admin"],
        )
    departments = {
        d.name: d for d in Department.objects.filter(name__in=_names(desired, "department"))
    }
    projects = {
        p.name: p
        for p in Project.objects.filter(name__in=_names(desired, "project")).select_related(
            "department"
        )
    }
    current = {
        _place(m): m for m in user.memberships.select_related("department", "project__department")
    }
    for place in sorted(desired.governed):
        kind, name = place
        scope = departments.get(name) if kind == "department" else projects.get(name)
        if scope is None:
            logger.warning("GPUPOOL_OIDC_GROUP_ROLES names %s %s, which does not exist", kind, name)
            continue
        department = scope if kind == "department" else scope.department
        role, membership = desired.roles.get(place), current.get(place)
        if membership is not None and membership.role != role:
            audit_log(
                actor=None,
                action="sso.membership_remove",
                obj=membership,
                before=snapshot(membership),
                department=department,
            )
            membership.delete()
        if role is not None and (membership is None or membership.role != role):
            values = {
                "user": user,
                "role": role,
                "department": scope if kind == "department" else None,
                "project": scope if kind == "project" else None,
            }
            create_audited(
                Membership, values, actor=None, action="sso.membership_add", department=department
            )


def _names(desired: Any, kind: str) -> list[str]:
    return [name for k, name in desired.governed if k == kind]


def _place(membership: Membership) -> tuple[str, str]:
    if membership.project_id:
        return ("project", membership.project.name)
    return ("department", membership.department.name)


class SsoAuthenticateView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider; 404 while SSO is off."""

    get_settings = staticmethod(_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: Any) -> Any:
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = _setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except SsoUnavailable as exc:
            logger.error("SSO: %s", exc)
            return _refusal_page(request, "the identity provider cannot be reached", 503)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back; a refusal is a page that says why, not a bare redirect."""

    get_settings = staticmethod(_setting)

    def get(self, request: Any) -> Any:
        if not enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except (SsoUnavailable, requests.RequestException) as exc:
            logger.error("SSO: %s", exc)
            return _refusal_page(request, "the identity provider cannot be reached", 503)

    def login_failure(self) -> Any:
        reason = getattr(self.request, REFUSAL_ATTRIBUTE, None)
        if reason is None and self.request.GET.get("error"):
            reason = "the identity provider did not sign you in"
        return _refusal_page(self.request, reason or "the sign-in could not be completed", 403)


def _refusal_page(request: Any, reason: str, status: int) -> Any:
    context = {"reason": reason, "provider": settings.GPUPOOL_OIDC_PROVIDER_NAME}
    return render(request, "registration/sso_refused.html", context, status=status)
