"""The Celery application. Tasks live in each app's tasks.py; beat's schedule is here."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("gpupool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
