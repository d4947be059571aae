from django.apps import AppConfig
from django.db.backends.signals import connection_created

from core.timeouts import on_connection_created


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        from core import checks  # noqa: F401  (registers the system checks)

        # a connection opened during engine work gets the engine's lock timeout
        connection_created.connect(on_connection_created, dispatch_uid="engine-lock-timeout")
