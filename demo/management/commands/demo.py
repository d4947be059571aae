"""``manage.py demo``: the demo marketplace, its users and its approved policies."""

from __future__ import annotations

import dataclasses

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.env import env_bool
from core.oplog import ActionError
from demo.marketplace import DemoDataError, DemoParams, ensure_marketplace
from demo.policy_files import apply_demo_policies, load_specs
from demo.tasks import ensure_schedule
from demo.users import ensure_demo_users
from targets.actions import add_target
from targets.models import Target

FLEET_TARGET = "second"


class Command(BaseCommand):
    help = (
        "Create (or keep) the demo marketplace schema with --rows events, the demo users "
        "and the demo policies. Idempotent: the same parameters leave the same state."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rows", type=int, default=1_000_000, help="marketplace events")
        parser.add_argument("--seed", type=int, default=42, help="seed of the generated data")
        parser.add_argument("--tenants", type=int, default=50, help="number of tenants (>= 2)")
        parser.add_argument(
            "--fleet-dsn-env",
            metavar="VAR",
            help="register the database in VAR (its ledger and demo data already installed)"
            " as the target 'second' and approve a copy of the marketplace-events policy over it",
        )
        parser.add_argument(
            "--no-users",
            action="store_true",
            help="only the data: no demo users, no demo policies",
        )

    def handle(self, *args, rows: int, seed: int, tenants: int, no_users: bool, **options):
        self.verbosity = options["verbosity"]

        if not no_users and not (settings.DEBUG or env_bool("RETENTION_DEMO", False)):
            raise CommandError(
                "demo users have public passwords: set RETENTION_DEMO=1 (or DEBUG=1), "
                "or pass --no-users"
            )
        try:
            params = DemoParams(rows=rows, seed=seed, tenants=tenants)
            result = ensure_marketplace(params, progress=self._progress)
        except DemoDataError as exc:
            raise CommandError(str(exc)) from None
        if result.skipped:
            self.stdout.write(
                f"demo data already present ({result.rows:,} rows, seed {seed}, "
                f"reference {result.reference_at:%Y-%m-%d %H:%M} UTC)"
            )
        else:
            per_table = ", ".join(f"{name} {count:,}" for name, count in result.counts.items())
            self.stdout.write(
                self.style.SUCCESS(
                    f"demo data: {result.rows:,} rows written in {result.seconds:.1f}s "
                    f"({result.rows_per_second:,.0f} rows/s): {per_table}"
                )
            )
        if no_users:
            return
        created = ensure_demo_users()
        if created:
            self.stdout.write(f"demo users created: {', '.join(created)}")
        else:
            self.stdout.write("demo users already present")
        self._policies()
        if options.get("fleet_dsn_env"):
            self._fleet(options["fleet_dsn_env"])

        ensure_schedule()

    def _fleet(self, dsn_env: str) -> None:
        """A second target for the fleet view: ``second`` (group ``demo``), and the
        marketplace events policy over it (``marketplace-events-second``)."""
        if not Target.objects.filter(name=FLEET_TARGET).exists():
            try:
                add_target(FLEET_TARGET, dsn_env=dsn_env, group="demo", actor="startup")
            except ActionError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"target {FLEET_TARGET} registered ({dsn_env})")
        spec = next(s for s in load_specs() if s.slug == "marketplace-events")
        spec = dataclasses.replace(
            spec,
            slug=f"{spec.slug}-{FLEET_TARGET}",
            name=f"{spec.name} (target {FLEET_TARGET})",
            targets=(FLEET_TARGET,),
        )
        outcomes = apply_demo_policies(
            author=User.objects.get(username="alice"),
            approver=User.objects.get(username="carol"),
            specs=[spec],
        )
        for outcome in outcomes:
            self.stdout.write(f"policy {outcome.slug}: {outcome.status}")

    def _policies(self) -> None:
        # Two compliance officers: one writes, the other approves (never their own).
        author, approver = (User.objects.get(username=name) for name in ("alice", "carol"))
        outcomes = apply_demo_policies(author=author, approver=approver)
        if all(outcome.status == "unavailable" for outcome in outcomes):
            self.stdout.write(
                self.style.WARNING(
                    "demo policies not applied: retention.actions does not offer apply_spec, "
                    "submit_version and approve_version yet (the files are in demo/policies/)"
                )
            )
            return
        failed = []
        for outcome in outcomes:
            line = f"policy {outcome.slug}: {outcome.status}"
            if outcome.detail:
                line += f" ({outcome.detail})"
            if outcome.status == "failed":
                failed.append(outcome.slug)
                self.stderr.write(line)
            else:
                self.stdout.write(line)
        if failed:
            raise CommandError(f"demo policies failed: {', '.join(failed)}")

    def _progress(self, message: str) -> None:
        if self.verbosity >= 1:
            self.stdout.write(message)
