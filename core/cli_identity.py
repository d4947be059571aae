"""Who a state-changing CLI command acts as — the one place that decides it.

Today the command names its actor with ``--by USERNAME``; the actor's roles are then
checked exactly as on the pages. The very first grant on a new installation acts as a
Django superuser (``manage.py createsuperuser``), who holds every role (docs/deploy.md).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError


def acting_user(options: dict):
    """The user a CLI command acts as; one clear error when there is none."""
    name = (options.get("by") or "").strip()
    if not name:
        raise CommandError("this command needs --by USERNAME (the person acting)")
    user = get_user_model().objects.filter(username=name, is_active=True).first()
    if user is None:
        raise CommandError(f"unknown or inactive user {name!r}")
    return user
