"""Tests that point the Celery app at another broker drop its pools first."""

from __future__ import annotations

from portal.celery import app as celery_app


def connections_dropped() -> None:
    """The app's connection and producer pools are made once, for the broker of the time:
    drop them (as Celery does after a fork) so the next task uses the broker set now."""
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
