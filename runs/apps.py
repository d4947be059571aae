from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_schedules(sender, **kwargs) -> None:
    from runs.schedules import ensure_system_schedules

    ensure_system_schedules()


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs and audit"

    def ready(self) -> None:
        post_migrate.connect(_ensure_schedules, sender=self)
