"""Putting archived rows back: the rows of one archive object (a Parquet file, or a chunk's rows
in an archive table of another database) that match a restore's scope and whose key is not in
the table again are inserted, in the caller's transaction.

    CREATE TEMP TABLE (LIKE the table) → COPY the object's record batches into it (one batch in
    memory at a time; PostgreSQL parses each value in the column's own type, a text-kept one
    from its own text) → INSERT … SELECT the rows in scope WHERE NOT EXISTS the same key
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from psycopg import sql

from archive import step, tables
from retention import predicate as P
from retention.catalog import column_types
from retention.spec import PolicySpec

TEMP = "retention_restore_rows"
BATCH_ROWS = 10_000


def restore_object(
    conn,
    spec: PolicySpec,
    path: Path,
    *,
    tenant: str | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> int:
    """Insert the rows of the archive object at ``path`` that belong to ``tenant`` (its text;
    a policy whose tenant is one column), whose timestamp is in ``[time_from, time_to)`` and
    whose key is not present again; the number inserted."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names

    def fill(cur, temp, cols) -> None:
        with cur.cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(temp, cols)) as copy:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                    copy.write_row(row)

    return _restore(conn, spec, names, fill, tenant, time_from, time_to)


def restore_from_table(
    conn,
    spec: PolicySpec,
    scope: P.Fragment,
    *,
    tenant: str | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> int:
    """As ``restore_object``, the rows being those of the archive's table in another database
    (``spec.archive_table``) within ``scope`` (``archive.tables.chunk_scope``), streamed from
    there in PostgreSQL's text COPY format."""
    names = [c.name for c in step.table_columns(conn.connection, spec)]
    source = tables.destination(spec.archive_table)

    def fill(cur, temp, cols) -> None:
        with cur.cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(temp, cols)) as copy:
            tables.copy_rows(source, spec.archive_table, names, scope, copy.write)

    with conn.cursor() as cur:
        cur.execute(tables.TEXT_SETTINGS)
    return _restore(conn, spec, names, fill, tenant, time_from, time_to)


def _restore(conn, spec: PolicySpec, names, fill, tenant, time_from, time_to) -> int:
    """CREATE TEMP TABLE (LIKE the table) → ``fill(cursor, temp, columns)`` → INSERT … SELECT
    the rows in scope WHERE NOT EXISTS the same key; the rows inserted."""
    target = sql.SQL("{}.{}").format(sql.Identifier(spec.schema), sql.Identifier(spec.table))
    temp = sql.Identifier(TEMP)
    cols = sql.SQL(", ").join(sql.Identifier(n) for n in names)
    with conn.cursor() as cur:
        raw = cur.connection
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(temp).as_string(raw))
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP")
            .format(temp, target)
            .as_string(raw)
        )
        fill(cur, temp, cols)
        where, params = _scope(spec, tenant, time_from, time_to)
        key = sql.SQL(", ").join(
            sql.SQL("r.{}").format(sql.Identifier(k)) for k in spec.key_columns
        )
        same = sql.SQL(" AND ").join(
            sql.SQL("t.{0} = r.{0}").format(sql.Identifier(k)) for k in spec.key_columns
        )
        cur.execute(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT {rcols} FROM {temp} r WHERE {where}"
                " AND NOT EXISTS (SELECT 1 FROM {target} t WHERE {same}) ORDER BY {key}"
            )
            .format(
                target=target,
                cols=cols,
                rcols=sql.SQL(", ").join(sql.SQL("r.{}").format(sql.Identifier(n)) for n in names),
                temp=temp,
                where=where,
                same=same,
                key=key,
            )
            .as_string(raw),
            params,
        )
        inserted = cur.rowcount
        cur.execute(sql.SQL("DROP TABLE {}").format(temp).as_string(raw))
    return inserted


def _scope(spec: PolicySpec, tenant, time_from, time_to) -> tuple[sql.Composable, list]:
    parts: list[sql.Composable] = [sql.SQL("TRUE")]
    params: list = []
    if tenant is not None:
        (column,) = spec.tenant_columns
        ctype = column_types(spec.schema, spec.table, [column])[column]
        parts.append(sql.SQL("r.{} = %s::{}").format(sql.Identifier(column), ctype.cast()))
        params.append(tenant)
    for bound, op in ((time_from, ">="), (time_to, "<")):
        if bound is not None:
            with P.aliased("r"):
                instant = P.timestamp_instant(spec)
            parts.append(sql.SQL("{} {} %s").format(instant, sql.SQL(op)))
            params.append(bound)
    return sql.SQL(" AND ").join(parts), params
