"""The one eligibility predicate, shared by preview, planner, worker and verification.

Every statement on a user table is composed here from ``psycopg.sql``
identifiers (names validated by ``retention.introspect`` against the catalog)
and bound parameters. Keep rules and legal holds are part of the statement
itself, so the database evaluates them at the moment of deletion — never
Python beforehand.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from retention import catalog
from retention.models import LegalHold
from retention.spec import LIST_OPERATORS, KeepRule, PolicySpec

ROW = sql.Identifier("t")

_COMPARISONS = {
    "=": sql.SQL("="),
    "!=": sql.SQL("<>"),
    "<": sql.SQL("<"),
    "<=": sql.SQL("<="),
    ">": sql.SQL(">"),
    ">=": sql.SQL(">="),
}


@dataclass
class Fragment:
    """A piece of SQL with its positional parameters, composed in order."""

    sql: sql.Composable
    params: list

    @staticmethod
    def join(parts: list[Fragment], sep: str) -> Fragment:
        return Fragment(
            sql.SQL(sep).join(p.sql for p in parts), [x for p in parts for x in p.params]
        )


def col(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(ROW, sql.Identifier(name))


def table(spec: PolicySpec) -> sql.Composed:
    return sql.SQL("{}.{} AS {}").format(
        sql.Identifier(spec.schema), sql.Identifier(spec.table), ROW
    )


def keep_condition(rule: KeepRule) -> Fragment:
    """SQL that is TRUE when ``rule`` protects the row."""
    column = col(rule.column)
    if rule.op == "is null":
        return Fragment(sql.SQL("{} IS NULL").format(column), [])
    if rule.op == "is not null":
        return Fragment(sql.SQL("{} IS NOT NULL").format(column), [])
    if rule.op in LIST_OPERATORS:
        marks = sql.SQL(", ").join(sql.Placeholder() * len(rule.values))
        keyword = sql.SQL("IN") if rule.op == "in" else sql.SQL("NOT IN")
        return Fragment(sql.SQL("{} {} ({})").format(column, keyword, marks), list(rule.values))
    return Fragment(sql.SQL("{} {} %s").format(column, _COMPARISONS[rule.op]), [rule.value])


def not_kept(spec: PolicySpec) -> Fragment:
    """No keep rule can protect the row: ``(r1 OR r2 ...) IS FALSE``.

    Two-valued on purpose, and conservative: a rule that cannot be decided for a row
    (a comparison with NULL) protects it. A row is deletable only when every keep rule
    is definitely FALSE for it, so preview, DELETE and verification split rows the
    same way, and a NULL never turns into a deletion."""
    if not spec.keep:
        return Fragment(sql.SQL("TRUE"), [])
    parts = [keep_condition(rule) for rule in spec.keep]
    any_rule = Fragment.join(parts, " OR ")
    return Fragment(sql.SQL("({}) IS FALSE").format(any_rule.sql), any_rule.params)


def kept(spec: PolicySpec) -> Fragment:
    """Some keep rule protects the row (TRUE or undecidable): the exact complement of
    ``not_kept``."""
    frag = not_kept(spec)
    return Fragment(sql.SQL("NOT ({})").format(frag.sql), frag.params)


def _tenant_equals(spec, alias: sql.Identifier, types) -> sql.Composable:
    """The row's tenant equals ``alias.tenant`` (stored as text) in the tenant column's own type
    and collation, so the type's ``=`` decides; TRUE for a policy without a tenant column."""
    if not spec.tenant:
        return sql.SQL("TRUE")
    types = column_types(spec) if types is None else types
    ctype = types.get(spec.tenant)
    if ctype is None:  # the column is gone: the statement fails on it, as it should
        return sql.SQL("{}.tenant = {}::text").format(alias, col(spec.tenant))
    return sql.SQL("{} = ({}.tenant::{}){}").format(
        col(spec.tenant), alias, ctype.cast(), ctype.collate()
    )


def held(spec: PolicySpec, policy_id: int, *, types: dict | None = None) -> Fragment:
    """An active legal hold covers the row: one correlated ``EXISTS``.

    Used as a top-level ``NOT EXISTS`` in the eligibility predicate, so the planner turns it
    into an anti-join against the (small) hold table and keeps the chunk's key-range index
    scan; wrapping it in a larger boolean expression would push the planner towards
    combining indexes over the whole timestamp range on every chunk.

    The tenant is compared in the column's own type: the hold's text is cast to it
    (``col = h.tenant::type``), so the type's ``=`` decides (citext ignores case, integers
    ignore leading zeros, uuids their case). ``retention.holds`` checks when a hold is
    placed, and when a version is validated, that every applicable hold's value casts. In
    a policy without a tenant column, a tenant-scoped hold (one on all policies) covers
    every row: it cannot tell the tenant's rows from the others, so it protects them all."""
    hold = sql.Identifier("h")
    tenant_match = _tenant_equals(spec, hold, types)
    text = sql.SQL(
        "EXISTS (SELECT 1 FROM {holds} AS {h} WHERE {h}.released_at IS NULL"
        " AND ({h}.policy_id IS NULL OR {h}.policy_id = %s)"
        " AND ({h}.tenant IS NULL OR {tenant_match})"
        " AND ({h}.key_from IS NULL OR {key} >= {h}.key_from)"
        " AND ({h}.key_to IS NULL OR {key} < {h}.key_to))"
    ).format(
        holds=sql.Identifier(LegalHold._meta.db_table),
        h=hold,
        tenant_match=tenant_match,
        key=col(spec.key),
    )
    return Fragment(text, [policy_id])


def column_types(spec: PolicySpec) -> dict:
    """The catalog's types of the key, timestamp and tenant columns (``introspect.ColumnType``)."""
    names = [spec.key, spec.timestamp] + ([spec.tenant] if spec.tenant else [])
    return catalog.column_types(spec.schema, spec.table, names)


def planned_columns(spec: PolicySpec) -> list[str]:
    """The columns a run plans by: a row with NULL in any of them is never eligible (it has no
    age, no key interval or no tenant to be planned in)."""
    return [spec.timestamp, spec.key] + ([spec.tenant] if spec.tenant else [])


def has_values(spec: PolicySpec) -> Fragment:
    """Key and tenant are not NULL (the timestamp comparison already excludes a NULL one)."""
    cols = planned_columns(spec)[1:]
    return Fragment(
        sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(col(c)) for c in cols), []
    )


WALL_CLOCK_TYPES = ("timestamp", "date")


def _timestamp_base(spec: PolicySpec, types: dict | None) -> str | None:
    types = column_types(spec) if types is None else types
    found = types.get(spec.timestamp)
    return found.base if found is not None else None


def cutoff_value(spec: PolicySpec, cutoff: datetime, *, types: dict | None = None) -> datetime:
    """The cutoff as the timestamp column compares with it: the instant itself for a
    ``timestamptz`` column; for a ``timestamp without time zone`` or ``date`` column, the
    wall-clock time of that instant in ``spec.column_zone`` (never the session's zone)."""
    if _timestamp_base(spec, types) in WALL_CLOCK_TYPES:
        return cutoff.astimezone(zoneinfo.ZoneInfo(spec.column_zone)).replace(tzinfo=None)
    return cutoff


def timestamp_instant(spec: PolicySpec, *, types: dict | None = None) -> sql.Composable:
    """The row's timestamp as an instant (``timestamptz``), read in ``spec.column_zone`` when
    the column holds wall-clock time."""
    base = _timestamp_base(spec, types)
    if base not in WALL_CLOCK_TYPES:
        return sql.SQL("{}::timestamptz").format(col(spec.timestamp))
    return sql.SQL("({}::timestamp AT TIME ZONE {})").format(
        col(spec.timestamp), sql.Literal(spec.column_zone)
    )


def older_than(spec: PolicySpec, cutoff: datetime, *, types: dict | None = None) -> Fragment:
    """``ts < cutoff`` in the column's own type (so its index serves the comparison)."""
    return Fragment(
        sql.SQL("{} < %s").format(col(spec.timestamp)),
        [cutoff_value(spec, cutoff, types=types)],
    )


def null_rows(spec: PolicySpec, *, cutoff: datetime, nullable=None) -> Fragment | None:
    """Rows that are not eligible only because a planned column is NULL: a NULL timestamp, or
    older than the cutoff with a NULL key or tenant. ``nullable``: the columns that can be NULL
    (default: all of them); None when none can."""
    cols = [c for c in planned_columns(spec) if nullable is None or c in nullable]
    if not cols:
        return None
    parts: list[Fragment] = []
    if spec.timestamp in cols:
        parts.append(Fragment(sql.SQL("{} IS NULL").format(col(spec.timestamp)), []))
    others = [c for c in cols if c != spec.timestamp]
    if others:
        any_null = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(col(c)) for c in others)
        older = older_than(spec, cutoff)
        parts.append(Fragment(sql.SQL("({} AND ({}))").format(older.sql, any_null), older.params))
    joined = Fragment.join(parts, " OR ")
    return Fragment(sql.SQL("({})").format(joined.sql), joined.params)


class Scope(NamedTuple):
    """One tenant's key interval [key_from, key_to); ``key_to`` None: to the end of the keys."""

    tenant: str | None
    key_from: int | None
    key_to: int | None


def outside_scopes(
    spec: PolicySpec, scopes: Sequence[Scope], *, types: dict | None = None
) -> Fragment:
    """In none of ``scopes`` (TRUE when there are none): the run's discarded scopes, left out of
    its later passes, their DELETEs and its verification.

    One ``NOT EXISTS`` over a ``VALUES`` list, top-level like ``held``: an anti-join that leaves
    the chunk's key-range index scan alone (a ``NOT (s1 OR s2 ...)`` filter skews the row
    estimate and pushes the planner to combine indexes). The tenant is compared in the
    column's own type, as in ``held``."""
    if not scopes:
        return Fragment(sql.SQL("TRUE"), [])
    d = sql.Identifier("d")
    tenant_match = _tenant_equals(spec, d, types)
    rows = sql.SQL(", ").join(sql.SQL("(%s::text, %s::bigint, %s::bigint)") for _ in scopes)
    params = [
        x for s in scopes for x in ((s.tenant if spec.tenant else None), s.key_from, s.key_to)
    ]
    text = sql.SQL(
        "NOT EXISTS (SELECT 1 FROM (VALUES {rows}) AS {d} (tenant, key_from, key_to)"
        " WHERE ({d}.tenant IS NULL OR {tenant_match})"
        " AND ({d}.key_from IS NULL OR {key} >= {d}.key_from)"
        " AND ({d}.key_to IS NULL OR {key} < {d}.key_to))"
    ).format(rows=rows, d=d, tenant_match=tenant_match, key=col(spec.key))
    return Fragment(text, params)


def eligible(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    include_holds: bool = True,
    outside: Sequence[Scope] = (),
) -> Fragment:
    """Older than the cutoff, key and tenant not NULL, not kept, outside the run's discarded
    scopes (``outside``), and (unless told otherwise) not held. The planner (holds left out),
    the DELETE and verification all use this."""
    types = column_types(spec)
    parts = [
        older_than(spec, cutoff, types=types),
        has_values(spec),
        not_kept(spec),
    ]
    if outside:
        parts.append(outside_scopes(spec, outside, types=types))
    if include_holds:
        h = held(spec, policy_id, types=types)
        parts.append(Fragment(sql.SQL("NOT {}").format(h.sql), h.params))
    return Fragment.join(parts, " AND ")


def in_scope(
    spec: PolicySpec, *, tenant: str | None, key_from: int | None, key_to: int | None
) -> Fragment:
    """Restrict to one tenant and key interval [key_from, key_to) (None: unbounded)."""
    parts = []
    if spec.tenant and tenant is not None:
        parts.append(Fragment(sql.SQL("{} = %s").format(col(spec.tenant)), [tenant]))
    if key_from is not None:
        parts.append(Fragment(sql.SQL("{} >= %s").format(col(spec.key)), [key_from]))
    if key_to is not None:
        parts.append(Fragment(sql.SQL("{} < %s").format(col(spec.key)), [key_to]))
    if not parts:
        return Fragment(sql.SQL("TRUE"), [])
    return Fragment.join(parts, " AND ")


def delete_chunk(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    tenant: str | None,
    key_from: int,
    key_to: int,
    outside: Sequence[Scope] = (),
) -> Fragment:
    """The chunk's DELETE: its immutable scope plus the full eligibility predicate (the run's
    discarded scopes excluded, when a chunk of a later pass spans one)."""
    scope = in_scope(spec, tenant=tenant, key_from=key_from, key_to=key_to)
    cond = eligible(spec, policy_id=policy_id, cutoff=cutoff, outside=outside)
    return Fragment(
        sql.SQL("DELETE FROM {} WHERE {} AND {}").format(table(spec), scope.sql, cond.sql),
        scope.params + cond.params,
    )


def count_where(spec: PolicySpec, where: Fragment, *, limit: int | None = None) -> Fragment:
    """``SELECT count(*)`` of rows matching ``where`` (optionally stopping at ``limit``)."""
    if limit is None:
        return Fragment(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table(spec), where.sql), where.params
        )
    return Fragment(
        sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT %s) AS s").format(
            table(spec), where.sql
        ),
        [*where.params, limit],
    )
