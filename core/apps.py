from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        # the app registry is ready: importing checks registers the system checks, and the
        # seals connect to the user model's signals
        from core import checks, seals  # noqa: F401

        seals.connect()
