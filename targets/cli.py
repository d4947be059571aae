"""``retention target add|list|remove|migrate``: the databases the product deletes from.

``add`` connects before it registers anything; ``migrate`` installs the product's schema (the
ledger: runs, chunks, audit rows and their chain, and the mirror of the decisions they obey)
into the target with the login its reference names — run it with the target's owner login
there, as ``manage.py migrate`` is run with the control database's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.core.management.base import CommandError

from core.cli_identity import acting_user
from core.oplog import ActionError
from targets import actions
from targets import connections as C
from targets.models import DEFAULT, Target


def add(cmd, o):
    try:
        target = actions.add_target(
            o["name"],
            dsn_env=o.get("dsn_env") or "",
            dsn_file=o.get("dsn_file") or "",
            group=o.get("group") or "",
            actor=acting_user(o),
        )
    except ActionError as exc:
        raise CommandError(str(exc)) from None
    group = f" in group {target.group}" if target.group else ""
    cmd.stdout.write(f"target {target.name} added{group} ({target.reference}); it answered")


def remove(cmd, o):
    try:
        actions.remove_target(o["name"], actor=acting_user(o), reason=o.get("reason") or "")
    except ActionError as exc:
        raise CommandError(str(exc)) from None
    cmd.stdout.write(f"target {o['name']} removed; its ledger stays in its database")


def ledger_state(name: str) -> str:
    """'ledger', 'no ledger' or 'unreachable: <why>' — connecting now."""
    try:
        with C.on(name):
            return "ledger" if C.has_ledger() else "no ledger"
    except C.TargetError as exc:
        return f"unreachable: {exc}"
    except Exception as exc:  # noqa: BLE001 - any connection failure is shown, one line
        return f"unreachable: {C.first_line(exc)}"


def list_targets(cmd, o):
    rows = [(DEFAULT, "", "the control database", ledger_state(DEFAULT))]
    for t in Target.objects.all():
        rows.append((t.name, t.group, t.reference, ledger_state(t.name)))
    width = max(len(r[0]) for r in rows)
    for name, group, reference, state in rows:
        cmd.stdout.write(f"{name:{width}}  {group or '-':16} {reference:32} {state}")


def migrate(cmd, o):
    name = o["name"]
    if name == DEFAULT:
        raise CommandError("the control database is migrated with `manage.py migrate`")
    try:
        dsn_env, dsn_file, _group = C.reference_of(name)
        dsn = C.dsn_from(dsn_env, dsn_file, name=name)
    except C.TargetError as exc:
        raise CommandError(str(exc)) from None
    env = {**os.environ, "DATABASE_URL": dsn, "RETENTION_TOKEN": ""}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "manage.py"), "migrate",
         "--no-input", "-v", "0"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise CommandError(
            f"target {name}: migrate failed: {C.redact(lines[-1] if lines else '', dsn)}"
        )
    cmd.stdout.write(f"target {name}: the ledger is installed")


def register(areas) -> None:
    target = areas.add_parser("target", help="the databases the product deletes from")
    sub = target.add_subparsers(dest="target_cmd", required=True)
    p = sub.add_parser("add", help="register a target (it must answer)")
    p.add_argument("name")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dsn-env", metavar="VAR", help="the variable holding its URL")
    source.add_argument("--dsn-file", metavar="PATH", help="the file holding its URL")
    p.add_argument("--group", metavar="LABEL")
    p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")
    p.set_defaults(handler=add)
    p = sub.add_parser("list", help="the targets, each with whether it answers and has the ledger")
    p.set_defaults(handler=list_targets)
    p = sub.add_parser("remove", help="forget a target (its ledger stays)")
    p.add_argument("name")
    p.add_argument("--reason", default="")
    p.add_argument("--by", help="optional check: refused unless RETENTION_TOKEN is this user's")
    p.set_defaults(handler=remove)
    p = sub.add_parser("migrate", help="install the ledger in a target (with its owner login)")
    p.add_argument("name")
    p.set_defaults(handler=migrate)
