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
the operator log show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from psycopg import sql

from retention import catalog
from retention.models import LegalHold, Policy, PolicyVersion

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
