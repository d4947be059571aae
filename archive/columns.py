"""A target table's columns and their Arrow types: how each PostgreSQL type is kept in Parquet.

Kept natively: integers, floats, booleans, ``numeric(p, s)`` as ``decimal128(p, s)`` (or
``decimal256`` up to 76 digits), text types, ``bytea`` as binary, ``timestamptz`` as UTC
microseconds with the zone, ``timestamp`` as microseconds, ``date``, ``time``, and
one-dimensional arrays of these as lists. Kept exactly as PostgreSQL's own text (the column
read as ``::text``): ``json``/``jsonb``, ``uuid``, ``numeric`` without a precision, and every
other type (``interval``, ``inet``, enums, …). Each Parquet field carries the column's
PostgreSQL type in its metadata (``pg_type``), so a reader — and ``archive.restore`` — knows
what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


@cache
def _native() -> dict[str, pa.DataType]:
    """The PostgreSQL types kept natively, by name."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa

    return {
        "int2": pa.int16(),
        "int4": pa.int32(),
        "int8": pa.int64(),
        "oid": pa.int64(),
        "float4": pa.float32(),
        "float8": pa.float64(),
        "bool": pa.bool_(),
        "text": pa.string(),
        "varchar": pa.string(),
        "bpchar": pa.string(),
        "name": pa.string(),
        "bytea": pa.binary(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "timestamp": pa.timestamp("us"),
        "date": pa.date32(),
        "time": pa.time64("us"),
    }


@dataclass(frozen=True)
class ArchivedColumn:
    name: str
    pg_type: str  # format_type(): "numeric(12,2)", "timestamp with time zone", "text[]"
    arrow: pa.DataType
    as_text: bool  # read as ::text and kept as PostgreSQL writes it
    oid: int = 0  # the column's type (a domain's base type): an array's text is loaded by it

    def field(self) -> pa.Field:
        # pyarrow and numpy load only where an archive is read or written
        import pyarrow as pa

        meta = {"pg_type": self.pg_type}
        if self.as_text:
            meta["pg_text"] = "true"
        return pa.field(self.name, self.arrow, nullable=True, metadata=meta)


def _numeric(typmod: int) -> pa.DataType | None:
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa

    if typmod < 4:  # no precision given: any number of digits, kept as its text
        return None
    precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    if scale > precision or scale > 1000:  # a negative or larger scale (PostgreSQL 15+)
        return None
    if precision <= 38:
        return pa.decimal128(precision, scale)
    if precision <= 76:
        return pa.decimal256(precision, scale)
    return None


def _arrow(base: str, typmod: int) -> pa.DataType | None:
    if base == "numeric":
        return _numeric(typmod)
    return _native().get(base)


def table_columns(conn, schema: str, table: str) -> list[ArchivedColumn]:
    """Every column of ``schema.table`` in the table's order, with its Arrow type (one catalog
    query on ``conn``, in its transaction). Generated columns are left out: they are computed again
    when a row is restored."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa

    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.atttypmod,"
            " CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END,"
            " CASE WHEN t.typtype = 'd' THEN b.typelem ELSE t.typelem END,"
            " (SELECT e.typname FROM pg_catalog.pg_type e WHERE e.oid ="
            "   CASE WHEN t.typtype = 'd' THEN b.typelem ELSE t.typelem END),"
            " CASE WHEN t.typtype = 'd' THEN b.typcategory ELSE t.typcategory END,"
            " CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END"
            " FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
            " LEFT JOIN pg_catalog.pg_type b ON b.oid = t.typbasetype"
            " WHERE a.attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))"
            " AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"
            " ORDER BY a.attnum",
            [schema, table],
        )
        rows = cur.fetchall()
    found = []
    for name, display, typmod, base, elem, elem_name, category, oid in rows:
        arrow = None
        if category == "A" and elem:
            inner = _arrow(elem_name, typmod)
            arrow = pa.list_(inner) if inner is not None else None
        else:
            arrow = _arrow(base, typmod)
        found.append(ArchivedColumn(name, display, arrow or pa.string(), arrow is None, int(oid)))
    return found


def schema_of(columns: list[ArchivedColumn], metadata: dict[str, str]) -> pa.Schema:
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa

    return pa.schema([c.field() for c in columns], metadata=metadata)
