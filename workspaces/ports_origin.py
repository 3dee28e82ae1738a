"""Users' HTTP ports and workspaces' tools on an origin apart from the portal's.

A tool a workload serves (TensorBoard, a notebook's app, anything on a declared HTTP port)
runs its own scripts, and so does JupyterLab (a notebook's output is HTML and JavaScript
its author wrote). Served on the portal's origin, those scripts would run with the
visitor's portal session: read the API as them, post forms with their CSRF token. So
when `GPUPOOL_PORTS_ORIGIN` names another origin, the proxy serves ports
(`/workloads/<id>/ports/<name>/`) and workspaces' tools (`/workspaces/<id>/lab/`) only
there, sends a browser that asks for one on the portal's origin there (307), and answers
nothing else on it:

- `:8001`: the portal's own host name on another port. Browsers send cookies to every port
  of a host, so the proxy still sees the visitor's session; the origins differ, so a
  tool's page can neither read the portal's answers nor pass its CSRF check (Django
  refuses a post whose Origin is not the portal's). The demo serves its ports this way.
- `https://ports.example.com`: a host of its own; the session cookie must reach it
  (SESSION_COOKIE_DOMAIN=.example.com). Tools on that origin share it: a tool's page may
  act on the visitor's other tools and workspaces there (never on the portal).
- `https://*.ports.example.com`: a host name per workload (`<id>.ports.example.com`, as
  JupyterHub gives each user one), each serving that workload's ports and JupyterLab only:
  a page of one cannot read another's answers, and the proxy refuses what it sends another
  (its Origin is not that host). Needs a wildcard DNS record and certificate, and the
  session cookie on the parent domain as above.

Unset, ports are served on the portal's origin in a CSP sandbox: their scripts get an
opaque origin, which keeps the portal safe but breaks tools whose scripts call their own
server. JupyterLab cannot run sandboxed (its scripts call its server, and read its own
cookies) and is served on the portal's origin as it is: set the origin."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# Without an origin of their own, a tool's page is a sandboxed document: scripts and forms
# run, but as no origin at all.
SANDBOXED = (
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads; "
    "frame-ancestors 'self'"
)
# On their own origin: only framing is limited (to pages of that origin).
OWN_ORIGIN = "frame-ancestors 'self'"
DEFAULT_PORTS = {"http": 80, "https": 443}
WILDCARD = "*."  # a host name per workload: the workload's id in place of the star
WORKLOAD_LABEL = re.compile(r"[0-9]{1,18}")


def parse(value: str) -> tuple[str, str, int | None]:
    """GPUPOOL_PORTS_ORIGIN as (scheme, host, port): ("", "", 8001) for `:8001`, the
    parts of a full origin, or ("", "", None) when unset."""
    value = value.strip()
    if not value:
        return "", "", None
    if value.startswith(":") and value[1:].isdigit() and 0 < int(value[1:]) < 65536:
        return "", "", int(value[1:])
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or "*" in parts.hostname.removeprefix(WILDCARD)
        or parts.hostname == WILDCARD
        or port == -1
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise ImproperlyConfigured(
            f"GPUPOOL_PORTS_ORIGIN={value!r}: give ':<port>', an origin such as "
            "https://ports.example.com (no path), or https://*.ports.example.com for a host "
            "per workload"
        )
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def _configured() -> tuple[str, str, int | None]:
    return parse(settings.PORTS_ORIGIN)


def enabled() -> bool:
    return _configured()[2] is not None


def _arrived_at(scope: dict) -> tuple[str, str, int]:
    """The scheme, host name and port the browser asked for (its Host header)."""
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    host = next(
        (v.decode("latin-1") for n, v in scope.get("headers", []) if n.lower() == b"host"), ""
    )
    parts = urlsplit(f"//{host}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or ""), port or DEFAULT_PORTS[scheme]


def on_ports_origin(scope: dict) -> bool:
    """Did this request come to the ports' origin?"""
    scheme, host, port = _configured()
    if port is None:
        return False
    asked = _arrived_at(scope)
    if not host:  # `:port`: any host name of the portal's, on that port
        return asked[2] == port
    if host.startswith(WILDCARD):  # a workload's id, then the rest of the name
        label, _, rest = asked[1].partition(".")
        asked = (asked[0], f"*.{rest}" if WORKLOAD_LABEL.fullmatch(label) else "", asked[2])
    return asked == (scheme, host, port)


def serves(scope: dict, workload_id: int) -> bool:
    """Whether the ports' origin, as this request asked it, serves this workload: with a
    host name per workload, only the workload's own does."""
    host = _configured()[1]
    return not host.startswith(WILDCARD) or _arrived_at(scope)[1] == _host(host, workload_id)


def _host(configured: str, workload_id: int) -> str:
    return configured.replace("*", str(workload_id), 1)


def url_on_ports_origin(scope: dict, workload_id: int) -> str:
    """The address of this request on the ports' origin (the workload's own host, when
    each has one), path and query kept."""
    scheme, host, port = _configured()
    asked_scheme, asked_host, _ = _arrived_at(scope)
    scheme, host = scheme or asked_scheme, _host(host, workload_id) if host else asked_host
    shown = f"[{host}]" if ":" in host else host
    netloc = shown if port == DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{scheme}://{netloc}{scope.get('path', '/')}" + (f"?{query}" if query else "")


def response_policy() -> str:
    """The Content-Security-Policy the proxy adds to every answer of a port."""
    return OWN_ORIGIN if enabled() else SANDBOXED
