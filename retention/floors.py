"""Retention floors: the minimum retention of a target table, set by compliance, that no
version may go below (docs/policies.md, "Per-tenant periods, classes and floors").

A floor is in force once approved by a second compliance officer, from its ``effective_at``
(a governance floor that lowers the one in force: a waiting period after its approval). Of the
approved floors of a table whose ``effective_at`` has come, the most recently approved is in
force. Every period of a version — its default, each override's, each class's — must keep at
least as long as the floor in force (``retention.spec.period_covers``); ``check_version`` is
called at apply, submit and approve, and ``runs.actions`` re-checks at trigger.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from core.oplog import ActionError
from retention.models import RetentionFloor
from retention.spec import PolicySpec, period_covers

DEFAULT_LOWERING_WAIT_S = 7 * 86400


class FloorViolation(ActionError):
    """A version would delete rows younger than the floor in force on its table."""


def lowering_wait() -> timedelta:
    """How long after its approval a governance floor that lowers the one in force waits
    (``RETENTION["FLOOR_LOWERING_WAIT_S"]``, default 7 days)."""
    return timedelta(
        seconds=settings.RETENTION.get("FLOOR_LOWERING_WAIT_S", DEFAULT_LOWERING_WAIT_S)
    )


def in_force(schema: str, table: str, *, now: datetime | None = None) -> RetentionFloor | None:
    """The floor in force on ``schema.table`` at ``now``: of the approved floors whose
    ``effective_at`` has come, the most recently approved."""
    now = now or timezone.now()
    return (
        RetentionFloor.objects.filter(
            schema=schema, table=table, approved_at__isnull=False, effective_at__lte=now
        )
        .order_by("-approved_at", "-id")
        .first()
    )


def waiting(schema: str, table: str, *, now: datetime | None = None) -> list[RetentionFloor]:
    """Approved floors of the table not yet in force (a governance lowering's wait)."""
    now = now or timezone.now()
    return list(
        RetentionFloor.objects.filter(
            schema=schema, table=table, approved_at__isnull=False, effective_at__gt=now
        ).order_by("effective_at")
    )


def of_table(schema: str, table: str) -> list[RetentionFloor]:
    """Every floor of the table, newest first (the policy page, the manifest)."""
    return list(RetentionFloor.objects.filter(schema=schema, table=table))


def pending() -> list[RetentionFloor]:
    return list(RetentionFloor.objects.filter(approved_at__isnull=True, refused_at__isnull=True))


def below(spec: PolicySpec, floor: RetentionFloor) -> list[tuple[str, str]]:
    """The version's periods that keep less than ``floor``: ``(where, period)`` pairs."""
    found = []
    if not period_covers(spec.retention, floor.period):
        found.append(("retention", spec.retention))
    for i, o in enumerate(spec.overrides):
        if not period_covers(o.retention, floor.period):
            found.append((f"override[{i}] ({', '.join(o.tenants[:3])}"
                          f"{', …' if len(o.tenants) > 3 else ''})", o.retention))  # fmt: skip
    for i, c in enumerate(spec.classes):
        if not period_covers(c.retention, floor.period):
            found.append((f"class[{i}] ({c.column} = {c.value!r})", c.retention))
    return found


def violation(spec: PolicySpec, *, now: datetime | None = None) -> str | None:
    """One line naming the floor in force on the version's table, its mode and who set it,
    and the first period below it; None when every period keeps at least as long."""
    floor = in_force(spec.schema, spec.table, now=now)
    if floor is None:
        return None
    found = below(spec, floor)
    if not found:
        return None
    where, period = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"{floor.describe()}: the version's {where} {period!r} would delete rows younger "
        f"than the floor{more}"
    )


def check_version(spec: PolicySpec, *, now: datetime | None = None) -> None:
    """Raise FloorViolation when the version goes below the floor in force on its table."""
    problem = violation(spec, now=now)
    if problem:
        raise FloorViolation(problem)


def check_request(
    schema: str, table: str, period: str, mode: str, *, superuser: bool
) -> tuple[RetentionFloor | None, bool]:
    """The floor a new request on the table replaces, and whether it lowers it. Refused: a
    compliance floor is never lowered nor turned into a governance one; a governance floor is
    lowered only by a superuser's request."""
    current = in_force(schema, table)
    later = (
        RetentionFloor.objects.filter(schema=schema, table=table, approved_at__isnull=False)
        .filter(Q(mode=RetentionFloor.Mode.COMPLIANCE))
        .order_by("-approved_at")
    )
    for floor in later:  # every compliance floor, in force or waiting
        if not period_covers(period, floor.period):
            raise ActionError(
                f"{floor.describe()} is in compliance mode: it can never be lowered or removed"
            )
        if mode != RetentionFloor.Mode.COMPLIANCE and floor == current:
            raise ActionError(
                f"{floor.describe()} is in compliance mode: it cannot become a governance floor"
            )
    if current is None:
        return None, False
    lowers = not period_covers(period, current.period)
    if lowers and not superuser:
        raise ActionError(
            f"{current.describe()} is in governance mode: lowering it takes a superuser's "
            "request and another compliance officer's approval"
        )
    return current, lowers


def shown(floor: RetentionFloor, *, now: datetime | None = None) -> dict:
    """A floor as the pages, the manifest and the CLI show it."""
    now = now or timezone.now()
    state = "refused" if floor.refused_at else "requested"
    if floor.approved_at:
        state = "waiting" if floor.effective_at and floor.effective_at > now else "approved"
    return {
        "id": floor.pk,
        "table": floor.qualified_table,
        "period": floor.period,
        "mode": floor.mode,
        "state": state,
        "lowers": floor.lowers,
        "requested_by": floor.requested_by,
        "requested_at": floor.requested_at.isoformat(),
        "request_reason": floor.request_reason,
        "approved_by": floor.approved_by or None,
        "approved_at": floor.approved_at.isoformat() if floor.approved_at else None,
        "effective_at": floor.effective_at.isoformat() if floor.effective_at else None,
    }
