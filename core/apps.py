from django.apps import AppConfig
from django.db.backends.signals import connection_created

from core.timeouts import on_connection_created


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        # the app registry is ready: importing checks registers the system checks, and the
        # seals connect to the user model's signals
        from core import checks, seals  # noqa: F401

        seals.connect()
        # a connection opened during engine work gets the engine's lock timeout
        connection_created.connect(on_connection_created, dispatch_uid="engine-lock-timeout")
