"""Who may pass the workspace proxy: the portal's session cookie, read outside Django's
request cycle, and the workspace's access rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import import_module
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser
from django.db import close_old_connections
from django.http.cookie import parse_cookie
from django.shortcuts import resolve_url
from django.template.loader import render_to_string
from django.utils.http import is_same_domain
from rest_framework.exceptions import AuthenticationFailed

from portal.permissions import can_view_project
from portal.tokens import ApiTokenAuthentication
from workspaces.selectors import (
    can_open_workload,
    can_open_workspace,
    can_view_workspace,
    workload_get,
    workload_port,
    workload_port_upstream,
    workspace_get,
    workspace_upstream,
)


@dataclass(frozen=True)
class Access:
    status: int
    upstream: str = ""
    token: str = ""
    location: str = ""
    message: str = ""
    user: Any = field(default=None, compare=False, repr=False)  # for the refusal page's header

    @property
    def allowed(self) -> bool:
        return self.status == 200


def _cookies(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    raw = "; ".join(v.decode("latin-1") for n, v in headers if n.lower() == b"cookie")
    return parse_cookie(raw)


def cookies_without_portal(raw: str) -> str:
    portal = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    return "; ".join(f"{k}={v}" for k, v in parse_cookie(raw).items() if k not in portal)


def sets_portal_cookie(name: bytes, value: bytes) -> bool:
    """A tool's Set-Cookie for the portal's own cookies: the tool runs its owner's code, and
    must not plant a session (or a CSRF token) in the browser of a colleague it is shared
    with."""
    if name.lower() != b"set-cookie":
        return False
    cookie = value.decode("latin-1").partition("=")[0].strip()
    return cookie in {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}


def _user(headers: list[tuple[bytes, bytes]]):
    """The API token's user (`Authorization: Token ...`: the CLI's SSH tunnel, scripts), else
    the session's. A token that does not open an account is no one, not the session."""
    scheme, _, key = (_header(headers, b"authorization") or "").partition(" ")
    if scheme.lower() == "token" and key:
        try:
            user, _ = ApiTokenAuthentication().authenticate_credentials(key.strip().encode())
        except AuthenticationFailed:
            return AnonymousUser()
        return user
    session_key = _cookies(headers).get(settings.SESSION_COOKIE_NAME)
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    # get_user checks the session's auth hash, so a changed password logs the proxy out too.
    return get_user(SimpleNamespace(session=store))


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    return next((v.decode("latin-1") for n, v in headers if n.lower() == name), None)


def origin_allowed(headers: list[tuple[bytes, bytes]]) -> bool:
    """A request a browser sent from another site (its Origin is neither this host nor a
    trusted origin) is refused. Jupyter skips its own origin and XSRF checks for requests
    carrying its token, and the proxy adds the token to every request: without this, any
    page on the same site could drive a user's kernels through their session cookie.
    Navigations and same-origin GETs carry no Origin; tools and scripts need none."""
    origin = _header(headers, b"origin")
    if origin is None:
        return True
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    if parts.netloc and parts.netloc == _header(headers, b"host"):
        return True
    return any(
        trusted.startswith(f"{parts.scheme}://*.")
        and is_same_domain(parts.netloc, trusted.partition("://")[2][1:])
        for trusted in settings.CSRF_TRUSTED_ORIGINS
    )


def _signed_in(headers: list[tuple[bytes, bytes]], path: str) -> tuple[Any, Access | None]:
    """The user, or the refusal: another site's request (403), nobody signed in (302)."""
    if not origin_allowed(headers):
        return None, Access(403, message="Refused: this request came from another site.")
    user = _user(headers)
    if not user.is_authenticated:
        login = resolve_url(settings.LOGIN_URL)
        return None, Access(302, location=f"{login}?next={quote(path)}", message="Log in first.")
    return user, None


def _decided(
    headers: list[tuple[bytes, bytes]], path: str, decide: Callable[[Any], Access]
) -> Access:
    """The refusal for a request from another site or nobody signed in; else `decide(user)`.
    Runs in a thread of its own: its database connection is closed either side."""
    close_old_connections()
    try:
        user, refused = _signed_in(headers, path)
        return refused if refused is not None else decide(user)
    finally:
        close_old_connections()


def authorize_sync(headers: list[tuple[bytes, bytes]], workspace_id: int, path: str) -> Access:
    """Decide one request: 200 with the upstream and token, or the refusal to send."""
    return _decided(headers, path, partial(_workspace_access, workspace_id))


def _workspace_access(workspace_id: int, user: Any) -> Access:
    workspace = workspace_get(workspace_id)
    # One who may not see the workspace gets what its page answers him, 404: a 403 here
    # told him it exists.
    if workspace is None or not can_view_workspace(user, workspace):
        return Access(404, message="No such workspace.", user=user)
    if not can_open_workspace(user, workspace):
        return Access(403, message="Only the owner of this workspace may open it.", user=user)
    upstream = workspace_upstream(workspace)
    if upstream is None:
        return Access(503, message="This workspace is not running.", user=user)
    return Access(200, upstream=upstream, token=workspace.token)


def authorize_port_sync(
    headers: list[tuple[bytes, bytes]], workload_id: int, port_name: str, path: str, protocol: str
) -> Access:
    """One request to a workload's port (`http`: its HTTP port; `tcp`: the SSH tunnel to
    its port named ssh): 200 with the upstream, or the refusal. The same people pass as
    through a workspace's link: the owner, or the project's researchers when shared."""
    return _decided(headers, path, partial(_port_access, workload_id, port_name, protocol))


def _port_access(workload_id: int, port_name: str, protocol: str, user: Any) -> Access:
    workload = workload_get(workload_id)
    if workload is None or not can_view_project(user, workload.project):
        return Access(404, message="No such workload.", user=user)
    if not can_open_workload(user, workload):
        message = "Only the owner of this workload (or its project, when shared) may open it."
        return Access(403, message=message, user=user)
    port = workload_port(workload, port_name)
    if port is None or port.get("protocol", "http") != protocol:
        what = "an SSH server" if protocol == "tcp" else f"an HTTP port named {port_name}"
        return Access(404, message=f"This workload has no {what}.", user=user)
    upstream = workload_port_upstream(workload, port_name)
    if upstream is None:
        return Access(503, message="This workload is not running.", user=user)
    return Access(200, upstream=upstream)


# Not thread-sensitive: Django runs its sync views on one shared thread, and a slow page
# must not stall every request of every open JupyterLab behind it.
authorize = sync_to_async(authorize_sync, thread_sensitive=False)
authorize_port = sync_to_async(authorize_port_sync, thread_sensitive=False)


REFUSAL_TITLES = {403: "Forbidden", 404: "Not found", 503: "Not running"}


def refusal_page(access: Access, *, on_ports_origin: bool = False) -> str:
    """The portal's styled error page, with its navigation for a signed-in user (rendered
    without a request: the proxy runs outside Django's, and the header needs only the user).
    On the ports' origin, which serves nothing of the portal's, its links and styles are
    the portal's, at SITE_URL."""
    context = {
        "title": REFUSAL_TITLES.get(access.status, "Refused"),
        "message": access.message,
        "user": access.user or AnonymousUser(),
        "base_href": f"{settings.SITE_URL}/" if on_ports_origin else "",
    }
    return render_to_string("error.html", context)
