"""The catalog's view of a target table's columns, as the engine's statements need it.

The bottom of retention: ``predicate`` (to compare in a column's own type), ``holds`` (to
check a hold's tenant) and ``introspect`` (validation) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from psycopg import sql


def _fetch(query: str, params: list) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


@dataclass(frozen=True)
class ColumnType:
    """What the engine's statements need to know of a column: its type as a schema-qualified
    name (to cast a value to it), its collation (to compare in it) and whether it can be NULL."""

    schema: str
    typname: str
    base: str  # the typname of the base type for a domain, else typname
    collation: tuple[str, str] | None  # (schema, name) of a non-default collation
    not_null: bool
    display: str = ""  # format_type(), e.g. "character varying(20)"

    def cast(self) -> sql.Composed:
        """The type to cast to, without a length or precision (so nothing is truncated)."""
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.typname))

    def collate(self) -> sql.Composable:
        if self.collation is None:
            return sql.SQL("")
        return sql.SQL(" COLLATE {}.{}").format(*map(sql.Identifier, self.collation))


def column_types(schema: str, table: str, names) -> dict[str, ColumnType]:
    """The types of the named columns of ``schema.table`` as the catalog says now (missing
    columns are left out: the statement that uses them then fails with PostgreSQL's own
    error). One small catalog query, run in the caller's transaction."""
    # Two catalog tables joined, the rest scalar lookups by oid: a statement that is cheap to
    # plan, since the engine runs it for every statement it builds.
    rows = _fetch(
        "SELECT a.attname,"
        " (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid = t.typnamespace),"
        " t.typname,"
        " CASE WHEN t.typtype = 'd'"
        "  THEN (SELECT b.typname FROM pg_catalog.pg_type b WHERE b.oid = t.typbasetype)"
        "  ELSE t.typname END,"
        " (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid = co.collnamespace),"
        " co.collname, a.attnotnull,"
        " pg_catalog.format_type(a.atttypid, a.atttypmod)"
        " FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
        " LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation"
        "  AND a.attcollation <> t.typcollation AND co.collname <> 'default'"
        " WHERE a.attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))"
        " AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY(%s)",
        [schema, table, list(names)],
    )
    return {
        name: ColumnType(
            tschema,
            typname,
            base,
            (cschema, collname) if collname else None,
            bool(not_null),
            display,
        )
        for name, tschema, typname, base, cschema, collname, not_null, display in rows
    }
