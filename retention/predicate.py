"""The one eligibility predicate, shared by preview, planner, worker and verification.

Every statement on a user table is composed here from ``psycopg.sql``
identifiers (names validated by ``retention.introspect`` against the catalog)
and bound parameters. Keep rules and legal holds are part of the statement
itself, so the database evaluates them at the moment of deletion — never
Python beforehand.
"""

from __future__ import annotations

import math
import threading
import uuid
import zoneinfo
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from psycopg import sql

from core.filters import BIGINT_MAX  # integer bounds are compared as bigint (``typed_as_key``)
from retention import catalog, decisions
from retention.models import LegalHold
from retention.spec import LIST_OPERATORS, KeepRule, PolicySpec

ROW = sql.Identifier("t")


class _Aliases(threading.local):
    """The open ``aliased`` scopes of this thread, innermost last."""

    def __init__(self) -> None:
        self.open: list[sql.Identifier] = []


_ALIASES = _Aliases()


def row_alias() -> sql.Identifier:
    """The alias the row is read under: ``t``, or inside ``aliased`` that scope's."""
    return _ALIASES.open[-1] if _ALIASES.open else ROW


class aliased:
    """Within this scope the fragments built here read the row under ``name`` instead of ``t``:
    a statement that judges rows of a second table (or a second row of the same one) beside the
    target's, such as ``retention.cascades``'s guard, builds their predicates in one."""

    def __init__(self, name: str) -> None:
        self.alias = sql.Identifier(name)

    def __enter__(self) -> sql.Identifier:
        _ALIASES.open.append(self.alias)
        return self.alias

    def __exit__(self, exc_type, exc, tb) -> bool:
        _ALIASES.open.pop()
        return False


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
    return sql.SQL("{}.{}").format(row_alias(), sql.Identifier(name))


def table(spec: PolicySpec) -> sql.Composed:
    return sql.SQL("{}.{} AS {}").format(
        sql.Identifier(spec.schema), sql.Identifier(spec.table), row_alias()
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


# -- tenants ---------------------------------------------------------------------------
# A tenant value is carried as text: one column's text form (``col::text``), or for a tenant of
# several columns the JSON array of its parts' text forms (``["project", "42"]``, as jsonb
# writes it). Statements compare it with the row in each column's own type and collation.


def tenant_text(spec: PolicySpec, alias: sql.Identifier | None = None) -> sql.Composable:
    """The row's tenant as text (NULL when the tenant, or any part of it, is NULL)."""
    alias = alias or row_alias()
    cols = [sql.SQL("{}.{}").format(alias, sql.Identifier(c)) for c in spec.tenant_columns]
    if not cols:
        return sql.SQL("NULL::text")
    if len(cols) == 1:
        return sql.SQL("{}::text").format(cols[0])
    return sql.SQL("CASE WHEN ({}) IS NOT NULL THEN jsonb_build_array({})::text END").format(
        sql.SQL(", ").join(cols), sql.SQL(", ").join(sql.SQL("{}::text").format(c) for c in cols)
    )


def tenant_is_null(spec: PolicySpec) -> sql.Composable:
    """The row's tenant is NULL: its column, or any of its columns, is NULL."""
    return sql.SQL("({})").format(
        sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(col(c)) for c in spec.tenant_columns)
    )


def tenant_equals(spec: PolicySpec, text: sql.Composable, types=None) -> sql.Composable:
    """The row's tenant equals the tenant text ``text`` (an expression: a parameter, a hold's
    or a scope's column) in each tenant column's own type and collation, so the type's ``=``
    decides; TRUE for a policy without a tenant column."""
    if not spec.tenant:
        return sql.SQL("TRUE")
    types = column_types(spec) if types is None else types
    cols = spec.tenant_columns
    parts = []
    for i, name in enumerate(cols):
        value = (
            text if len(cols) == 1 else sql.SQL("(({})::jsonb ->> {})").format(text, sql.Literal(i))
        )
        ctype = types.get(name)
        if ctype is None:  # the column is gone: the statement fails on it, as it should
            parts.append(sql.SQL("{}::text = {}").format(col(name), value))
        else:
            parts.append(
                sql.SQL("{} = ({}::{}){}").format(col(name), value, ctype.cast(), ctype.collate())
            )
    return (
        sql.SQL(" AND ").join(parts)
        if len(parts) == 1
        else sql.SQL("({})").format(sql.SQL(" AND ").join(parts))
    )


def tenants_query(spec: PolicySpec) -> Fragment:
    """Distinct tenants (as ``predicate.tenant_text``), by a loose index scan over the
    (tenant…, key) index: a tenant of several columns is walked as a row."""
    cols = [sql.Identifier(c) for c in spec.tenant_columns]
    tbl = sql.SQL("{}.{}").format(sql.Identifier(spec.schema), sql.Identifier(spec.table))
    n = len(cols)
    names = [sql.Identifier(f"v{i}") for i in range(n)]

    def row(items):
        return items[0] if n == 1 else sql.SQL("({})").format(sql.SQL(", ").join(items))

    listed = sql.SQL(", ").join(cols)
    not_null = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(c) for c in cols)
    walked = [sql.SQL("walk.{}").format(v) for v in names]
    # one scalar subquery per column of the next tenant: the row after the current one
    nexts = sql.SQL(", ").join(
        sql.SQL(
            "(SELECT {c} FROM {tbl} WHERE {nn} AND {row} > {at} ORDER BY {cols} LIMIT 1)"
        ).format(c=c, tbl=tbl, nn=not_null, row=row(cols), at=row(walked), cols=listed)
        for c in cols
    )
    texts = [sql.SQL("{}::text").format(v) for v in names]
    text = (
        texts[0]
        if n == 1
        else sql.SQL("jsonb_build_array({})::text").format(sql.SQL(", ").join(texts))
    )
    query = sql.SQL(
        "WITH RECURSIVE walk({names}) AS ("
        " (SELECT {cols} FROM {tbl} WHERE {nn} ORDER BY {cols} LIMIT 1)"
        " UNION ALL"
        " SELECT {nexts} FROM walk WHERE walk.v0 IS NOT NULL"
        ") SELECT {text} FROM walk WHERE walk.v0 IS NOT NULL"
    ).format(
        names=sql.SQL(", ").join(names), cols=listed, tbl=tbl, nn=not_null, nexts=nexts,
        text=text,
    )  # fmt: skip
    return Fragment(query, [])


def composite_text(text: str) -> bool:
    """Whether a hold's tenant text names the parts of a tenant of several columns."""
    return text.startswith("[")


def _tenant_equals(spec, alias: sql.Identifier, types, *, hold: bool = False) -> sql.Composable:
    """The row's tenant equals ``alias.tenant`` (stored as text). A hold on all policies that
    names one value cannot name a tenant of several columns: it covers every row of such a
    policy (``hold``), as a tenant-scoped hold does in a policy without a tenant column."""
    equal = tenant_equals(spec, sql.SQL("{}.tenant").format(alias), types)
    if hold and len(spec.tenant_columns) > 1:
        return sql.SQL("CASE WHEN left({}.tenant, 1) = '[' THEN {} ELSE TRUE END").format(
            alias, equal
        )
    return equal


def held(
    spec: PolicySpec,
    policy_id: int,
    *,
    types: dict | None = None,
    holds: sql.Composable | None = None,
) -> Fragment:
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
    every row: it cannot tell the tenant's rows from the others, so it protects them all.

    ``holds``: where the holds are read from (default: the hold table; a statement that checks
    many rows one by one names a materialized copy of the active ones instead)."""
    hold = sql.Identifier("h")
    tenant_match = _tenant_equals(spec, hold, types, hold=True)
    text = sql.SQL(
        "EXISTS (SELECT 1 FROM {holds} AS {h} WHERE ({h}.released_at IS NULL"
        " OR {h}.id <> ALL(%s::bigint[]))"
        " AND ({h}.policy_id IS NULL OR {h}.policy_id = %s)"
        " AND ({h}.tenant IS NULL OR {tenant_match})"
        "{keys})"
    ).format(
        holds=holds or sql.Identifier(LegalHold._meta.db_table),
        h=hold,
        tenant_match=tenant_match,
        keys=_hold_keys(spec, hold, types),
    )
    return Fragment(text, [decisions.verified_release_ids(), policy_id])


def _hold_keys(spec: PolicySpec, hold: sql.Identifier, types) -> sql.Composable:
    """A hold's key interval (integers) applies to a policy with one integer key column; on any
    other key it cannot be placed in the key's order, so it is decided conservatively: the
    interval is ignored and the hold covers every row of its tenant (or all rows)."""
    if not integer_key(spec, types):
        return sql.SQL("")
    return sql.SQL(
        " AND ({h}.key_from IS NULL OR {key} >= {h}.key_from)"
        " AND ({h}.key_to IS NULL OR {key} < {h}.key_to)"
    ).format(h=hold, key=col(spec.key_columns[0]))


class _Scopes(threading.local):
    """The open ``cached_types`` scopes of this thread, innermost last, each with the facts it
    keeps (``retention drain --workers N`` runs its workers as threads, each in scopes of its
    own runs)."""

    def __init__(self) -> None:
        self.open: list[tuple[object, dict]] = []


_SCOPES = _Scopes()
# token -> that scope's catalog facts, the least recently entered first. A whole scope (a run
# and its version) is let go when more than ``_MAX_SCOPES`` were entered since: never one fact
# at a time, so a run's chunk does not find some of its facts gone and read them again inside
# its transaction; and a scope open in a thread keeps its facts until it closes, whatever other
# runs of the process enter meanwhile.
_FACTS: OrderedDict[object, dict] = OrderedDict()
_FACTS_LOCK = threading.Lock()
_MAX_SCOPES = 64


def _facts() -> dict | None:
    """The innermost open scope's facts (None outside every scope)."""
    return _SCOPES.open[-1][1] if _SCOPES.open else None


def column_types(spec: PolicySpec) -> dict:
    """The catalog's types of the key, timestamp and tenant columns (``catalog.ColumnType``):
    one catalog query, or none inside a ``cached_types`` scope that looked them up already."""
    names = planned_columns(spec)
    return scoped(
        ("types", spec.schema, spec.table, tuple(names)),
        lambda: catalog.column_types(spec.schema, spec.table, names),
    )


def scoped(name: tuple, compute):
    """``compute()``, once per ``cached_types`` scope and ``name`` (each call without a scope):
    catalog facts other than column types kept like them (``retention.cascades.graph_of``)."""
    facts = _facts()
    if facts is None:
        return compute()
    if name not in facts:
        facts[name] = compute()
    return facts[name]


class cached_types:
    """Within this scope, ``column_types`` asks the catalog once per table and columns.

    ``token`` names what the types are cached for — a run and its approved version: the
    columns' types cannot change under an approved version without the statements that use
    them failing, and a failure calls ``forget_types(token)`` (the next statement looks the
    types up again, so a table altered mid-run is read afresh). The facts outlive the scope,
    for the token's next one, while fewer than ``_MAX_SCOPES`` other tokens were entered since
    in this process."""

    def __init__(self, token):
        self.token = token

    def __enter__(self):
        with _FACTS_LOCK:
            facts = _FACTS.pop(self.token, None)
            if facts is None:
                facts = {}
            _FACTS[self.token] = facts  # the most recently entered
            while len(_FACTS) > _MAX_SCOPES:
                _FACTS.popitem(last=False)
        _SCOPES.open.append((self.token, facts))
        return self

    def __exit__(self, exc_type, exc, tb):
        _SCOPES.open.pop()
        if exc_type is not None:
            forget_types(self.token)
        return False


def forget_types(token) -> None:
    """Drop what is cached for ``token``: the next statement of any scope of it, open or not,
    reads the catalog again."""
    with _FACTS_LOCK:
        facts = _FACTS.get(token)
        if facts is not None:
            facts.clear()
    for open_token, facts in _SCOPES.open:
        if open_token == token:
            facts.clear()


def planned_columns(spec: PolicySpec) -> list[str]:
    """The columns a run plans by: timestamp, key and tenant — and the column the version's
    classes read. The timestamp first, each once."""
    names = [spec.timestamp, *spec.key_columns, *spec.tenant_columns]
    names += [c.column for c in spec.classes[:1]]
    return list(dict.fromkeys(names))


def required_columns(spec: PolicySpec) -> list[str]:
    """The planned columns a row needs a value in to be eligible: a row with NULL in any of
    them has no age or no key interval to be planned in — and, unless the policy says
    ``null_tenant = "delete"``, no tenant. The timestamp first, each once."""
    names = [spec.timestamp, *spec.key_columns]
    if spec.null_tenant != "delete":
        names += spec.tenant_columns
    return list(dict.fromkeys(names))


INTEGER_KEY_TYPES = ("int2", "int4", "int8")


def integer_key(spec: PolicySpec, types: dict | None = None) -> bool:
    """The key is one integer column: chunk bounds are also kept as bigints (``key_from``,
    ``key_to``), a chunk is bisected arithmetically and legal holds' key intervals apply."""
    if len(spec.key_columns) != 1:
        return False
    types = column_types(spec) if types is None else types
    found = types.get(spec.key_columns[0])
    return found is not None and found.base in INTEGER_KEY_TYPES


# -- keys and bounds ---------------------------------------------------------------------
# A key value is carried as a tuple of the text forms of its columns' values (PostgreSQL's
# own output, ``col::text``: lossless for every btree type the engine accepts) and cast back
# to each column's type — with the column's collation — where a statement compares with it.
# A composite key is compared as a row: ``(a, b) >= (x, y)``, which a btree index on (a, b)
# serves as one index condition.

Bound = tuple  # of str, one per key column (or per chunk column: ``chunk_columns``)


def chunk_columns(spec: PolicySpec, columns: Sequence[str] | None = None) -> tuple[str, ...]:
    """The columns chunk bounds are on: ``columns`` when given (a run's own,
    ``runs.models.Run.bound_columns`` — ``(timestamp, key…)`` or ``(timestamp,)`` for chunks
    in timestamp order), else the key's. Only the chunk's scope compares with them: the key
    keeps its meaning everywhere else (legal holds, NULL keys, partitions)."""
    return tuple(columns) if columns else spec.key_columns


def integer_bounds(spec: PolicySpec, columns=None, types: dict | None = None) -> bool:
    """Chunk bounds on one integer column, the key: kept as bigints too (``key_from``,
    ``key_to``) and bisected arithmetically (``integer_key`` on the chunk columns)."""
    return chunk_columns(spec, columns) == spec.key_columns and integer_key(spec, types)


UUID_MAX = 2**128 - 1


def successor(spec: PolicySpec, value: Bound | None, types: dict, columns=None) -> Bound | None:
    """The least key value above ``value`` (a bound on the chunk columns) where the last chunk
    column's type has one: an integer's + 1 (within bigint), a uuid's next 128-bit value (its
    btree order). By row order ``(a, b)``'s successor is ``(a, b')``. None for every other
    type (text in a collation, numeric, timestamps…) and past the type's largest value."""
    if value is None:
        return None
    ctype = types.get(chunk_columns(spec, columns)[-1])
    base = ctype.base if ctype is not None else ""
    if base in INTEGER_KEY_TYPES:
        number = int(value[-1])
        after = str(number + 1) if number < BIGINT_MAX else None
    elif base == "uuid":
        number = uuid.UUID(value[-1]).int
        after = str(uuid.UUID(int=number + 1)) if number < UUID_MAX else None
    else:
        after = None
    return None if after is None else (*value[:-1], after)


def bound(value) -> Bound | None:
    """A key bound in its one form: None, an integer (a plain integer key), a text or a
    sequence of texts (one per key column)."""
    if value is None:
        return None
    if isinstance(value, int):
        return (str(value),)
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


# The helpers below take the chunk columns (``columns``; default: the key's columns).


def key_expr(
    spec: PolicySpec, alias: sql.Identifier | None = None, *, columns=None
) -> sql.Composable:
    """The row's key: ``t.id`` or the row ``(t.a, t.b)``."""
    alias = alias or row_alias()
    names = chunk_columns(spec, columns)
    cols = [sql.SQL("{}.{}").format(alias, sql.Identifier(c)) for c in names]
    return cols[0] if len(cols) == 1 else sql.SQL("({})").format(sql.SQL(", ").join(cols))


def key_order(spec: PolicySpec, *, descending: bool = False, columns=None) -> sql.Composable:
    """``ORDER BY`` the key, column by column (what a btree index on the columns returns)."""
    way = sql.SQL(" DESC") if descending else sql.SQL("")
    return sql.SQL(", ").join(
        sql.SQL("{}{}").format(col(c), way) for c in chunk_columns(spec, columns)
    )


def key_texts(spec: PolicySpec, *, columns=None) -> sql.Composable:
    """The key's columns as text, for ``SELECT`` (read back as a ``Bound``)."""
    return sql.SQL(", ").join(
        sql.SQL("{}::text").format(col(c)) for c in chunk_columns(spec, columns)
    )


def _typed(spec: PolicySpec, name: str, types: dict) -> sql.Composable:
    return typed_as_key(spec, name, types, sql.SQL("%s"))


def typed_as_key(spec: PolicySpec, name: str, types: dict, expr: sql.Composable) -> sql.Composable:
    """``expr`` (a parameter, or an expression in parentheses) as key column ``name`` compares
    with it: cast to the column's type, with its collation; an integer column's as bigint."""
    ctype = types.get(name)
    if ctype is None:  # the column is gone: the statement fails on it, as it should
        return expr
    if ctype.base in INTEGER_KEY_TYPES:
        # as bigint: a chunk of a smallint key may end at 32768 (last key + 1), which the
        # column's own type cannot hold; btree compares integers across widths
        return sql.SQL("{}::pg_catalog.int8").format(expr)
    return sql.SQL("{}::{}{}").format(expr, ctype.cast(), ctype.collate())


def key_value(spec: PolicySpec, value: Bound, types: dict, *, columns=None) -> Fragment:
    """A key value as the key compares with it: each text cast to its column's type."""
    parts = [_typed(spec, c, types) for c in chunk_columns(spec, columns)]
    if len(value) != len(parts):
        raise ValueError(f"a bound of {len(value)} value(s) for a key of {len(parts)} column(s)")
    text = parts[0] if len(parts) == 1 else sql.SQL("({})").format(sql.SQL(", ").join(parts))
    return Fragment(text, list(value))


def key_compare(spec: PolicySpec, op: str, value: Bound, types: dict, *, columns=None) -> Fragment:
    """``key <op> value`` (``>=`` or ``<``), a row comparison for a composite key."""
    v = key_value(spec, value, types, columns=columns)
    return Fragment(
        sql.SQL("{} {} {}").format(key_expr(spec, columns=columns), sql.SQL(op), v.sql), v.params
    )


def has_values(spec: PolicySpec) -> Fragment:
    """Key and tenant are not NULL (the timestamp comparison already excludes a NULL one; a
    NULL tenant is allowed with ``null_tenant = "delete"``)."""
    cols = [c for c in required_columns(spec) if c != spec.timestamp]
    return Fragment(
        sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(col(c)) for c in cols), []
    )


WALL_CLOCK_TYPES = ("timestamp", "date")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# microseconds per unit of an epoch timestamp column (``timestamp_unit``)
MICROSECONDS_PER = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _timestamp_base(spec: PolicySpec, types: dict | None) -> str | None:
    types = column_types(spec) if types is None else types
    found = types.get(spec.timestamp)
    return found.base if found is not None else None


def epoch_value(spec: PolicySpec, instant: datetime, base: str | None) -> int | Decimal | float:
    """``instant`` in the epoch column's unit: exact for a ``numeric`` column; for an integer
    column the least integer not before it, so ``col < value`` says exactly ``col``'s instant
    is before ``instant``."""
    micro = (instant - EPOCH) // timedelta(microseconds=1)
    per = MICROSECONDS_PER[spec.timestamp_unit]
    if base == "numeric":
        return Decimal(micro) / Decimal(per)
    if base in ("float8", "float4"):
        # the least double not below the exact value: ``col < value`` then holds for exactly
        # the stored numbers below the cutoff (a real column compares as a double, exactly)
        exact = Decimal(micro) / Decimal(per)
        value = float(exact)
        return value if Decimal(value) >= exact else math.nextafter(value, math.inf)
    return -(-micro // per)


def cutoff_value(
    spec: PolicySpec, cutoff: datetime, *, types: dict | None = None
) -> datetime | date | int | Decimal:
    """The cutoff as the timestamp column compares with it, computed once in Python from the
    run's cutoff: the instant itself for a ``timestamptz`` column; for a ``timestamp without
    time zone`` column the wall-clock time of that instant in ``spec.column_zone`` (never the
    session's zone); for a ``date`` column that wall-clock time's date — a row goes only when
    its whole day is past the cutoff, so ``col < date`` — and for an epoch column
    (``timestamp_unit``) the instant in the column's unit (``epoch_value``)."""
    base = _timestamp_base(spec, types)
    if spec.timestamp_unit:
        return epoch_value(spec, cutoff, base)
    if base in WALL_CLOCK_TYPES:
        local = cutoff.astimezone(zoneinfo.ZoneInfo(spec.column_zone)).replace(tzinfo=None)
        return local.date() if base == "date" else local
    return cutoff


def timestamp_instant(spec: PolicySpec, *, types: dict | None = None) -> sql.Composable:
    """The row's timestamp as an instant (``timestamptz``): read in ``spec.column_zone`` when
    the column holds wall-clock time (a ``date``: the start of its day), counted from the Unix
    epoch in ``spec.timestamp_unit`` for an epoch column. For what people read (ages, the
    oldest row, months); eligibility compares the column itself (``older_than``)."""
    if spec.timestamp_unit:
        per_second = 1_000_000 // MICROSECONDS_PER[spec.timestamp_unit]
        return sql.SQL("to_timestamp({}::float8 / {})").format(
            col(spec.timestamp), sql.Literal(per_second)
        )
    base = _timestamp_base(spec, types)
    if base not in WALL_CLOCK_TYPES:
        return sql.SQL("{}::timestamptz").format(col(spec.timestamp))
    return sql.SQL("({}::timestamp AT TIME ZONE {})").format(
        col(spec.timestamp), sql.Literal(spec.column_zone)
    )


def epoch_instant(spec: PolicySpec, value) -> datetime:
    """The instant an epoch column's value (a number, or its text) counts to."""
    micro = Decimal(str(value)) * MICROSECONDS_PER[spec.timestamp_unit]
    return EPOCH + timedelta(microseconds=int(micro))


def shown_value(spec: PolicySpec, column: str, text: str) -> str:
    """A value of ``column`` (a chunk bound's text) as people read it: an epoch timestamp's as
    the instant it counts to (``2026-11-20 12:00:00+00:00``), anything else as it is."""
    if column == spec.timestamp and spec.timestamp_unit and text is not None:
        try:
            return str(epoch_instant(spec, text))
        except (ArithmeticError, ValueError, OverflowError):
            return text
    return text


def cutoff_param(spec: PolicySpec, types: dict | None = None) -> sql.Composable:
    """The placeholder of the timestamp's bound, cast where the bound's Python type does not
    say the column's: an epoch column's to bigint (an integer column's family: its btree serves
    ``int4 < int8``) or numeric, a date column's to date."""
    if spec.timestamp_unit:
        base = _timestamp_base(spec, types)
        if base in ("float8", "float4"):  # a real column's btree serves ``float4 < float8``
            return sql.SQL("%s::pg_catalog.float8")
        return sql.SQL("%s::pg_catalog.numeric" if base == "numeric" else "%s::pg_catalog.int8")
    return sql.SQL("%s")


def older_than(spec: PolicySpec, cutoff: datetime, *, types: dict | None = None) -> Fragment:
    """``ts < bound`` in the column's own type (so its index serves the comparison): the bound
    is the cutoff as the column compares with it (``cutoff_value``) — of the version's latest
    period cutoff (``latest_cutoff``), the range every row that may go is in; which of its
    rows a period lets go is ``within_periods``."""
    types = column_types(spec) if types is None else types
    return Fragment(
        sql.SQL("{} < {}").format(col(spec.timestamp), cutoff_param(spec, types)),
        [cutoff_value(spec, latest_cutoff(spec, cutoff), types=types)],
    )


# -- periods: the default retention, [[override]] per tenant, [[class]] per kind of row ----------
# A row's period is the longest of those that apply to it (its tenant's override, its class);
# the default when none does. ``older_than`` bounds the range by the latest period cutoff and
# ``within_periods`` decides each row in it, in the same statement.


def latest_cutoff(spec: PolicySpec, cutoff: datetime) -> datetime:
    """The latest cutoff of the version's periods in the run whose default cutoff (or slice
    bound) is ``cutoff``: rows at or after it are outside every period."""
    found = [spec.period_cutoff(cutoff, p) for p in spec.periods]
    return max(c for c in [cutoff, *found] if c is not None)


_BOUND_TYPES = {"timestamptz": "timestamptz", "timestamp": "timestamp", "date": "date"}


def _bound_type(spec: PolicySpec, types: dict) -> sql.Composable:
    """The type period bounds are passed in: the timestamp column's compare type."""
    base = _timestamp_base(spec, types)
    if spec.timestamp_unit:
        name = "numeric" if base == "numeric" else "int8"
    else:
        name = _BOUND_TYPES.get(base, "timestamptz")
    return sql.SQL("pg_catalog.{}").format(sql.Identifier(name))


def array_literal(values: Sequence[str | None]) -> str:
    """``values`` as PostgreSQL's text form of an array (``{"a","b\\"c",NULL}``), read by the
    array type's own input function when the parameter is cast (``%s::text[]``)."""
    items = (
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return "{" + ",".join(items) + "}"


# (what, id of a version's overrides tuple) -> (that tuple, what was derived from it)
_BY_OVERRIDES: dict[tuple[str, int], tuple[tuple, object]] = {}
_MAX_CACHED = 256


def _per_overrides(overrides: tuple, derive):
    """``derive(overrides)``, kept per overrides tuple *object*: a version's parsed spec keeps
    one for the life of the process, so every chunk of its runs finds it by identity instead of
    hashing (and comparing) its thousands of tenants, as a cache keyed by value would on every
    statement. The entry holds the tuple itself, so its id is not reused while it is kept."""
    key = (derive.__name__, id(overrides))
    found = _BY_OVERRIDES.get(key)
    if found is not None and found[0] is overrides:
        return found[1]
    if len(_BY_OVERRIDES) >= _MAX_CACHED:
        _BY_OVERRIDES.clear()
    value = derive(overrides)
    _BY_OVERRIDES[key] = (overrides, value)
    return value


def _override_arrays(overrides: tuple) -> tuple[str, str, tuple[str, ...]]:
    """The overrides as two parallel array texts — tenants, and the number (from 1) of each
    one's period among the distinct periods — and those periods. Kept per version: a run's
    chunks pass the same thousands of values, written once instead of adapted value by value
    for every statement, and only a few bounds (one per distinct period) are typed per
    statement."""
    periods = tuple(dict.fromkeys(o.retention for o in overrides))
    tenants, numbers = [], []
    for o in overrides:
        tenants += o.tenants
        numbers += [str(periods.index(o.retention) + 1)] * len(o.tenants)
    return array_literal(tenants), "{" + ",".join(numbers) + "}", periods


def _override_tenants(overrides: tuple) -> str:
    return array_literal([v for o in overrides for v in o.tenants])


def override_anti_join(spec: PolicySpec, cutoff: datetime, types: dict) -> Fragment:
    """No override of the row's tenant keeps it: ``NOT EXISTS`` over the tenant array, each
    tenant's bound picked from the few distinct periods' bounds (NULL: forever)."""
    o = sql.Identifier("o")
    tenants, numbers, periods = _per_overrides(spec.overrides, _override_arrays)
    kind = _bound_type(spec, types)
    bounds = [spec.period_cutoff(cutoff, p) for p in periods]
    return Fragment(
        sql.SQL(
            "NOT EXISTS (SELECT 1 FROM unnest(%s::pg_catalog.text[], %s::pg_catalog.int4[])"
            " AS {o} (tenant, period) WHERE {match}"
            " AND ({ts} < (ARRAY[{bounds}])[{o}.period]) IS NOT TRUE)"
        ).format(
            o=o,
            match=tenant_equals(spec, sql.SQL("{}.tenant").format(o), types),
            ts=col(spec.timestamp),
            bounds=sql.SQL(", ").join(sql.SQL("%s::{}").format(kind) for _ in bounds),
        ),
        [
            tenants,
            numbers,
            *(None if b is None else cutoff_value(spec, b, types=types) for b in bounds),
        ],
    )


# Up to this many distinct override periods, each is one hashed ``= ANY`` test; more, one
# anti-join over all the overrides (``override_anti_join``).
MAX_PERIOD_TESTS = 8


def _tenants_by_period(overrides: tuple) -> tuple[tuple[str, str], ...]:
    """``(period, array text of its tenants)`` per distinct override period."""
    by: dict[str, list[str]] = {}
    for o in overrides:
        by.setdefault(o.retention, []).extend(o.tenants)
    return tuple((period, array_literal(values)) for period, values in by.items())


def tenant_in(
    spec: PolicySpec, array_text: str, types: dict, *, tenant: str | None = None
) -> Fragment:
    """The row's tenant is one of the array's (a text array, cast to the tenant column's type;
    compared in the column's collation): ``= ANY`` of a constant array, which PostgreSQL
    evaluates with a hash table built once per statement. TRUE or FALSE, never NULL.

    ``tenant``: the chunk's own tenant (its scope holds only rows equal to it, by the type's
    ``=``): it is tested instead of each row, once, while the statement is planned."""
    name = spec.tenant_columns[0]
    ctype = types.get(name)
    cast = ctype.cast() if ctype is not None else sql.SQL("pg_catalog.text")
    collate = ctype.collate() if ctype is not None else sql.SQL("")
    if tenant is not None:
        return Fragment(
            sql.SQL("((%s::{}){} = ANY (%s::pg_catalog.text[]::{}[])) IS TRUE").format(
                cast, collate, cast
            ),
            [tenant, array_text],
        )
    # COALESCE, not IS TRUE: the same TRUE or FALSE, but an expression the planner estimates
    # as a whole (a default selectivity) instead of calling the equality's estimator once per
    # element of the array — thousands of calls, more than the statement's own run time
    return Fragment(
        sql.SQL("COALESCE({}{} = ANY (%s::pg_catalog.text[]::{}[]), FALSE)").format(
            col(name), collate, cast
        ),
        [array_text],
    )


def override_tests(
    spec: PolicySpec, cutoff: datetime, types: dict, *, tenant: str | None = None
) -> Fragment:
    """No override of the row's tenant keeps it: per distinct period, the tenant is not in
    that period's tenants, or the row is older than its cutoff (``"forever"``: not in them)."""
    parts = []
    for period, array_text in _per_overrides(spec.overrides, _tenants_by_period):
        listed = tenant_in(spec, array_text, types, tenant=tenant)
        bound = spec.period_cutoff(cutoff, period)
        if bound is None:
            parts.append(Fragment(sql.SQL("NOT {}").format(listed.sql), listed.params))
        else:
            # the row's age first: a row older than the period's cutoff needs no lookup.
            # COALESCE (a no-op: neither side is NULL for a row in the range) hides the
            # comparison from the planner's estimate: a period's cutoff is often older than
            # every row the table's statistics saw, and the planner would then read the
            # timestamp index's end for the actual oldest row — on every chunk, through the
            # rows the chunk before it deleted and no vacuum has removed yet (a tenth of a
            # chunk's time). The filter's work and its order are the same.
            parts.append(
                Fragment(
                    sql.SQL("COALESCE({} < {} OR NOT {}, FALSE)").format(
                        col(spec.timestamp), cutoff_param(spec, types), listed.sql
                    ),
                    [cutoff_value(spec, bound, types=types), *listed.params],
                )
            )
    return Fragment.join(parts, " AND ")


def class_match(spec: PolicySpec, value) -> Fragment:
    """The row is in the class of ``value``: its column ``=`` the value, as a keep rule's."""
    return keep_condition(KeepRule(spec.classes[0].column, "=", value))


def within_periods(
    spec: PolicySpec, cutoff: datetime, *, types: dict | None = None, tenant: str | None = None
) -> Fragment:
    """The row is older than the cutoff of each period that applies to it (its tenant's
    override, its class) and, when none applies, older than the default cutoff: TRUE for a
    version with no override and no class.

    Overrides: per distinct period, the row's age first, then its tenant against a constant
    array of that period's tenants (``tenant_in``: cast to the tenant column's type and compared
    in its collation, as ``held`` compares a hold's; hashed once per statement); with more than
    ``MAX_PERIOD_TESTS`` distinct periods, one anti-join over all of them
    (``override_anti_join``). ``tenant``: the chunk's own tenant, tested once instead of each
    row. Classes are a few equality conditions on one column. The default is only checked
    when some override or class is shorter than it (a later cutoff): otherwise
    ``older_than``'s range is the default's."""
    if not spec.overrides and not spec.classes:
        return Fragment(sql.SQL("TRUE"), [])
    types = column_types(spec) if types is None else types
    ts = col(spec.timestamp)
    parts: list[Fragment] = []
    if spec.overrides:
        if len({o.retention for o in spec.overrides}) <= MAX_PERIOD_TESTS:
            parts.append(override_tests(spec, cutoff, types, tenant=tenant))
        else:
            parts.append(override_anti_join(spec, cutoff, types))
    for entry in spec.classes:
        match = class_match(spec, entry.value)
        bound = spec.period_cutoff(cutoff, entry.retention)
        if bound is None:
            parts.append(Fragment(sql.SQL("({}) IS NOT TRUE").format(match.sql), match.params))
        else:
            parts.append(
                Fragment(
                    # COALESCE: as in ``override_tests``, the class's cutoff is not estimated
                    sql.SQL("COALESCE(({}) IS NOT TRUE OR {} < {}, FALSE)").format(
                        match.sql, ts, cutoff_param(spec, types)
                    ),
                    [*match.params, cutoff_value(spec, bound, types=types)],
                )
            )
    if latest_cutoff(spec, cutoff) > cutoff:  # a period shorter than the default
        default = [
            Fragment(
                sql.SQL("{} < {}").format(ts, cutoff_param(spec, types)),
                [cutoff_value(spec, cutoff, types=types)],
            )
        ]
        if spec.overrides:
            everyone = _per_overrides(spec.overrides, _override_tenants)
            default.append(tenant_in(spec, everyone, types, tenant=tenant))
        if spec.classes:
            rule = KeepRule(
                spec.classes[0].column, "in", None, tuple(c.value for c in spec.classes)
            )
            match = keep_condition(rule)
            default.append(Fragment(sql.SQL("({}) IS TRUE").format(match.sql), match.params))
        joined = Fragment.join(default, " OR ")
        parts.append(Fragment(sql.SQL("({})").format(joined.sql), joined.params))
    return Fragment.join(parts, " AND ")


def null_rows(spec: PolicySpec, *, cutoff: datetime, nullable=None) -> Fragment | None:
    """Rows that are not eligible only because a planned column is NULL: a NULL timestamp, or
    older than the cutoff with a NULL key or tenant. ``nullable``: the columns that can be NULL
    (default: all of them); None when none can."""
    cols = [c for c in required_columns(spec) if nullable is None or c in nullable]
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
    """One tenant's key interval [key_from, key_to); ``key_to`` None: to the end of the keys.
    Bounds in any form ``bound`` takes (an integer, or one text per key column); ``columns``:
    the chunk columns they are on (``chunk_columns``; None: the key's)."""

    tenant: str | None
    key_from: object
    key_to: object
    columns: tuple | None = None


def outside_scopes(
    spec: PolicySpec, scopes: Sequence[Scope], *, types: dict | None = None
) -> Fragment:
    """In none of ``scopes`` (TRUE when there are none): the run's discarded scopes, left out of
    its later passes, their DELETEs and its verification.

    One ``NOT EXISTS`` over a ``VALUES`` list, top-level like ``held``: an anti-join that leaves
    the chunk's key-range index scan alone (a ``NOT (s1 OR s2 ...)`` filter skews the row
    estimate and pushes the planner to combine indexes). The tenant is compared in the
    column's own type, as in ``held`` (and not read when no scope names a tenant); the bounds
    in the key columns' types (a row for a composite key). Key and tenant columns only: the
    planner's index-only walk uses it too."""
    if not scopes:
        return Fragment(sql.SQL("TRUE"), [])
    types = column_types(spec) if types is None else types
    groups: dict[tuple, list] = {}
    for s in scopes:  # one run's scopes share their columns; one NOT EXISTS per set anyway
        groups.setdefault(chunk_columns(spec, s.columns), []).append(s)
    if len(groups) > 1:
        return Fragment.join(
            [_outside(spec, group, columns, types) for columns, group in groups.items()], " AND "
        )
    ((columns, group),) = groups.items()
    return _outside(spec, group, columns, types)


def _outside(spec: PolicySpec, scopes, columns: tuple, types: dict) -> Fragment:
    d = sql.Identifier("d")
    # scopes across tenants only (key-range chunks): the tenant column is not read at all, so
    # the planner's walk can stay on the chunk columns' index alone
    by_tenant = bool(spec.tenant) and any(s.tenant is not None for s in scopes)
    tenant_match = _tenant_equals(spec, d, types) if by_tenant else sql.SQL("TRUE")
    n = len(columns)
    typed = [_typed(spec, c, types) for c in columns]
    row = sql.SQL("(%s::text, {})").format(sql.SQL(", ").join(typed + typed))
    rows = sql.SQL(", ").join(row for _ in scopes)
    params: list = []
    for s in scopes:
        lo, hi = bound(s.key_from), bound(s.key_to)
        params += [(s.tenant if spec.tenant else None), *(lo or [None] * n), *(hi or [None] * n)]
    lo_cols = [sql.Identifier(f"l{i}") for i in range(n)]
    hi_cols = [sql.Identifier(f"h{i}") for i in range(n)]

    def of_d(names):
        items = [sql.SQL("{}.{}").format(d, x) for x in names]
        return items[0] if n == 1 else sql.SQL("({})").format(sql.SQL(", ").join(items))

    text = sql.SQL(
        "NOT EXISTS (SELECT 1 FROM (VALUES {rows}) AS {d} (tenant, {names})"
        " WHERE ({d}.tenant IS NULL OR {tenant_match})"
        " AND ({d}.l0 IS NULL OR {key} >= {lo})"
        " AND ({d}.h0 IS NULL OR {key} < {hi}))"
    ).format(
        rows=rows,
        d=d,
        names=sql.SQL(", ").join(lo_cols + hi_cols),
        tenant_match=tenant_match,
        key=key_expr(spec, columns=columns),
        lo=of_d(lo_cols),
        hi=of_d(hi_cols),
    )
    return Fragment(text, params)


def eligible(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    include_holds: bool = True,
    outside: Sequence[Scope] = (),
    types: dict | None = None,
    tenant: str | None = None,
) -> Fragment:
    """Older than the cutoff, key and tenant not NULL, not kept, outside the run's discarded
    scopes (``outside``), and (unless told otherwise) not held. The planner (holds left out),
    the DELETE and verification all use this. ``tenant``: the chunk's own tenant, when its
    scope holds only that tenant's rows (a tenant's overrides are then decided once)."""
    types = column_types(spec) if types is None else types
    parts = [
        older_than(spec, cutoff, types=types),
        has_values(spec),
        not_kept(spec),
    ]
    if spec.overrides or spec.classes:
        parts.append(within_periods(spec, cutoff, types=types, tenant=tenant))
    if outside:
        parts.append(outside_scopes(spec, outside, types=types))
    if include_holds:
        h = held(spec, policy_id, types=types)
        parts.append(Fragment(sql.SQL("NOT {}").format(h.sql), h.params))
    return Fragment.join(parts, " AND ")


def in_scope(
    spec: PolicySpec,
    *,
    tenant: str | None,
    key_from=None,
    key_to=None,
    types: dict | None = None,
    columns=None,
) -> Fragment:
    """Restrict to one tenant and key interval [key_from, key_to) (None: unbounded; bounds in
    any form ``bound`` takes, on the chunk columns ``columns``: default the key's)."""
    parts = []
    lo, hi = bound(key_from), bound(key_to)
    if (lo is not None or hi is not None) and types is None:
        types = column_types(spec)
    if spec.tenant and tenant is not None:
        if len(spec.tenant_columns) == 1:
            parts.append(Fragment(sql.SQL("{} = %s").format(col(spec.tenant)), [tenant]))
        else:
            types = column_types(spec) if types is None else types
            # the parameter once per tenant column it is read for
            parts.append(
                Fragment(
                    tenant_equals(spec, sql.SQL("%s::text"), types),
                    [tenant] * len(spec.tenant_columns),
                )
            )
    if lo is not None:
        parts.append(key_compare(spec, ">=", lo, types, columns=columns))
    if hi is not None:
        parts.append(key_compare(spec, "<", hi, types, columns=columns))
    if not parts:
        return Fragment(sql.SQL("TRUE"), [])
    return Fragment.join(parts, " AND ")


def delete_chunk(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    tenant: str | None,
    key_from,
    key_to,
    outside: Sequence[Scope] = (),
    by_tenant: bool = False,
    columns=None,
    cascade: Fragment | None = None,
) -> Fragment:
    """The chunk's DELETE: its immutable scope plus the full eligibility predicate (the run's
    discarded scopes excluded, when a chunk of a later pass spans one). ``by_tenant``: a chunk
    across tenants — the statement returns (tenant as text, rows deleted) per tenant.
    ``columns``: the chunk columns its bounds are on (default: the key's); holds, keep rules
    and the key's NULL check are the eligibility predicate's, on the real key. ``cascade``:
    ``retention.cascades.guard`` of a table that cascading foreign keys reference — a row goes
    only when its cascade reaches no protected row."""
    scope, cond = _chunk_rows(spec, policy_id, cutoff, tenant, key_from, key_to, outside, columns)
    if cascade is not None:
        cond = Fragment.join([cond, cascade], " AND ")
    delete = sql.SQL("DELETE FROM {} WHERE {} AND {}").format(table(spec), scope.sql, cond.sql)
    if by_tenant and spec.tenant:
        delete = _per_tenant(spec, delete)
    return Fragment(delete, scope.params + cond.params)


# Tenant types whose equality is identity of their text: grouped by the value itself, each
# group's text is the text of every row in it. (numeric 1.0 = 1.00, citext, a nondeterministic
# collation: equal values whose texts differ — those are grouped by their text.)
_GROUP_RAW = frozenset({"int2", "int4", "int8", "uuid"})


def _per_tenant(spec: PolicySpec, delete: sql.Composable) -> sql.Composable:
    """``delete`` returning (tenant as text, rows deleted) per tenant. The rows are grouped by
    the tenant's own value and only each group's value is cast to text where the type allows
    (``_GROUP_RAW``): a cast per row is a tenth of a chunk of 5,000 rows' time."""
    types = column_types(spec)
    cols = spec.tenant_columns
    if all(types[c].base in _GROUP_RAW and types[c].typname == types[c].base for c in cols):
        d = sql.Identifier("d")
        return sql.SQL("WITH d AS ({} RETURNING {}) SELECT {}, count(*) FROM d GROUP BY {}").format(
            delete,
            sql.SQL(", ").join(
                sql.SQL("{}.{}").format(row_alias(), sql.Identifier(c)) for c in cols
            ),
            tenant_text(spec, d),
            sql.SQL(", ").join(sql.SQL("{}.{}").format(d, sql.Identifier(c)) for c in cols),
        )
    return sql.SQL(
        "WITH d AS ({} RETURNING {} AS tenant) SELECT tenant, count(*) FROM d GROUP BY 1"
    ).format(delete, tenant_text(spec))


def lock_chunk(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    tenant: str | None,
    key_from,
    key_to,
    outside: Sequence[Scope] = (),
    columns=None,
) -> Fragment:
    """``SELECT … FOR UPDATE`` of the rows ``delete_chunk`` (same arguments) may delete, before
    it judges their cascades: a reference an application is inserting to one of them holds the
    row's key-share lock, so this waits for it to commit (or roll back), and the DELETE's own
    snapshot, taken after, sees every reference that can still be made to those rows."""
    scope, cond = _chunk_rows(spec, policy_id, cutoff, tenant, key_from, key_to, outside, columns)
    return Fragment(
        sql.SQL("SELECT 1 FROM {} WHERE {} AND {} FOR UPDATE").format(
            table(spec), scope.sql, cond.sql
        ),
        scope.params + cond.params,
    )


def chunk_rows(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    tenant: str | None,
    key_from,
    key_to,
    outside: Sequence[Scope] = (),
    columns=None,
) -> Fragment:
    """The rows ``delete_chunk`` (same arguments) may delete, as a condition on the row ``t``
    (before the cascade guard): ``retention.cascades.lock_reach`` locks what they reach."""
    scope, cond = _chunk_rows(spec, policy_id, cutoff, tenant, key_from, key_to, outside, columns)
    return Fragment.join([scope, cond], " AND ")


def _chunk_rows(spec, policy_id, cutoff, tenant, key_from, key_to, outside, columns):
    """A chunk's scope and its eligibility predicate (``delete_chunk``, ``lock_chunk``)."""
    scope = in_scope(
        spec,
        tenant=tenant,
        key_from=key_from,
        key_to=key_to,
        types=column_types(spec),
        columns=columns,
    )
    one = tenant if len(spec.tenant_columns) == 1 else None  # the scope's own tenant
    return scope, eligible(spec, policy_id=policy_id, cutoff=cutoff, outside=outside, tenant=one)


def count_chunk(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    tenant: str | None,
    key_from,
    key_to,
    outside: Sequence[Scope] = (),
    columns=None,
    cascade: Fragment | None = None,
) -> Fragment:
    """A count run's chunk: what ``delete_chunk`` (same arguments) would delete, without
    deleting — one ``SELECT`` over the chunk's scope and rows older than the cutoff, grouped
    by tenant (as text) and month of the timestamp in the policy's timezone:
    ``(tenant, "YYYY-MM", rows, kept, held, cascade)``. ``rows`` is the DELETE's own predicate
    (``eligible``, holds included, and the cascade guard); ``kept``: a keep rule protects the
    row; ``held``: eligible but for a legal hold; ``cascade``: eligible, not held, but its
    cascade would reach a protected row. ``chunk_counts`` reads the result."""
    types = column_types(spec)
    scope, _deleted = _chunk_rows(
        spec, policy_id, cutoff, tenant, key_from, key_to, outside, columns
    )  # the DELETE's predicate ``_deleted`` is ``not_held`` AND NOT ``held`` (``eligible``)
    not_held = eligible(
        spec, policy_id=policy_id, cutoff=cutoff, include_holds=False, outside=outside,
        types=types,
    )  # fmt: skip
    older = older_than(spec, cutoff, types=types)
    present = has_values(spec)
    keep = kept(spec)
    h = held(spec, policy_id, types=types)
    g = cascade or Fragment(sql.SQL("TRUE"), [])
    tenant_expr = tenant_text(spec) if spec.tenant else sql.SQL("NULL::text")
    text = sql.SQL(
        "SELECT tn, mo, count(*) FILTER (WHERE e AND NOT h AND g),"
        " count(*) FILTER (WHERE kp), count(*) FILTER (WHERE e AND h),"
        " count(*) FILTER (WHERE e AND NOT h AND NOT g)"
        " FROM (SELECT {tenant} AS tn, to_char({instant} AT TIME ZONE %s, 'YYYY-MM') AS mo,"
        " ({e}) AS e, ({present}) AND ({kp}) AS kp,"
        " CASE WHEN ({e}) THEN {h} ELSE FALSE END AS h,"
        " CASE WHEN ({e}) THEN ({g}) IS TRUE ELSE FALSE END AS g"
        " FROM {table} WHERE {scope} AND {older} OFFSET 0) AS s"
        " WHERE e OR kp GROUP BY 1, 2"
    ).format(
        tenant=tenant_expr,
        instant=timestamp_instant(spec, types=types),
        e=not_held.sql,
        present=present.sql,
        kp=keep.sql,
        h=h.sql,
        g=g.sql,
        table=table(spec),
        scope=scope.sql,
        older=older.sql,
    )
    params = [
        spec.timezone,
        *not_held.params,
        *present.params,
        *keep.params,
        *not_held.params,
        *h.params,
        *not_held.params,
        *g.params,
        *scope.params,
        *older.params,
    ]
    return Fragment(text, params)


def chunk_counts(rows) -> dict:
    """A ``count_chunk`` result as a chunk's counts: totals, and rows per tenant and month."""
    out: dict = {"rows": 0, "kept": 0, "held": 0, "cascade": 0, "tenants": {}, "ages": {}}
    for tn, month, rows_, kept_, held_, blocked in rows:
        out["rows"] += rows_
        out["kept"] += kept_
        out["held"] += held_
        out["cascade"] += blocked
        if rows_:
            if tn is not None:
                out["tenants"][tn] = out["tenants"].get(tn, 0) + rows_
            if month is not None:
                out["ages"][month] = out["ages"].get(month, 0) + rows_
    return out


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


def held_by_tenant(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    outside: Sequence[Scope] = (),
    limit: int,
) -> Fragment:
    """Rows a legal hold defers, per tenant: ``(tenant as text, rows)`` of the rows that are
    eligible but for the holds (``eligible`` without them, and ``held``). One query that reads
    at most ``limit`` held rows; a policy without a tenant column gives one row, tenant NULL."""
    not_held = eligible(
        spec, policy_id=policy_id, cutoff=cutoff, include_holds=False, outside=outside
    )
    h = held(spec, policy_id)
    tenant = tenant_text(spec)
    text = sql.SQL(
        "SELECT tn, count(*) FROM (SELECT {tenant} AS tn FROM {table}"
        " WHERE {not_held} AND {held} LIMIT %s) AS s GROUP BY 1"
    ).format(tenant=tenant, table=table(spec), not_held=not_held.sql, held=h.sql)
    return Fragment(text, [*not_held.params, *h.params, limit])


def verification_counts(
    spec: PolicySpec,
    *,
    policy_id: int,
    cutoff: datetime,
    outside: Sequence[Scope] = (),
    limit: int,
    types: dict | None = None,
    cascade: Fragment | None = None,
) -> Fragment:
    """A run's verification in one statement and one scan of the rows older than the cutoff:
    ``(remaining, deferred_by_holds, null_rows, hold_ids, deferred_by_cascades)``.

    - remaining: ``eligible`` (holds applied, ``outside`` left out) and, with ``cascade``
      (``retention.cascades.guard``), its cascade reaching no protected row — what a later pass
      would delete;
    - deferred_by_holds: eligible but for the holds (``eligible`` without them) and ``held``;
    - deferred_by_cascades: eligible, not held, but its cascade would reach a protected row;
    - null_rows: the rows ``null_rows`` counts (older than the cutoff with a NULL key or tenant,
      and rows with a NULL timestamp), for the planned columns the catalog does not declare
      NOT NULL.

    Each figure is ``count(*) FILTER (…)`` of the same scan, capped at ``limit``: what three
    separate counts stopping at ``limit`` reported. The cap does not cut the scan short (a
    ``LIMIT`` over the combined rows would, and a scan stopped by held or NULL rows could then
    miss a remaining one): a verification that finds nothing left reads the whole old range
    anyway, as the separate counts did. Rows with a NULL timestamp are outside that range;
    when the column is nullable they are a second branch (``IS NULL``: the index's NULL end)
    of the same statement.

    ``held`` is a flag of each row eligible but for the holds, checked once per row (``OFFSET
    0`` keeps the subquery's target list from being copied into the three filters) against a
    materialized copy of the policy's active holds, read once per statement. ``hold_ids``:
    that copy's ids, ascending (NULL when there is none) — the holds the figures were counted
    under, as the statement's own snapshot saw them; a hold released a moment later still
    deferred the rows it counted as held."""
    types = column_types(spec) if types is None else types
    holds = sql.Identifier("active_holds")
    not_held = eligible(
        spec,
        policy_id=policy_id,
        cutoff=cutoff,
        include_holds=False,
        outside=outside,
        types=types,
    )
    h = held(spec, policy_id, types=types, holds=holds)
    older = older_than(spec, cutoff, types=types)
    known_not_null = {name for name, t in types.items() if t.not_null}
    nullable = [c for c in required_columns(spec) if c not in known_not_null]
    null = null_rows(spec, cutoff=cutoff, nullable=nullable) or Fragment(sql.SQL("FALSE"), [])
    # blocked by its cascade: eligible, not held, and the guard is not TRUE
    g = (
        Fragment(
            sql.SQL("({} AND NOT {} AND ({}) IS NOT TRUE)").format(
                not_held.sql, h.sql, cascade.sql
            ),
            [*not_held.params, *h.params, *cascade.params],
        )
        if cascade is not None
        else Fragment(sql.SQL("FALSE"), [])
    )
    rows = sql.SQL(
        "SELECT {e} AS e, {e} AND {h} AS h, {n} AS n, {g} AS g FROM {table}"
        " WHERE {older} AND ({e} OR {n})"
    ).format(e=not_held.sql, h=h.sql, n=null.sql, g=g.sql, table=table(spec), older=older.sql)
    params = [
        *not_held.params, *not_held.params, *h.params, *null.params, *g.params,
        *older.params, *not_held.params, *null.params,
    ]  # fmt: skip
    if spec.timestamp in nullable:
        # ``null_rows`` is TRUE for every row with a NULL timestamp, and no other figure is
        rows = sql.SQL(
            "{} UNION ALL SELECT FALSE, FALSE, TRUE, FALSE FROM {} WHERE {} IS NULL"
        ).format(rows, table(spec), col(spec.timestamp))
    text = sql.SQL(
        "WITH {holds} AS MATERIALIZED (SELECT * FROM {hold_table} WHERE (released_at IS NULL"
        " OR id <> ALL(%s::bigint[])) AND (policy_id IS NULL OR policy_id = %s))"
        " SELECT least(count(*) FILTER (WHERE s.e AND NOT s.h AND NOT s.g), %s),"
        " least(count(*) FILTER (WHERE s.h), %s), least(count(*) FILTER (WHERE s.n), %s),"
        " (SELECT array_agg(a.id ORDER BY a.id) FROM {holds} AS a),"
        " least(count(*) FILTER (WHERE s.g), %s)"
        " FROM ({rows} OFFSET 0) AS s"
    ).format(holds=holds, hold_table=sql.Identifier(LegalHold._meta.db_table), rows=rows)
    released = decisions.verified_release_ids()
    return Fragment(text, [released, policy_id, limit, limit, limit, limit, *params])
