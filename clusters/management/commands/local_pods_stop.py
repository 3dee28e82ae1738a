"""Stop every pod running on this machine (the local backend): the demo's last step.

Local pods are processes in sessions of their own, so that they outlive a worker restart;
when the whole portal stops, they should stop with it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from clusters.backends.local import LocalBackend
from clusters.models import Backend, Cluster
from clusters.reconcile import grace_period_s


class Command(BaseCommand):
    help = "SIGTERM every local pod, SIGKILL after the cluster's grace period, and wait."

    def handle(self, *args: Any, **options: Any) -> None:
        for cluster in Cluster.objects.filter(backend=Backend.LOCAL):
            stopped = LocalBackend(cluster).stop_all(grace_period_s=grace_period_s(cluster))
            self.stdout.write(f"Cluster {cluster.name}: stopped {stopped} local pod(s).")
