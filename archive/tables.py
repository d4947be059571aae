"""The archive step of a chunk transaction when the archive is a table in another registered
database (``[archive] to = "target:NAME/schema.table"``, as the SQL archiver's ``--dest``):
the chunk's DELETE returns the rows it removes, and they are inserted into that table and
committed there, verified, before the chunk's transaction commits.

    source, in the worker's SAVEPOINT:  COPY (DELETE … RETURNING the columns) TO STDOUT
        │ PostgreSQL's own text of each value, streamed block by block (flat memory), each
        │ row's SHA-256 taken on the way (``RowDigest``)
    destination, a transaction of its own (synchronous commit):
        COPY a temporary table FROM STDIN — it must count the rows the DELETE removed
        → INSERT INTO the table SELECT … ON CONFLICT (key) DO NOTHING; when a key was there
          already (a replay), the row there must equal the chunk's, column by column as text
        → read back: every row of the chunk is in the table under its key (their count)
        → COMMIT
    then the worker releases the savepoint and writes the audit record naming the table,
    the rows and their digest, then COMMIT.

A worker killed between the destination's commit and the source's leaves the rows in both:
the replay deletes the same rows again and inserts none twice (the key's conflict), and the
read-back finds them there as they were. A row of the destination with the same key and
other values is a conflict nothing resolves silently: the chunk fails before its DELETE
commits (nothing lost, the run needs attention). Held and kept rows are not deleted, so not
returned, so not archived.
"""

from __future__ import annotations

import contextlib
import hashlib

from django.db import connection
from psycopg import ClientCursor, sql

from archive import objects
from archive import step as archive_step
from retention import predicate as P
from retention.spec import ArchiveTable, PolicySpec
from targets import connections as fleet_connections

TEMP = "retention_archive_rows"
TENANT = archive_step.TENANT
# The text both sessions exchange values in: ISO dates, the interval style every server
# reads, floats to their last digit, bytea as hex (each set for the transaction only).
TEXT_SETTINGS = (
    "SELECT set_config('DateStyle', 'ISO, YMD', true),"
    " set_config('IntervalStyle', 'postgres', true),"
    " set_config('extra_float_digits', '3', true), set_config('bytea_output', 'hex', true),"
    " set_config('TimeZone', 'UTC', true)"
)


class RowDigest:
    """The digest of a chunk's rows in an archive table, fed PostgreSQL's text COPY stream of
    them (under ``TEXT_SETTINGS``) block by block: the SHA-256 of the rows' own SHA-256s in
    byte order — so it does not depend on the order the rows come in, and the same rows read
    from either database, in any order, give the same digest. ``extra``: trailing columns of
    the stream that are not archived (the tenant counted per chunk), left out."""

    def __init__(self, extra: int = 0) -> None:
        self.extra, self.tail, self.hashes = extra, b"", []

    def update(self, block) -> None:
        lines = (self.tail + bytes(block)).split(b"\n")  # a value's newline is escaped: \\n
        self.tail = lines.pop()
        if self.extra:
            lines = [line.rsplit(b"\t", self.extra)[0] for line in lines]
        self.hashes.extend(hashlib.sha256(line).digest() for line in lines)

    @property
    def rows(self) -> int:
        return len(self.hashes)

    def hexdigest(self) -> str:
        if self.tail:
            raise objects.ArchiveError("the rows' COPY stream ended inside a row")
        digest = hashlib.sha256()
        for row in sorted(self.hashes):
            digest.update(row)
        return digest.hexdigest()


def object_name(dest: ArchiveTable, run_id: int, chunk_id: int) -> str:
    """The name of a chunk's rows in the archive's table, in its audit record."""
    return f"{dest.url}#run-{run_id}/chunk-{chunk_id}"


def _columns(names: list[str], alias: str | None = None) -> sql.Composable:
    if alias is None:
        return sql.SQL(", ").join(sql.Identifier(n) for n in names)
    return sql.SQL(", ").join(
        sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(n)) for n in names
    )


def destination(dest: ArchiveTable):
    """This thread's own connection to the archive's database, usable (reconnected when the
    last one broke)."""
    wrapper = fleet_connections.separate(dest.target)
    raw = wrapper.connection
    if raw is not None and (raw.closed or raw.broken):
        wrapper.close()
    wrapper.ensure_connection()
    return wrapper.connection


def archive_chunk(
    cur,
    spec: PolicySpec,
    *,
    run_id: int,
    chunk_id: int,
    rows: dict,
    by_tenant: bool = False,
    cascade: P.Fragment | None = None,
    spare: P.Fragment | None = None,
) -> archive_step.ArchivedChunk:
    """As ``archive.step.archive_chunk``, the archive being ``spec.archive_table``: the rows the
    chunk's DELETE removes (on ``cur``, in its open transaction and the caller's savepoint)
    are committed in the archive's table and read back before this returns. Raises
    ``ArchiveFailed`` (the destination unreachable, refusing, or holding another row under a
    chunk row's key) or the DELETE's own database error; either way the caller rolls back to
    its savepoint, and the destination's transaction has rolled back."""
    if cascade is not None:  # as the file archive: child rows would go without a copy
        return archive_step.archive_chunk(
            cur, spec, run_id=run_id, chunk_id=chunk_id, attempt=0, rows=rows, cascade=cascade
        )
    dest = spec.archive_table
    raw = cur.connection
    names = [c.name for c in archive_step.table_columns(raw, spec)]
    counted = by_tenant and bool(spec.tenant)
    delete = P.delete_chunk(spec, **rows, cascade=spare)
    returning = [sql.SQL("{}.{}").format(P.row_alias(), sql.Identifier(n)) for n in names]
    if counted:
        returning.append(sql.SQL("{} AS {}").format(P.tenant_text(spec), sql.Identifier(TENANT)))
    statement = sql.SQL("COPY ({} RETURNING {}) TO STDOUT").format(
        delete.sql, sql.SQL(", ").join(returning)
    )
    query = ClientCursor(raw).mogrify(statement, delete.params)
    cur.execute(TEXT_SETTINGS)
    try:
        target = destination(dest)
    except Exception as exc:
        raise archive_step.ArchiveFailed(exc) from exc
    table = sql.SQL("{}.{}").format(sql.Identifier(dest.schema), sql.Identifier(dest.table))
    temp = sql.Identifier(TEMP)
    extra = sql.SQL(", NULL::text AS {}").format(sql.Identifier(TENANT)) if counted else sql.SQL("")
    copied = [*names, TENANT] if counted else names
    done = archive_step.ArchivedChunk(dest.url)
    digest = RowDigest(extra=1 if counted else 0)
    source_error = None
    try:
        with target.cursor() as dcur:
            dcur.execute("BEGIN")
            dcur.execute(
                TEXT_SETTINGS + ", set_config('synchronous_commit', 'on', true),"
                # the chunk's rows are found by the key's index, one by one: the temporary
                # table has no statistics, and a hash join read the whole archive table for
                # each chunk (measured, docs/performance.md)
                " set_config('enable_hashjoin', 'off', true),"
                " set_config('enable_mergejoin', 'off', true),"
                " set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)",
                [str(spec.statement_timeout_ms or 0), str(spec.lock_timeout_ms or 0)],
            )
            dcur.execute(
                sql.SQL(
                    "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}{} FROM {} WITH NO DATA"
                ).format(temp, _columns(names), extra, table)
            )
            with dcur.copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(temp, _columns(copied))
            ) as into:
                try:
                    out = archive_step._CopyOut(raw, query)
                    blocks = out.__enter__()
                except BaseException as exc:
                    source_error = exc
                    raise
                try:
                    for block in _source(blocks.blocks()):
                        digest.update(block)
                        into.write(bytes(block))
                finally:
                    out.__exit__(None, None, None)
            received = dcur.rowcount
            done.deleted = out.rowcount
            if received != done.deleted or digest.rows != done.deleted:
                raise objects.ArchiveError(
                    f"{dest.url} received {received} rows, the DELETE removed {done.deleted}"
                )
            dcur.execute(
                sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO NOTHING").format(
                    table, _columns(names), _columns(names), temp, _columns(list(spec.key_columns))
                )
            )
            inserted = dcur.rowcount
            same_key = sql.SQL(" AND ").join(
                sql.SQL("d.{0} = r.{0}").format(sql.Identifier(k)) for k in spec.key_columns
            )
            if inserted < received:  # keys already there (a replay): their rows must be these
                dcur.execute(
                    sql.SQL(
                        "SELECT count(*) FROM {temp} r JOIN {table} d ON {same}"
                        " WHERE ROW({d})::text IS DISTINCT FROM ROW({r})::text"
                    ).format(
                        temp=temp,
                        table=table,
                        same=same_key,
                        d=_columns(names, "d"),
                        r=_columns(names, "r"),
                    )
                )
                differing = dcur.fetchone()[0]
                if differing:
                    raise objects.ArchiveError(
                        f"{differing} of the chunk's {received} rows have a row with the same key"
                        f" and other values in {dest.url}; nothing deleted"
                    )
            # read back: every row of the chunk is in the table under its key
            dcur.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} r WHERE EXISTS (SELECT 1 FROM {} d WHERE {})"
                ).format(temp, table, same_key)
            )
            found = dcur.fetchone()[0]
            if found != received:
                raise objects.ArchiveError(
                    f"{dest.url} holds {found} of the chunk's {received} rows after the insert"
                )
            if counted:
                dcur.execute(
                    sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(
                        sql.Identifier(TENANT), temp
                    )
                )
                done.tenant_rows = {t: int(n) for t, n in dcur.fetchall()}
            dcur.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(Exception):
            target.execute("ROLLBACK")
        if (
            exc is source_error
            or getattr(exc, "_rr_source", False)
            or not isinstance(exc, Exception)
        ):
            raise  # the DELETE's own error (a lock timeout …), or the process stopping
        raise archive_step.ArchiveFailed(exc) from exc
    if done.deleted:
        done.objects.append(
            objects.ArchivedObject(
                object_name(dest, run_id, chunk_id), spec.qualified_table, found, digest.hexdigest()
            )
        )
    return done


def _source(blocks):
    """``blocks`` with an error of the source's COPY marked as the DELETE's own."""
    try:
        yield from blocks
    except Exception as exc:
        exc._rr_source = True
        raise


# -- reading an archive table back (restore, ``audit verify --archives``) -----------------------


def chunk_scope(spec: PolicySpec, *, tenant: str | None, lo, hi, columns, cutoff) -> P.Fragment:
    """The rows of a chunk's scope (its tenant, its key interval) older than its run's cutoff,
    as a condition on the row ``t``: in the archive's table, every row the chunk archived, and
    any row another run archived from the same interval. Built against the policy's table's
    types (the database in place), which the archive's table shares (``archive_tables``)."""
    scope = P.in_scope(spec, tenant=tenant, key_from=lo, key_to=hi, columns=columns)
    older = P.Fragment(sql.SQL("{} < %s").format(P.timestamp_instant(spec)), [cutoff])
    return P.Fragment.join([scope, older], " AND ")


def _select(dest: ArchiveTable, names: list[str], scope: P.Fragment):
    table = sql.SQL("{}.{} AS t").format(sql.Identifier(dest.schema), sql.Identifier(dest.table))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(_columns(names, "t"), table, scope.sql)


def read_back(spec: PolicySpec, dest: ArchiveTable, scope: P.Fragment) -> tuple[int, str]:
    """(rows, digest) of the archive table's rows in ``scope``, read from there as the archive
    step digests a chunk's rows (``RowDigest``)."""
    names = [c.name for c in archive_step.table_columns(_source_connection(), spec)]
    digest = RowDigest()
    copy_rows(destination(dest), dest, names, scope, digest.update)
    return digest.rows, digest.hexdigest()


def copy_rows(target, dest: ArchiveTable, names: list[str], scope: P.Fragment, write) -> None:
    """Stream the columns ``names`` of the archive table's rows in ``scope`` (PostgreSQL's text
    COPY format) to ``write(block)``, block by block, over ``target`` (``destination``'s
    connection, opened before: the caller's own connection may be busy in a COPY)."""
    with target.cursor() as dcur:
        dcur.execute("BEGIN READ ONLY")
        try:
            dcur.execute(TEXT_SETTINGS)
            query = sql.SQL("COPY ({}) TO STDOUT").format(_select(dest, names, scope))
            with dcur.copy(ClientCursor(target).mogrify(query, scope.params)) as out:
                for block in out:
                    write(block)
        finally:
            dcur.execute("ROLLBACK")


def _source_connection():
    """The database in place (a target's, inside ``targets.connections.on``)."""
    connection.ensure_connection()
    return connection.connection
