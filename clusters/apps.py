from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
    verbose_name = "Clusters"

    def ready(self) -> None:
        # Scheduling decides and says which clusters must change; this app listens and
        # applies (scheduling/signals.py), so scheduling imports none of its tasks.
        from clusters import tasks  # noqa: PLC0415 - models must be ready
        from scheduling.signals import clusters_changed  # noqa: PLC0415

        clusters_changed.connect(tasks.on_clusters_changed, dispatch_uid="clusters.reconcile")
