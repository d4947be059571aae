"""``python manage.py retention AREA ...`` — operations without a browser.

Areas are registered by the apps: ``core.cli`` (user, role, token), ``targets.grants_cli``
(grants), ``retention.cli`` (policy, hold) and ``runs.cli`` (trigger, status, drain, pause, ...). The command lives in
``runs``, the top layer, because it composes all three. Every failure is one line.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from core import cli as people_cli
from core.cli_identity import cli_command
from retention import cli as policy_cli
from runs import cli as run_cli
from runs.evidence import cli_check
from targets import cli as targets_cli
from targets import grants_cli


class Command(BaseCommand):
    help = "Retention Runner operations: policies, holds, runs, audit."
    requires_system_checks: list = []  # operational commands start fast; `manage.py check` checks

    def add_arguments(self, parser):
        areas = parser.add_subparsers(dest="area", required=True, metavar="AREA")
        policy_cli.register(areas)
        run_cli.register(areas)
        cli_check.register(areas)
        people_cli.register(areas)
        grants_cli.register(areas)
        targets_cli.register(areas)

    def handle(self, *args, **options):
        handler = options.get("handler")
        if handler is None:
            raise CommandError("missing sub-command; see --help")
        try:
            with cli_command():
                code = handler(self, options)
        except CommandError:
            raise
        except PermissionDenied as exc:  # the acting person lacks the role
            raise CommandError(str(exc) or "permission denied") from None
        except ValueError as exc:  # SpecError, validation errors: the user's input
            raise CommandError(str(exc)) from None
        if code:  # a handler's own exit status (``policy plan``: 2 when there are changes)
            self.stdout.flush()
            raise SystemExit(code)
