"""ASGI entry point (uvicorn). Django serves everything except `/workspaces/<id>/lab/...`,
which the workspace proxy forwards (HTTP and WebSocket) to the workspace's tool."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_application = get_asgi_application()

from workspaces.proxy import WorkspaceProxy  # noqa: E402 - needs Django set up first

application = WorkspaceProxy(django_application)
