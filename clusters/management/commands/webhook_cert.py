"""Make (or keep) the pod webhook's certificate and write its CA into the
MutatingWebhookConfiguration (clusters/webhook_cert.py; deploy/webhook/; rerun it before
the certificate expires: it renews within --renew-days of the end)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from clusters.backends import BackendError
from clusters.models import Backend, Cluster
from clusters.webhook_cert import Target, webhook_cert_ensure


class Command(BaseCommand):
    help = "Make the pod webhook's TLS certificate and set the caBundle of its configuration."

    def add_arguments(self, parser: Any) -> None:
        defaults = Target()
        parser.add_argument("--cluster", help="the Kubernetes cluster (default: the only one)")
        parser.add_argument("--namespace", default=defaults.namespace)
        parser.add_argument("--service", default=defaults.service)
        parser.add_argument("--secret", default=defaults.secret)
        parser.add_argument("--configuration", default=defaults.configuration)
        parser.add_argument("--days", type=int, default=365, help="validity of a new one")
        parser.add_argument("--renew-days", type=int, default=30, help="renew this close to expiry")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = _cluster(options["cluster"])
        target = Target(
            options["namespace"], options["service"], options["secret"], options["configuration"]
        )
        if not 1 <= options["days"] <= 3650 or not 0 <= options["renew_days"] < options["days"]:
            raise CommandError("--days must be 1 to 3650, --renew-days 0 to less than --days")
        try:
            done = webhook_cert_ensure(
                cluster, target, days=options["days"], renew_days=options["renew_days"],
                now=timezone.now(),
            )  # fmt: skip
        except BackendError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(done)


def _cluster(name: str | None) -> Cluster:
    clusters = Cluster.objects.filter(backend=Backend.KUBERNETES, enabled=True)
    if name:
        found = clusters.filter(name=name).first()
        if found is None:
            raise CommandError(f"No enabled Kubernetes cluster {name}.")
        return found
    if clusters.count() != 1:
        names = ", ".join(c.name for c in clusters) or "none"
        raise CommandError(f"Name the cluster with --cluster (enabled Kubernetes: {names}).")
    return clusters.get()
