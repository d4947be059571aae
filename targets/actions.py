"""Registering and removing targets: actions, each with its operator-log row."""

from __future__ import annotations

from django.db import transaction

from core.oplog import ActionError, record_action
from core.roles import ONCALL, check_role_or_system
from targets import connections as C
from targets.models import DEFAULT, Target


@transaction.atomic
def add_target(
    name: str, *, dsn_env: str = "", dsn_file: str = "", group: str = "", actor
) -> Target:
    """Register ``name``: refused (one line, nothing written) unless its reference yields a
    connection string here and the server answers on it. The string itself is never stored."""
    check_role_or_system(actor, ONCALL)
    if not C.valid_name(name) or name == DEFAULT:
        raise ActionError(
            f"target name {name!r}: lowercase letters, digits, '-' and '_', starting with a"
            f" letter, at most 63; not {DEFAULT!r} (the control database)"
        )
    if group and not C.valid_name(group):
        raise ActionError(f"group {group!r}: lowercase letters, digits, '-' and '_'")
    if bool(dsn_env) == bool(dsn_file):
        raise ActionError("name the connection string's source: --dsn-env VAR or --dsn-file PATH")
    if Target.objects.filter(name=name).exists():
        raise ActionError(f"target {name} is already registered")
    try:
        C.probe(C.dsn_from(dsn_env, dsn_file, name=name), name=name)
    except C.TargetError as exc:
        raise ActionError(str(exc)) from None
    target = Target.objects.create(
        name=name,
        dsn_env=dsn_env,
        dsn_file=dsn_file,
        group=group,
        created_by=getattr(actor, "username", None) or str(actor),
    )
    record_action(actor, "target.add", target, name=name, reference=target.reference, group=group)
    return target


@transaction.atomic
def remove_target(name: str, *, actor, reason: str = "") -> None:
    """Forget ``name``. Its ledger stays in the target database, untouched."""
    check_role_or_system(actor, ONCALL)
    target = Target.objects.select_for_update().filter(name=name).first()
    if target is None:
        raise ActionError(f"no target {name!r}")
    record_action(actor, "target.remove", target, reason=reason, name=name)
    target.delete()
