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

``coverage(hold)`` says, policy by policy, what a hold protects and how many rows of the
policy's table it covers now (the DELETE's own hold test against that one hold, bounded);
one that covers none gets a warning and the tenant values that match it ignoring case. The
CLI, the holds page and the operator log show it. A tenant of several columns is named part
by part and stored as the JSON array of the parts' canonical forms. ``release_impact(hold)``
says what releasing it would do: how many rows become eligible at each affected policy's
next run, and when that run is — what the release request and its approval confirm, on the
pages and the CLI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from psycopg import sql

from core import timeouts
from core.formatting import duration, when
from retention import catalog, decisions, geometry, predicate
from retention.models import LegalHold, Policy, PolicyVersion
from retention.schedule_math import next_tick

NO_TENANT_COLUMN = "every row: the policy has no tenant column"
# What a hold covers is counted up to this many rows, within this time (per policy).
COVERAGE_CAP = 100_000
COVERAGE_TIMEOUT_MS = 2_000
SIMILAR_VALUES = 5  # tenant values offered when a hold's value matches no row


class TenantMismatch(ValueError):
    """A hold's tenant is not a value a policy's tenant column can hold. ``reason``: the
    database's own words, when a value did not cast."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class Cover:
    """What a hold protects in one policy: ``covers`` in words; ``rows`` of its table in the
    hold's scope now (None: not counted, ``note`` says why; ``capped``: at least that many);
    ``similar``: tenant values that match the hold's ignoring case, when it covers no row."""

    policy: str
    covers: str
    canonical: str | None = None  # the tenant in the column's type, as text
    rows: int | None = None
    capped: bool = False
    note: str = ""
    similar: tuple[str, ...] = field(default_factory=tuple)

    @property
    def protects_nothing(self) -> bool:
        return self.rows == 0

    def rows_text(self) -> str:
        """How many rows it covers now, as people read it ('' when not counted at all)."""
        if self.rows is None:
            return f"rows not counted ({self.note})" if self.note else ""
        return f"{self.rows:,}{'+' if self.capped else ''} row{'s' if self.rows != 1 else ''} now"

    def describe(self) -> str:
        rows = self.rows_text()
        return f"{self.covers} — {rows}" if rows else self.covers

    def warning(self) -> str:
        """'' unless the hold protects no row of the policy now: then that, and the tenant
        values that match it ignoring case."""
        if self.rows != 0:
            return ""
        text = f"it protects no row of {self.policy} now"
        if self.similar:
            text += "; tenant values that match it ignoring case: " + ", ".join(self.similar)
        return text

    def to_json(self) -> dict:
        out: dict = {"policy": self.policy, "covers": self.covers}
        if self.rows is not None or self.note:
            out.update(rows=self.rows, capped=self.capped)
        if self.note:
            out["note"] = self.note
        if self.similar:
            out["similar"] = list(self.similar)
        return out


def tenant_types(spec) -> list:
    """The ``catalog.ColumnType`` of each tenant column, in order (None where not found)."""
    cols = spec.tenant_columns
    if not cols:
        return []
    found = catalog.column_types(spec.schema, spec.table, list(cols))
    return [found.get(c) for c in cols]


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


def canonical_parts(parts: list[str], ctypes) -> str:
    """The parts of a tenant of several columns, each cast to its column's type, as the tenant
    text the engine carries (``predicate.tenant_text``: the JSON array of their text forms);
    TenantMismatch naming the first part that does not cast."""
    values = [canonical(part, ctype) for part, ctype in zip(parts, ctypes, strict=True)]
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT jsonb_build_array({})::text").format(
                sql.SQL(", ").join(sql.Placeholder() * len(values))
            ),
            [*values],
        )
        return cur.fetchone()[0]


def parts_of(tenant) -> list[str] | None:
    """A hold's tenant as parts: None (all tenants), one value, or the parts of a tenant of
    several columns — given as a list, or stored as the JSON array ``canonical_parts`` writes."""
    if tenant is None:
        return None
    if isinstance(tenant, list | tuple):
        return [str(part) for part in tenant]
    if predicate.composite_text(tenant):
        try:
            parsed = json.loads(tenant)
        except ValueError:
            return [tenant]
        if isinstance(parsed, list) and len(parsed) > 1 and all(isinstance(p, str) for p in parsed):
            return parsed
    return [tenant]


def applicable_specs(policy) -> list[tuple[str, object]]:
    """(slug, spec) of the policies a hold scoped to ``policy`` (None: all) applies to now:
    each policy's approved version; for a hold on one policy that has none yet, its newest
    version. (A policy without an approved version deletes nothing; every version is
    checked against the active holds when it is validated.)"""
    return [(p.slug, spec) for p, spec in _applicable(policy)]


def _applicable(policy) -> list[tuple[object, object]]:
    policies = [policy] if policy is not None else list(Policy.objects.order_by("slug"))
    out = []
    for p in policies:
        version = p.versions.filter(state=PolicyVersion.State.APPROVED).first()
        if version is None and policy is not None:
            version = p.versions.order_by("-number").first()
        if version is not None:
            out.append((p, version.parsed))
    return out


def _keys(key_from, key_to) -> str:
    if key_from is None and key_to is None:
        return ""
    lo = "" if key_from is None else key_from
    hi = "" if key_to is None else key_to
    return f", keys [{lo}, {hi})"


def _shown(value: str) -> str:
    return value if value and value == value.strip() else repr(value)  # spaces visible


def key_interval_refusal(slug: str, spec) -> str:
    """Why a hold's key interval (integers) cannot apply to policy ``slug`` (``spec``): its
    key is not one integer column, so the interval has no place in the key's order and the
    hold would cover every row of its scope — '' when it can."""
    if predicate.integer_key(spec):
        return ""
    ctypes = catalog.column_types(spec.schema, spec.table, list(spec.key_columns))
    shown = ", ".join(
        f"{c} {ctypes[c].display}" if ctypes.get(c) is not None else f"{c} (not found)"
        for c in spec.key_columns
    )
    return (
        f"policy {slug}'s key ({shown}) is not one integer column: a key interval has no "
        f"place in its order (it would hold every row); hold the whole policy or a tenant "
        f"instead"
    )


def cover_of(slug: str, spec, tenant, key_from=None, key_to=None) -> Cover:
    """What a hold with ``tenant`` (a value, or the parts of a tenant of several columns)
    protects in one policy, in words; TenantMismatch when the policy's tenant type cannot
    hold the value or the parts do not match its columns."""
    keys = _keys(key_from, key_to)
    parts = parts_of(tenant)
    if parts is None:
        return Cover(slug, ("every tenant" if spec.tenant else "every row") + keys)
    if not spec.tenant:
        return Cover(slug, NO_TENANT_COLUMN + keys)
    cols = spec.tenant_columns
    if len(parts) > 1 and len(parts) != len(cols):
        raise TenantMismatch(
            f"the hold names {len(parts)} tenant parts, but policy {slug}'s tenant "
            f"{spec.tenant_label} has {len(cols)} column{'s' if len(cols) > 1 else ''}"
        )
    ctypes = tenant_types(spec)
    if len(parts) == 1 and len(cols) > 1:
        if predicate.composite_text(parts[0]):
            raise TenantMismatch(
                f"tenant {parts[0]!r} starts with '[' and policy {slug}'s tenant "
                f"{spec.tenant_label} has several columns: name each part separately"
            )
        return Cover(
            slug,
            f"every row: one value cannot name a tenant of {spec.tenant_label}{keys}",
        )
    if any(t is None for t in ctypes):  # a column is gone; the policy's chunks fail on it
        text = parts[0] if len(parts) == 1 else json.dumps(parts, ensure_ascii=False)
        return Cover(slug, f"tenant {text} (column of {spec.tenant_label} not found){keys}", text)
    if len(cols) == 1:
        column = f"tenant column {cols[0]!r} ({ctypes[0].display})"
    else:
        types = ", ".join(f"{c} {t.display}" for c, t in zip(cols, ctypes, strict=True))
        column = f"tenant columns {spec.tenant_label} ({types})"
    try:
        if len(parts) == 1:
            if predicate.composite_text(parts[0]) and len(parts_of(parts[0]) or []) > 1:
                raise TenantMismatch("it reads as the parts of a tenant of several columns")
            value = canonical(parts[0], ctypes[0])
            return Cover(slug, f"tenant {_shown(value)} ({ctypes[0].display}){keys}", value)
        value = canonical_parts(parts, ctypes)
    except TenantMismatch as exc:
        written = repr(parts[0]) if len(parts) == 1 else ", ".join(map(repr, parts))
        raise TenantMismatch(
            f"tenant {written} is not a value of policy {slug}'s {column}: {exc}", str(exc)
        ) from None
    shown = ", ".join(f"{c} = {_shown(v)}" for c, v in zip(cols, json.loads(value), strict=True))
    types = ", ".join(t.display for t in ctypes)
    return Cover(slug, f"tenant ({shown}) ({types}){keys}", value)


def counted(cover: Cover, spec, policy_id: int, tenant: str | None, key_from, key_to) -> Cover:
    """``cover`` with the rows of ``spec``'s table the hold covers now: the DELETE's own hold
    test (``predicate.held``) against this one hold, counted up to ``COVERAGE_CAP`` within
    ``COVERAGE_TIMEOUT_MS``. A hold on a tenant that covers no row gets the tenant values that
    match it ignoring case (``similar``): a hold on ``alice.smith`` while the rows say
    ``Alice.Smith`` protects nothing."""
    candidate = sql.Identifier("candidate_hold")
    held = predicate.held(spec, policy_id, holds=candidate)
    query = sql.SQL(
        "WITH {c} AS (SELECT NULL::bigint AS id, NULL::timestamptz AS released_at,"
        " NULL::bigint AS policy_id,"
        " %s::text AS tenant, %s::bigint AS key_from, %s::bigint AS key_to)"
        " SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {held} LIMIT %s) AS s"
    ).format(c=candidate, table=predicate.table(spec), held=held.sql)
    params = [tenant, key_from, key_to, *held.params, COVERAGE_CAP + 1]
    try:
        with (
            transaction.atomic(),
            timeouts.bounded(COVERAGE_TIMEOUT_MS),
            connection.cursor() as cur,
        ):
            cur.execute(query.as_string(cur.connection), params)
            rows = cur.fetchone()[0]
    except DatabaseError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return replace(cover, note=f"not counted: {reason[:200]}")
    capped = rows > COVERAGE_CAP
    similar: tuple[str, ...] = ()
    if rows == 0 and tenant is not None and spec.tenant:
        similar = _similar(spec, cover.canonical or tenant)
    return replace(cover, rows=min(rows, COVERAGE_CAP), capped=capped, similar=similar)


def _similar(spec, tenant: str) -> tuple[str, ...]:
    """Tenant values of ``spec``'s table (as tenant text) that equal ``tenant`` ignoring case
    and are not it: the distinct tenants walked on an index leading with the tenant columns
    (``predicate.tenants_query``), else one bounded scan. Empty when none, or when the lookup
    does not finish within ``COVERAGE_TIMEOUT_MS``."""
    lead = tuple(spec.tenant_columns)
    if any(cols[: len(lead)] == lead for cols in geometry.index_columns(spec)):
        walk = predicate.tenants_query(spec)
        source = sql.SQL("({}) AS w (v)").format(walk.sql)
    else:
        source = sql.SQL("(SELECT DISTINCT {} AS v FROM {}) AS w").format(
            predicate.tenant_text(spec), predicate.table(spec)
        )
    query = sql.SQL(
        "SELECT v FROM {} WHERE lower(v) = lower(%s) AND v <> %s ORDER BY v LIMIT %s"
    ).format(source)
    try:
        with (
            transaction.atomic(),
            timeouts.bounded(COVERAGE_TIMEOUT_MS),
            connection.cursor() as cur,
        ):
            cur.execute(query.as_string(cur.connection), [tenant, tenant, SIMILAR_VALUES])
            return tuple(row[0] for row in cur.fetchall())
    except DatabaseError:
        return ()


def check_placement(policy, tenant, key_from=None, key_to=None):
    """(the tenant to store, the coverage) of a hold about to be placed; raises TenantMismatch
    with one line when it cannot be placed as asked. ``tenant``: None, one value, or a list —
    the parts of a tenant of several columns, in the policy's order. Each cover counts the
    rows it protects now (``counted``)."""
    applicable = _applicable(policy)
    parts = parts_of(tenant)
    if policy is not None and parts is not None and applicable:
        spec = applicable[0][1]
        if not spec.tenant:
            raise TenantMismatch(
                f"policy {policy.slug} has no tenant column, so a hold cannot name a tenant "
                f"there; place it without a tenant to hold the whole policy (or a key interval)"
            )
        if len(spec.tenant_columns) > 1 and len(parts) == 1:
            raise TenantMismatch(
                f"policy {policy.slug}'s tenant {spec.tenant_label} has "
                f"{len(spec.tenant_columns)} columns: name each part (retention hold place "
                + " ".join(f"--tenant {c.upper()}" for c in spec.tenant_columns)
                + ", in that order)"
            )
    if key_from is not None or key_to is not None:
        for p, spec in applicable:
            refusal = key_interval_refusal(p.slug, spec)
            if refusal:
                raise TenantMismatch(refusal)
    covers = [cover_of(p.slug, spec, parts, key_from, key_to) for p, spec in applicable]
    stored = None
    if parts is not None:
        forms = {c.canonical for c in covers if c.canonical is not None}
        if len(forms) == 1:
            stored = forms.pop()
        else:
            stored = parts[0] if len(parts) == 1 else json.dumps(parts, ensure_ascii=False)
    covers = [
        counted(cover, spec, p.pk, stored, key_from, key_to)
        for cover, (p, spec) in zip(covers, applicable, strict=True)
    ]
    return stored, covers


def coverage(hold) -> list[Cover]:
    """What an active hold protects in each policy it applies to, as things stand now, with
    the rows it covers now."""
    out = []
    for p, spec in _applicable(hold.policy if hold.policy_id else None):
        try:
            cover = cover_of(p.slug, spec, hold.tenant, hold.key_from, hold.key_to)
        except TenantMismatch as exc:
            out.append(Cover(p.slug, f"cannot cover: {exc}; chunks of this policy fail"))
            continue
        out.append(counted(cover, spec, p.pk, hold.tenant, hold.key_from, hold.key_to))
    return out


def check_version(spec) -> None:
    """Every active tenant-scoped hold that applies to the policy ``spec`` describes must be a
    value of its tenant column (each part of a tenant of several columns: a hold naming one
    value covers every row of such a policy); raises TenantMismatch naming the first that is
    not — or an active hold with a key interval, which a key that is not one integer column
    cannot take (``key_interval_refusal``)."""
    keyed = LegalHold.objects.filter(released_at__isnull=True).filter(
        Q(key_from__isnull=False) | Q(key_to__isnull=False)
    )
    hold = keyed.filter(Q(policy__isnull=True) | Q(policy__slug=spec.slug)).order_by("pk").first()
    if hold is not None:
        refusal = key_interval_refusal(spec.slug, spec)
        if refusal:
            raise TenantMismatch(
                f"active legal hold #{hold.pk} holds keys {_keys(hold.key_from, hold.key_to)[7:]},"
                f" but {refusal}; release it first"
            )
    if not spec.tenant:
        return  # tenant-scoped holds hold such a policy whole
    holds = LegalHold.objects.filter(released_at__isnull=True, tenant__isnull=False).filter(
        Q(policy__isnull=True) | Q(policy__slug=spec.slug)
    )
    ctypes = None
    for hold in holds.order_by("pk"):
        ctypes = ctypes or tenant_types(spec)
        if not ctypes or any(t is None for t in ctypes):
            return
        try:
            cover_of(spec.slug, spec, hold.tenant)
        except TenantMismatch as exc:
            columns = (
                f"tenant column {spec.tenant!r} ({ctypes[0].display})"
                if len(ctypes) == 1
                else f"tenant columns {spec.tenant_label}"
            )
            raise TenantMismatch(
                f"active legal hold #{hold.pk} names tenant {hold.tenant!r}, which is not a "
                f"value of {columns} of {spec.qualified_table}: {exc.reason}; release it or "
                f"change the column"
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
        " {others} AS (SELECT * FROM {table} WHERE (released_at IS NULL"
        " OR id <> ALL(%s::bigint[])) AND id <> %s)"
        " SELECT count(*) FROM {target} WHERE {base} AND {covered} AND NOT {other}"
    ).format(
        this=this_hold, others=other_holds, table=table, target=predicate.table(spec),
        base=base.sql, covered=covered.sql, other=others.sql,
    )  # fmt: skip
    released = decisions.verified_release_ids()
    params = [hold.pk, released, hold.pk, *base.params, *covered.params, *others.params]
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
