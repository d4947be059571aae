from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Core"

    def ready(self) -> None:
        # here, once the app registry is ready: importing checks registers the system checks,
        # and seals connects to the user model's signals
        from core import checks, seals  # noqa: F401

        seals.connect()
