"""``retention check RUN_KEY [--shadow schema.table]``: the invariant checker for an operator.

Compares the run's table with its audit trail (and, with ``--shadow``, with a copy of the
table taken before the run): nothing outside the run's scope is gone, no kept or held row is
gone, the audited counts add up to the rows actually gone, exactly one audit row per finished
chunk, the hash chain intact, and (for a drained run) no eligible row left. Exit status 1
with the problems listed when an invariant fails.
"""

from __future__ import annotations

import re

from django.core.management.base import CommandError
from django.db import connection

from runs.cli import _run
from runs.evidence.invariants import check_run
from runs.models import Run

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def parse_shadow(text: str) -> tuple[str, str]:
    """``schema.table`` → (schema, table): plain identifiers naming an existing table."""
    parts = text.split(".")
    if len(parts) != 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise CommandError(
            f"--shadow must be schema.table with plain identifiers (letters, digits, _), got {text!r}"
        )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s", [parts[0], parts[1]]
        )
        if cur.fetchone() is None:
            raise CommandError(f"no table {parts[0]}.{parts[1]} (--shadow)")
    return parts[0], parts[1]


def check(cmd, o) -> None:
    run = _run(o["run_key"])
    shadow = parse_shadow(o["shadow"]) if o.get("shadow") else None
    expect_drained = o["expect_drained"]
    if expect_drained is None:
        expect_drained = run.state == Run.State.DRAINED
    problems = check_run(run, shadow=shadow, expect_drained=expect_drained)
    scope = f"against {shadow[0]}.{shadow[1]}" if shadow else "against the ledger only"
    if not problems:
        cmd.stdout.write(f"{run.run_key} ({run.state}): every invariant holds ({scope})")
        return
    for problem in problems:
        cmd.stderr.write(problem)
    raise CommandError(
        f"{run.run_key} ({run.state}): {len(problems)} invariant(s) broken ({scope})"
    )


def register(areas) -> None:
    p = areas.add_parser("check", help="check a run's invariants against its table and audit trail")
    p.add_argument("run_key")
    p.add_argument(
        "--shadow", metavar="SCHEMA.TABLE", help="a copy of the table taken before the run"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--expect-drained", dest="expect_drained", action="store_true", default=None,
        help="also require that no eligible row is left (default: when the run is drained)",
    )  # fmt: skip
    group.add_argument("--no-expect-drained", dest="expect_drained", action="store_false")
    p.set_defaults(handler=check)
