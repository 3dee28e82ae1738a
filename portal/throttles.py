"""Sign-in throttling: the login page, the Django admin's login, POST /api/v1/auth/token and
the password-reset form (each POST may send a mail).

DRF's own throttles (a sliding window kept in a cache) count every sign-in attempt twice: per
client address (a guessing run from one machine) and per username (a run spread over many
machines). Past either rate the answer is 429 with Retry-After, before any password is checked.
One mechanism serves the API and the pages, so no second library (django-axes, say) with its
own tables, backend and middleware is needed. The counts live in the "sign-in" cache, shared by
every web process (Redis in production, the file cache in the embedded mode).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from rest_framework.throttling import SimpleRateThrottle

from portal.errors import error_page


class SignInThrottle(SimpleRateThrottle):
    """Sign-in attempts per client address."""

    scope = "sign-in"

    def __init__(self) -> None:
        # The "sign-in" cache, or the default one where CACHES names no such alias.
        self.cache = caches["sign-in" if "sign-in" in settings.CACHES else "default"]
        super().__init__()

    def get_rate(self) -> str:
        return settings.GPUPOOL_SIGN_IN_RATES[self.scope]

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class SignInUsernameThrottle(SignInThrottle):
    """Sign-in attempts per username (case-insensitive), from any address."""

    scope = "sign-in-username"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        data = getattr(request, "data", None) or request.POST
        username = data.get("username") if hasattr(data, "get") else None
        if not isinstance(username, str) or not username:
            return None  # the form or serializer refuses it; nothing to count against
        ident = hashlib.sha256(username.strip().casefold().encode()).hexdigest()
        return self.cache_format % {"scope": self.scope, "ident": ident}


SIGN_IN_THROTTLES = (SignInThrottle, SignInUsernameThrottle)


def sign_in_wait(request: Any) -> float | None:
    """Seconds to wait before the next attempt, or None when this one may go ahead (and counts)."""
    waits = []
    for throttle_class in SIGN_IN_THROTTLES:
        throttle = throttle_class()
        if not throttle.allow_request(request, None):
            waits.append(throttle.wait() or 1)
    return max(waits) if waits else None


def sign_in_throttled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a sign-in page: a POST past the rates gets the styled 429 page instead."""

    @wraps(view)
    def throttled(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method == "POST":
            wait = sign_in_wait(request)
            if wait is not None:
                seconds = int(wait) + 1
                message = f"Too many sign-in attempts. Try again in {seconds} seconds."
                response = error_page(request, 429, message)
                response["Retry-After"] = str(seconds)
                return response
        return view(request, *args, **kwargs)

    return throttled
