from __future__ import annotations

from typing import Any

from portal.permissions import is_admin, is_platform_admin


def navigation(request: Any) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"nav_is_admin": is_admin(user), "nav_is_platform_admin": is_platform_admin(user)}
