"""What a legal hold's tenant means in each policy it applies to.

A hold stores its tenant as text; the DELETE compares it with the tenant column in the
column's own type (``retention.predicate.held`` casts the hold's value to that type), so a
hold on ``ACME`` protects ``acme`` in a ``citext`` column and a hold on ``01`` protects
tenant 1 in an integer column — exactly what the type's ``=`` says.

Here are the checks made when a hold is placed and when a version is validated:

- the value must be one the tenant column's type can hold, in every policy the hold applies
  to (one clear error otherwise, naming the policy and the type);
- a hold on one policy stores the value's canonical form in that type
  (``SELECT $1::type::text``); a hold on all policies stores it when every tenant type
  gives the same form, else the value as written;
- a tenant-scoped hold cannot be placed on one policy without a tenant column; a
  tenant-scoped hold on all policies holds every row of such a policy (it cannot tell which
  rows are the tenant's, so it protects them all).

``coverage(hold)`` says, policy by policy, what a hold protects; the CLI, the holds page and
the operator log show it. ``release_impact(hold)`` says what releasing it would do: how many
rows become eligible at each affected policy's next run, and when that run is — what the
release request and its approval confirm, on the pages and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg import sql

from core import timeouts
from core.formatting import duration, when
from retention import catalog, predicate
from retention.models import LegalHold, Policy, PolicyVersion
from retention.schedule_math import next_tick

NO_TENANT_COLUMN = "every row: the policy has no tenant column"


class TenantMismatch(ValueError):
    """A hold's tenant is not a value a policy's tenant column can hold."""


@dataclass(frozen=True)
class Cover:
    policy: str
    covers: str
    canonical: str | None = None  # the tenant in the column's type, as text

    def to_json(self) -> dict:
        return {"policy": self.policy, "covers": self.covers}


def tenant_type(spec):
    """The tenant column's ``introspect.ColumnType`` (None: no tenant column, or not found)."""
    if not spec.tenant:
        return None
    return catalog.column_types(spec.schema, spec.table, [spec.tenant]).get(spec.tenant)


def canonical(value: str, ctype) -> str:
    """``value`` cast to the column type and back to text; TenantMismatch when it does not
    cast (the type's own input function decides: leading zeros, case, spaces, uuid forms)."""
    query = sql.SQL("SELECT (%s::{})::text").format(ctype.cast())
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(query, [value])
            return cur.fetchone()[0]
    except DatabaseError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TenantMismatch(reason) from None


def applicable_specs(policy) -> list[tuple[str, object]]:
    """(slug, spec) of the policies a hold scoped to ``policy`` (None: all) applies to now:
    each policy's approved version; for a hold on one policy that has none yet, its newest
    version. (A policy without an approved version deletes nothing; every version is
    checked against the active holds when it is validated.)"""
    policies = [policy] if policy is not None else list(Policy.objects.order_by("slug"))
    out = []
    for p in policies:
        version = p.versions.filter(state=PolicyVersion.State.APPROVED).first()
        if version is None and policy is not None:
            version = p.versions.order_by("-number").first()
        if version is not None:
            out.append((p.slug, version.parsed))
    return out


def _keys(key_from, key_to) -> str:
    if key_from is None and key_to is None:
        return ""
    lo = "" if key_from is None else key_from
    hi = "" if key_to is None else key_to
    return f", keys [{lo}, {hi})"


def cover_of(slug: str, spec, tenant: str | None, key_from=None, key_to=None) -> Cover:
    """What a hold with ``tenant`` protects in one policy; TenantMismatch when the policy's
    tenant type cannot hold the value."""
    keys = _keys(key_from, key_to)
    if tenant is None:
        return Cover(slug, ("every tenant" if spec.tenant else "every row") + keys)
    if not spec.tenant:
        return Cover(slug, NO_TENANT_COLUMN + keys)
    ctype = tenant_type(spec)
    if ctype is None:  # the column is gone; the policy's chunks fail on it anyway
        return Cover(slug, f"tenant {tenant} (column {spec.tenant!r} not found){keys}", tenant)
    try:
        value = canonical(tenant, ctype)
    except TenantMismatch as exc:
        raise TenantMismatch(
            f"tenant {tenant!r} is not a value of policy {slug}'s tenant column "
            f"{spec.tenant!r} ({ctype.display}): {exc}"
        ) from None
    shown = value if value and value == value.strip() else repr(value)  # spaces visible
    return Cover(slug, f"tenant {shown} ({ctype.display}){keys}", value)


def check_placement(policy, tenant: str | None, key_from=None, key_to=None):
    """(the tenant to store, the coverage) of a hold about to be placed; raises TenantMismatch
    with one line when it cannot be placed as asked."""
    specs = applicable_specs(policy)
    if policy is not None and tenant is not None:
        if specs and not specs[0][1].tenant:
            raise TenantMismatch(
                f"policy {policy.slug} has no tenant column, so a hold cannot name a tenant "
                f"there; place it without a tenant to hold the whole policy (or a key interval)"
            )
    covers = [cover_of(slug, spec, tenant, key_from, key_to) for slug, spec in specs]
    stored = tenant
    forms = {c.canonical for c in covers if c.canonical is not None}
    if tenant is not None and len(forms) == 1:
        stored = forms.pop()
    return stored, covers


def coverage(hold) -> list[Cover]:
    """What an active hold protects in each policy it applies to, as things stand now."""
    out = []
    for slug, spec in applicable_specs(hold.policy if hold.policy_id else None):
        try:
            out.append(cover_of(slug, spec, hold.tenant, hold.key_from, hold.key_to))
        except TenantMismatch as exc:
            out.append(Cover(slug, f"cannot cover: {exc}; chunks of this policy fail"))
    return out


def check_version(spec) -> None:
    """Every active tenant-scoped hold that applies to the policy ``spec`` describes must be a
    value of its tenant column; raises TenantMismatch naming the first that is not."""
    if not spec.tenant:
        return  # tenant-scoped holds hold such a policy whole
    holds = LegalHold.objects.filter(released_at__isnull=True, tenant__isnull=False).filter(
        Q(policy__isnull=True) | Q(policy__slug=spec.slug)
    )
    ctype = None
    for hold in holds.order_by("pk"):
        ctype = ctype or tenant_type(spec)
        if ctype is None:
            return
        try:
            canonical(hold.tenant, ctype)
        except TenantMismatch as exc:
            raise TenantMismatch(
                f"active legal hold #{hold.pk} names tenant {hold.tenant!r}, which is not a "
                f"value of tenant column {spec.tenant!r} ({ctype.display}) of "
                f"{spec.qualified_table}: {exc}; release it or change the column"
            ) from None


IMPACT_TIMEOUT_MS = 10_000  # per policy: a count over the rows older than the next cutoff


@dataclass(frozen=True)
class ReleaseImpact:
    """What releasing a hold does to one policy: ``rows`` that become eligible at its next
    run (None: not counted, ``note`` says why), and when that run is (``next_run``: the next
    tick of its schedule; None: no run comes, ``note`` says why)."""

    policy: str
    next_run: datetime | None
    rows: int | None
    note: str = ""

    def describe(self, now: datetime | None = None) -> str:
        now = now or timezone.now()
        if self.next_run is None:
            return f"{self.policy}: {self.note}"
        rows = (
            f"{self.rows:,} rows become eligible"
            if self.rows is not None
            else f"rows become eligible (not counted: {self.note})"
        )
        text = (
            f"{self.policy}: {rows} at its next run, {when(self.next_run, 'minutes')} "
            f"(in {duration((self.next_run - now).total_seconds())})"
        )
        return text + (f"; {self.note}" if self.note and self.rows is not None else "")

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "next_run": self.next_run.isoformat() if self.next_run else None,
            "rows": self.rows,
            "note": self.note,
        }


def _released_rows(spec, policy_id: int, hold: LegalHold, cutoff: datetime) -> int:
    """Rows of ``spec``'s table eligible at ``cutoff`` but for the holds, covered by ``hold``
    and by no other active hold: what its release lets a run with that cutoff delete. The
    holds are the DELETE's own test (``predicate.held``), read from two named subsets."""
    this_hold, other_holds = sql.Identifier("released_hold"), sql.Identifier("other_holds")
    types = predicate.column_types(spec)
    base = predicate.eligible(
        spec, policy_id=policy_id, cutoff=cutoff, include_holds=False, types=types
    )
    covered = predicate.held(spec, policy_id, types=types, holds=this_hold)
    others = predicate.held(spec, policy_id, types=types, holds=other_holds)
    table = sql.Identifier(LegalHold._meta.db_table)
    query = sql.SQL(
        "WITH {this} AS (SELECT * FROM {table} WHERE id = %s),"
        " {others} AS (SELECT * FROM {table} WHERE released_at IS NULL AND id <> %s)"
        " SELECT count(*) FROM {target} WHERE {base} AND {covered} AND NOT {other}"
    ).format(
        this=this_hold, others=other_holds, table=table, target=predicate.table(spec),
        base=base.sql, covered=covered.sql, other=others.sql,
    )  # fmt: skip
    params = [hold.pk, hold.pk, *base.params, *covered.params, *others.params]
    with transaction.atomic(), timeouts.bounded(IMPACT_TIMEOUT_MS), connection.cursor() as cur:
        cur.execute(query.as_string(cur.connection), params)
        return cur.fetchone()[0]


def release_impact(hold: LegalHold, *, now: datetime | None = None) -> list[ReleaseImpact]:
    """What releasing ``hold`` would do, policy by policy: for each policy with an approved
    version it applies to, the rows that become eligible at that policy's next run (its next
    tick, whose cutoff the run will use) and when that is; a paused or disabled policy says
    that no run comes until it is resumed or enabled. Each count is bounded by a statement
    timeout; one that does not finish says so instead of failing."""
    now = now or timezone.now()
    policies = [hold.policy] if hold.policy_id else list(Policy.objects.order_by("slug"))
    out = []
    for policy in policies:
        version = policy.approved_version
        if version is None:
            continue
        if not policy.enabled or policy.paused:
            state = "disabled" if not policy.enabled else "paused"
            out.append(
                ReleaseImpact(policy.slug, None, None, f"{state}: no run until it is "
                              f"{'enabled' if state == 'disabled' else 'resumed'}")
            )  # fmt: skip
            continue
        spec = version.parsed
        tick = next_tick(policy, now)
        try:
            rows = _released_rows(spec, policy.pk, hold, spec.cutoff_for(tick))
            out.append(ReleaseImpact(policy.slug, tick, rows))
        except DatabaseError as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            out.append(ReleaseImpact(policy.slug, tick, None, reason[:200]))
    return out
