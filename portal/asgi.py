"""ASGI entry point (uvicorn). The workspaces app wraps it to proxy Jupyter's WebSockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_asgi_application()
