"""API tokens: stored as a SHA-512 digest (django-rest-knox), valid for REST_KNOX's TOKEN_TTL.

The plaintext is shown once, in the answer to POST /api/v1/auth/token (what `gpupool login`
saves); the database keeps only its digest and first 15 characters, so a copy of the database
opens no account. Node agents have tokens of their own (clusters.metrics.NodeToken).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from knox.auth import TokenAuthentication
from knox.models import AuthToken
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header


def api_token_issue(*, user: Any) -> tuple[AuthToken, str]:
    """A new token for `user`; the expired ones go, and past the per-user limit the oldest."""
    AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()
    keep = settings.GPUPOOL_API_TOKENS_PER_USER - 1
    live = AuthToken.objects.filter(user=user).order_by("-created")
    stale = list(live.values_list("digest", flat=True)[keep:])
    AuthToken.objects.filter(digest__in=stale).delete()
    return AuthToken.objects.create(user=user)


class ApiTokenAuthentication(TokenAuthentication):
    """knox's `Token <key>` scheme; a key that is not UTF-8 is refused (401), not a 500."""

    def authenticate_credentials(self, token: bytes) -> tuple[Any, AuthToken]:
        try:
            token.decode("utf-8")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        return super().authenticate_credentials(token)


class MachineUser:
    """Stands in for request.user when a token speaks for a machine (a node's agent, a
    workload's pod): authenticated, but nobody's account."""

    is_authenticated = True
    is_active = True
    is_platform_admin = False
    is_superuser = False
    pk = None


class BearerTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <token>` from a machine. `check` turns the token into what it
    stands for (request.auth), or None for a token it does not know (401 with `refused`)."""

    keywords: tuple[bytes, ...] = (b"bearer",)
    refused = "Unknown token."

    def check(self, token: str) -> Any:
        raise NotImplementedError

    def authenticate(self, request: Any) -> tuple[MachineUser, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        found = self.check(parts[1].decode(errors="replace"))
        if found is None:
            raise exceptions.AuthenticationFailed(self.refused)
        return MachineUser(), found

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"
