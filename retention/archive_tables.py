"""An archive in another registered database (``[archive] to = "target:NAME/schema.table"``):
what makes its table fit to receive a policy's rows, checked against that database's catalog
when a version is applied, submitted and approved.

The table fits when it exists in target NAME, is not the policy's own table, has every column
the policy's table has (generated ones aside) under the same name and the same type
(``format_type``, as each database's catalog spells it), has no other column that an insert
without it would fail on (NOT NULL without a default), has a primary key or unique index on
exactly the policy's key columns (a replayed chunk inserts ``ON CONFLICT`` on that key, so a
row is never archived twice), and the login this process connects with may insert and select
there. Every refusal is one line naming the destination.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from django.db import connection

from retention.spec import ArchiveTable, PolicySpec, SpecError
from targets import connections as fleet_connections

_COLUMNS = (
    "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attgenerated <> '',"
    " a.attnotnull AND NOT a.atthasdef AND a.attidentity = ''"
    " FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
)
# unique indexes (a primary key's included) over plain columns, valid, not partial: their
# columns' names, in the index's order
_UNIQUE = (
    "SELECT array_agg(a.attname ORDER BY k.n) FROM pg_catalog.pg_index i"
    " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
    " JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    " WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL"
    " AND i.indexprs IS NULL AND k.n <= i.indnkeyatts GROUP BY i.indexrelid"
)


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type(): "numeric(14,4)", "timestamp with time zone", "text[]"
    generated: bool
    required: bool  # NOT NULL without a default: an insert must name it


def _relation(cur, schema: str, table: str) -> int | None:
    cur.execute(
        "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"
        " AND c.relkind IN ('r', 'p')",
        [schema, table],
    )
    row = cur.fetchone()
    return int(row[0]) if row else None


def _columns(cur, oid: int) -> list[Column]:
    cur.execute(_COLUMNS, [oid])
    return [Column(*row) for row in cur.fetchall()]


def source_columns(spec: PolicySpec) -> list[Column]:
    """The policy's table's columns that are archived (generated ones are computed again)."""
    with connection.cursor() as cur:
        oid = _relation(cur, spec.schema, spec.table)
        if oid is None:
            raise SpecError(f"table {spec.qualified_table} does not exist")
        return [c for c in _columns(cur, oid) if not c.generated]


def check_destination(spec: PolicySpec) -> None:
    """SpecError (one line) unless the archive's table fits the policy's table (the module's
    contract). Reads the policy's table on the database in place and the archive's on its
    target, over a connection of its own."""
    dest = spec.archive_table
    if dest is None:
        return
    where = dest.url
    if dest.target == fleet_connections.current() and (dest.schema, dest.table) == (
        spec.schema,
        spec.table,
    ):
        raise SpecError(f"archive.to: {where} is the policy's own table")
    ours = source_columns(spec)
    try:
        wrapper = fleet_connections.separate(dest.target)
        wrapper.ensure_connection()
        raw = wrapper.connection
    except fleet_connections.TargetError as exc:
        raise SpecError(f"archive.to: {exc}") from None
    except Exception as exc:  # the server's reason, never the connection string
        raise SpecError(
            f"archive.to: target {dest.target}: cannot connect: {fleet_connections.first_line(exc)}"
        ) from None
    try:
        with raw.cursor() as cur:
            _check_table(cur, spec, dest, ours)
    finally:
        with contextlib.suppress(Exception):  # validation keeps no connection open
            wrapper.close()


def _check_table(cur, spec: PolicySpec, dest: ArchiveTable, ours: list[Column]) -> None:
    where = dest.url
    oid = _relation(cur, dest.schema, dest.table)
    if oid is None:
        raise SpecError(
            f"archive.to: target {dest.target} has no table {dest.qualified_table}; create it"
            f" with the columns of {spec.qualified_table} first"
        )
    theirs = {c.name: c for c in _columns(cur, oid)}
    problems = []
    for column in ours:
        found = theirs.get(column.name)
        if found is None:
            problems.append(f"{column.name} is missing")
        elif found.generated:
            problems.append(f"{column.name} is a generated column there")
        elif found.type != column.type:
            problems.append(f"{column.name} is {found.type}, not {column.type}")
    names = {c.name for c in ours}
    problems += [
        f"{c.name} is NOT NULL without a default and not a column of {spec.qualified_table}"
        for c in theirs.values()
        if c.required and c.name not in names
    ]
    if problems:
        raise SpecError(
            f"archive.to: {where} does not fit {spec.qualified_table}: " + "; ".join(problems)
        )
    cur.execute(_UNIQUE, [oid])
    keys = list(spec.key_columns)
    if not any(list(row[0]) == keys or sorted(row[0]) == sorted(keys) for row in cur.fetchall()):
        raise SpecError(
            f"archive.to: {where} needs a primary key or unique index on ({', '.join(keys)}):"
            f" a replayed chunk inserts its rows ON CONFLICT on that key, never twice"
        )
    cur.execute(
        "SELECT has_table_privilege(%s::oid, 'INSERT'), has_table_privilege(%s::oid, 'SELECT')",
        [oid, oid],
    )
    may_insert, may_select = cur.fetchone()
    if not (may_insert and may_select):
        raise SpecError(
            f"archive.to: the login of target {dest.target} may not insert into and select from"
            f" {dest.qualified_table}"
        )
