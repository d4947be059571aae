from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from core import checks  # noqa: F401  (registers the system checks)
        from core.timeouts import on_connection_created

        connection_created.connect(on_connection_created, dispatch_uid="engine-lock-timeout")
