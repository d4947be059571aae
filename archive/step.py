"""The archive step of a chunk transaction: the chunk's rows, locked and copied to a verified
Parquet object before the DELETE that removes exactly those rows.

    SAVEPOINT → DECLARE a cursor over ``predicate.read_chunk`` (the DELETE's own scope and
    eligibility, holds and keep rules included, ``FOR UPDATE``) → FETCH batches, each written
    as a record batch (one batch in memory at a time) → fsync, rename, read back (digest and
    decoded row count) → RELEASE; the caller then deletes the locked rows by their places
    (``predicate.delete_rows``) and writes the audit record naming the object.

A failure anywhere (the directory read-only or full, a value Parquet cannot hold, a lock
timeout) rolls back to the savepoint before any DELETE ran: ``ArchiveFailed`` carries the
error for the worker to record like a failed DELETE. The step takes the connection the chunk
transaction runs on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.pq import Format

from archive import columns as C
from archive import objects
from retention import predicate as P
from retention.spec import PolicySpec, SpecError

BATCH_ROWS = 10_000
CURSOR = "retention_archive"


class ArchiveFailed(Exception):
    """The archive step failed; the transaction is back at its savepoint (nothing deleted)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"archive: {error}")
        self.error = error


@dataclass
class ArchivedChunk:
    to: str
    objects: list[objects.ArchivedObject] = field(default_factory=list)
    ctids: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(o.rows for o in self.objects)

    def record(self) -> dict:
        """What the chunk's audit record says of its archive (chain version 8)."""
        return {"to": self.to, "objects": [o.to_json() for o in self.objects]}


def table_columns(conn, spec: PolicySpec) -> list[C.ArchivedColumn]:
    """The table's columns as archived, once per run's type scope (``predicate.scoped``)."""
    return P.scoped(
        ("archive_columns", spec.schema, spec.table),
        lambda: C.table_columns(conn, spec.schema, spec.table),
    )


def archive_chunk(
    conn,
    spec: PolicySpec,
    *,
    run_id: int,
    chunk_id: int,
    attempt: int,
    rows: dict,
    cascade: P.Fragment | None = None,
    spare: P.Fragment | None = None,
) -> ArchivedChunk:
    """Lock and archive the rows of one chunk (``rows``: ``predicate.read_chunk``'s scope
    arguments, as the DELETE gets them) on ``conn``, inside its open transaction.
    ``cascade``: the table's cascade guard — a cascading foreign key that appeared after the
    version was approved, whose child rows would go without a copy: refused. ``spare``: the
    rows of a table that references itself which a row that stays references (the worker's
    ``cascades.spare_referenced``), neither archived nor deleted."""
    if cascade is not None:
        raise ArchiveFailed(
            SpecError(
                f"{spec.qualified_table} is referenced with ON DELETE CASCADE: its child rows "
                "would be deleted without a copy; an archiving policy deletes nothing there"
            )
        )
    cols = table_columns(conn, spec)
    select = sql.SQL(", ").join(
        sql.SQL("{}::text" if c.as_text else "{}").format(P.col(c.name)) for c in cols
    )
    statement = P.read_chunk(spec, select=select, extra=spare, **rows)
    schema = C.schema_of(cols, {"pg_table": spec.qualified_table})
    done = ArchivedChunk(spec.archive_to or "")
    name = objects.object_name(spec.slug, run_id, chunk_id, attempt)
    with conn.cursor() as cur:
        _fast_loaders(cur)
        cur.execute("SAVEPOINT chunk_archive")
        try:
            cur.execute(
                sql.SQL("DECLARE {} NO SCROLL CURSOR FOR {}")
                .format(sql.Identifier(CURSOR), statement.sql)
                .as_string(cur.connection),
                statement.params,
            )
            batches = _batches(cur, cols, schema, done.ctids)
            first = next(batches, None)
            if first is not None:
                done.objects.append(
                    objects.write(
                        spec.archive_dir,
                        name,
                        spec.qualified_table,
                        schema,
                        _chain(first, batches),
                    )
                )
            cur.execute(
                sql.SQL("CLOSE {}").format(sql.Identifier(CURSOR)).as_string(cur.connection)
            )
            cur.execute("RELEASE SAVEPOINT chunk_archive")
        except Exception as exc:
            try:
                cur.execute("ROLLBACK TO SAVEPOINT chunk_archive")
            except Exception:
                raise exc from None  # the connection is gone: the transaction with it
            raise ArchiveFailed(exc) from exc
    return done


def _fast_loaders(cur) -> None:
    """psycopg's own (C) loader for ``timestamptz`` on this cursor: the session's loader that
    converts to the project's zone is a Python one, a tenth of a chunk's time per timestamp
    column. A timestamp with its zone is the same instant either way (Arrow stores UTC)."""
    oid = psycopg.adapters.types["timestamptz"].oid
    cur.cursor.adapters.register_loader(oid, psycopg.adapters.get_loader(oid, Format.TEXT))


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


def _batches(
    cur, cols: list[C.ArchivedColumn], schema: pa.Schema, ctids: list[str]
) -> Iterator[pa.RecordBatch]:
    fetch = (
        sql.SQL("FETCH FORWARD {} FROM {}")
        .format(sql.Literal(BATCH_ROWS), sql.Identifier(CURSOR))
        .as_string(cur.connection)
    )
    while True:
        cur.execute(fetch)
        rows = cur.fetchall()
        if not rows:
            return
        values = list(zip(*rows, strict=True))
        ctids.extend(values[0])
        arrays = [pa.array(values[i + 1], type=c.arrow) for i, c in enumerate(cols)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        if len(rows) < BATCH_ROWS:
            return
