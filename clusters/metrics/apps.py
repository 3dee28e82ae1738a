from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "clusters.metrics"
    label = "metrics"
    verbose_name = "GPU metrics"
