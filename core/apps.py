from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate

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
        # the role groups are data the product cannot run without: like auth's permissions,
        # they come back after anything that flushes the tables (the migration creates them too)
        post_migrate.connect(ensure_role_groups, sender=self, dispatch_uid="role-groups")


def ensure_role_groups(using: str = "default", **_) -> None:
    # models are importable only once the app registry is ready, after this module loads
    from django.contrib.auth.models import Group

    from core.roles import ALL_ROLES  # imports the seals, which read the user model

    for name in ALL_ROLES:
        Group.objects.using(using).get_or_create(name=name)
