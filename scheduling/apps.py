from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self) -> None:
        from scheduling import cycle, signals, tasks  # noqa: PLC0415 - models must be ready

        signals.cycle_wanted.connect(tasks.on_cycle_wanted, dispatch_uid="scheduling.cycle")
        signals.gpus_freed.connect(cycle.on_gpus_freed, dispatch_uid="scheduling.nominations")
