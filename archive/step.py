"""The archive step of a chunk transaction: the chunk's DELETE returns the rows it removes,
and they are written to a verified Parquet object before the transaction commits.

    SAVEPOINT (the worker's) → ``COPY (DELETE … RETURNING …)
    TO STDOUT (FORMAT binary)`` — the chunk's own DELETE (``predicate.delete_chunk``: its scope
    and whole eligibility predicate, holds and keep rules included), one pass over each row →
    the binary rows decoded into Arrow columns (``copy_binary``: numpy and Arrow kernels, no
    Python object per value), one block (a few MB) at a time, each written as a record batch
    → fsync, rename, read back (the SHA-256 of the bytes
    on disk against the one computed while writing, the row count of the footer) → the worker
    releases the savepoint and writes the audit record naming the object, then COMMIT.

A failure anywhere (the directory read-only or full, a value Parquet cannot hold, a lock
timeout) leaves the transaction to roll back to the savepoint: the DELETE is undone before
anything commits. The rows come in the order the DELETE's plan visits them (the key's, or the
heap's): a replay under the same plan writes the bytes a killed attempt wrote, under its own
attempt's name either way; the killed attempt's object is an orphan the reconciler removes.
"""

from __future__ import annotations

import queue
import select
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg import ClientCursor, sql
from psycopg import errors as e
from psycopg.pq import ExecStatus, Format

from archive import columns as C
from archive import objects
from retention import predicate as P
from retention.spec import PolicySpec, SpecError
from targets import connections as fleet

if TYPE_CHECKING:
    import pyarrow as pa

BLOCK_BYTES = 4 << 20  # COPY rows decoded (and written as one record batch) at a time
TENANT = "rr_tenant"  # the row's tenant as text, counted, not archived


class ArchiveFailed(Exception):
    """The archive step failed; the caller rolls back to its savepoint (nothing deleted)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"archive: {error}")
        self.error = error


@dataclass
class ArchivedChunk:
    to: str
    objects: list[objects.ArchivedObject] = field(default_factory=list)
    deleted: int = 0  # rows the DELETE removed (each one in the object)
    tenant_rows: dict[str | None, int] = field(default_factory=dict)

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


@dataclass(frozen=True)
class _Wire:
    """How a column travels: the expression the DELETE returns, the kind of binary field
    ``copy_binary`` decodes it as, and how that array becomes the archived one (None: as
    decoded)."""

    expr: sql.Composable
    kind: str
    convert: object = None


def _wire(c: C.ArchivedColumn, raw) -> _Wire:
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa
    import pyarrow.compute as pc

    from archive import copy_binary as B  # numpy and pyarrow: see above

    ref = sql.SQL("{}.{}").format(P.row_alias(), sql.Identifier(c.name))
    text = sql.SQL("{}::text").format(ref)
    if c.as_text:
        return _Wire(text, "text")
    t = c.arrow
    kind = B.kind_of(t)
    if kind in B.FIXED:  # returned as the base type itself: a domain's or oid's binary form
        return _Wire(sql.SQL("{}::{}").format(ref, sql.SQL(B.FIXED[kind][0])), kind)
    if kind is not None:  # text, varchar, bpchar (its padding kept), name; bytea
        return _Wire(ref, kind)
    if pa.types.is_decimal(t):  # numeric(p, s): its text, exact, cast in C
        return _Wire(text, "text", lambda a, t=t: pc.cast(a, t))
    if pa.types.is_list(t):  # PostgreSQL's array text, read by psycopg's loader of the type
        loader = raw.adapters.get_loader(c.oid, Format.TEXT)(c.oid, raw)
        return _Wire(
            text,
            "text",
            lambda a, t=t, load=loader.load: pa.array(
                [None if v is None else load(v.encode()) for v in a.to_pylist()], t
            ),
        )
    return _Wire(text, "text")


def copy_statement(
    spec: PolicySpec,
    wires: list[_Wire],
    *,
    rows: dict,
    by_tenant: bool,
    spare: P.Fragment | None,
) -> P.Fragment:
    """The chunk's DELETE (``predicate.delete_chunk``, ``spare`` as its extra condition)
    returning the archived columns (``a0``, ``a1`` …, then ``rr_tenant`` when counted per
    tenant) in PostgreSQL's binary COPY format: no value formatted as text that is not text
    already. Not sorted: a sort of the returned rows costs more than the DELETE (measured,
    docs/performance.md)."""
    delete = P.delete_chunk(spec, **rows, cascade=spare)
    returning = [
        sql.SQL("{} AS {}").format(w.expr, sql.Identifier(f"a{i}")) for i, w in enumerate(wires)
    ]
    if by_tenant and spec.tenant:
        returning.append(sql.SQL("{} AS {}").format(P.tenant_text(spec), sql.Identifier(TENANT)))
    return P.Fragment(
        sql.SQL("COPY ({} RETURNING {}) TO STDOUT (FORMAT binary)").format(
            delete.sql, sql.SQL(", ").join(returning)
        ),
        delete.params,
    )


def archive_chunk(
    cur,
    spec: PolicySpec,
    *,
    run_id: int,
    chunk_id: int,
    attempt: int,
    rows: dict,
    by_tenant: bool = False,
    cascade: P.Fragment | None = None,
    spare: P.Fragment | None = None,
) -> ArchivedChunk:
    """Delete the rows of one chunk (``rows``: ``predicate.delete_chunk``'s scope arguments)
    on the psycopg cursor ``cur``, inside its open transaction and the caller's savepoint,
    writing each to the chunk attempt's Parquet object, verified before this returns.
    ``cascade``: the table's cascade guard — a cascading foreign key that appeared after the
    version was approved, whose child rows would go without a copy: refused. ``spare``: the
    rows a row that stays references (the worker's ``cascades.spare_referenced``,
    ``kept_referenced``), neither archived nor deleted. Raises ``ArchiveFailed`` (the
    destination, a value Parquet cannot hold) or the COPY's own database error; either way the
    caller rolls back to its savepoint."""
    # pyarrow and numpy load only where an archive is read or written
    import pyarrow as pa
    import pyarrow.compute as pc

    from archive import copy_binary as B  # numpy and pyarrow: see above

    if cascade is not None:
        raise ArchiveFailed(
            SpecError(
                f"{spec.qualified_table} is referenced with ON DELETE CASCADE: its child rows "
                "would be deleted without a copy; an archiving policy deletes nothing there"
            )
        )
    raw = cur.connection
    cols = table_columns(raw, spec)
    wires = [_wire(c, cur) for c in cols]
    counted = by_tenant and bool(spec.tenant)
    statement = copy_statement(spec, wires, rows=rows, by_tenant=by_tenant, spare=spare)
    schema = C.schema_of(cols, {"pg_table": spec.qualified_table})
    kinds = [w.kind for w in wires] + (["text"] if counted else [])
    done = ArchivedChunk(spec.archive_to or "")
    tenants: Counter = Counter()
    name = objects.object_name(spec.slug, run_id, chunk_id, attempt, target=fleet.current())

    def batches(blocks: Iterator[tuple[bytearray, list[int]]]) -> Iterator[pa.RecordBatch]:
        for block, starts in blocks:
            columns = B.decode(block, starts, kinds)
            if counted:
                for item in pc.value_counts(columns[-1]).to_pylist():
                    tenants[item["values"]] += item["counts"]
            arrays = [
                w.convert(column) if w.convert else column
                for w, column in zip(wires, columns, strict=False)
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    query = ClientCursor(raw).mogrify(statement.sql, statement.params)
    with _CopyOut(raw, query) as copy, _Prefetch(copy.row_blocks()) as prefetched:
        blocks = iter(prefetched)
        first = next(blocks, None)
        if first is not None:
            try:
                done.objects.append(
                    objects.write(
                        spec.archive_dir,
                        name,
                        spec.qualified_table,
                        schema,
                        batches(_chain(first, blocks)),
                    )
                )
            except (OSError, pa.ArrowException, ValueError) as exc:
                raise ArchiveFailed(exc) from exc
    done.deleted = copy.rowcount
    if done.deleted != done.rows:
        raise ArchiveFailed(
            objects.ArchiveError(
                f"archive object {name} holds {done.rows} rows, the DELETE removed {done.deleted}"
            )
        )
    done.tenant_rows = dict(tenants)
    return done


class _CopyOut:
    """``COPY … TO STDOUT`` read straight from libpq (``pgconn.get_copy_data``), a row per
    call: psycopg's ``Copy`` re-enters its wait loop for every row, which at a few thousand
    rows a chunk costs more than the DELETE itself. Leaving the block drains what is left of
    the COPY, so the connection is ready for the caller's ROLLBACK TO SAVEPOINT; a database
    error is raised as psycopg raises it (``rowcount``: the rows the statement copied)."""

    def __init__(self, conn, query: str) -> None:
        self.conn, self.pgconn = conn, conn.pgconn
        self.query = query.encode(conn.info.encoding)
        self.rowcount = -1
        self._open = False

    def __enter__(self) -> _CopyOut:
        self.conn.lock.acquire()
        try:
            pgconn = self.pgconn
            pgconn.send_query(self.query)
            while pgconn.flush():  # a nonblocking connection: wait until the query is out
                select.select([], [pgconn.socket], [])
            result = self._result()
            if result is None or result.status != ExecStatus.COPY_OUT:
                self._finish(result)
                raise e.ProgrammingError("COPY TO STDOUT expected")
            self._open = True
        except BaseException:
            self.conn.lock.release()
            raise
        return self

    def blocks(self, size: int = BLOCK_BYTES) -> Iterator[bytearray]:
        """The COPY's text in blocks of about ``size`` bytes, cut between rows (PostgreSQL
        sends each row of a COPY TO as one message)."""
        pgconn = self.pgconn
        get = pgconn.get_copy_data
        while self._open:
            # each row copied into the block at once, so libpq's buffer of it is freed at
            # once: holding a block's rows as libpq's buffers until they are joined cost five
            # times the CPU a row (measured, docs/performance.md)
            block = bytearray()
            while len(block) < size:
                nbytes, data = get(1)
                if nbytes > 0:
                    block += data
                elif not self._wait(nbytes):
                    break
            if block:
                yield block

    def row_blocks(self, size: int = BLOCK_BYTES) -> Iterator[tuple[bytearray, list[int]]]:
        """The rows of a binary COPY in blocks of about ``size`` bytes, each with the offsets
        its rows begin at; the binary header and trailer left out."""
        # pyarrow and numpy load only where an archive is read or written
        from archive import copy_binary as B

        get = self.pgconn.get_copy_data
        header = True
        while self._open:
            block = bytearray()  # as in ``blocks``, each row copied out of libpq at once
            starts: list[int] = []
            while len(block) < size:
                nbytes, data = get(1)
                if nbytes > 0:
                    if header:  # the first message: the header, then the first row or the
                        header = False  # trailer (no row) or nothing
                        data = bytes(data)
                        if not data.startswith(B.SIGNATURE):
                            raise e.ProgrammingError("COPY TO STDOUT (FORMAT binary) expected")
                        skip = B.HEADER + int.from_bytes(data[B.HEADER - 4 : B.HEADER], "big")
                        data = data[skip:]
                        if not data or data == B.TRAILER:
                            continue
                    elif nbytes == 2 and data == B.TRAILER:
                        continue
                    starts.append(len(block))
                    block += data
                elif not self._wait(nbytes):
                    break
            if starts:
                yield block, starts

    def _wait(self, nbytes: int) -> bool:
        """After ``get_copy_data`` gave no row: wait for the server (True), or finish the COPY
        (False)."""
        pgconn = self.pgconn
        if nbytes == 0:  # nothing buffered yet
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
            return True
        self._open = False
        if nbytes == -2:
            raise e.OperationalError(pgconn.get_error_message())
        self._finish(self._result())
        return False

    def __exit__(self, *exc) -> None:
        try:
            if self._open:  # the reader stopped early: the rest of the COPY is read and dropped
                for _ in self.blocks():
                    pass
        finally:
            self.conn.lock.release()

    def _result(self):
        pgconn = self.pgconn
        pgconn.consume_input()
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        return pgconn.get_result()

    def _finish(self, result) -> None:
        """The COPY's final result, and the end of the statement's results."""
        error = None
        while result is not None:
            if result.status == ExecStatus.COMMAND_OK:
                self.rowcount = result.command_tuples or 0
            elif result.status == ExecStatus.FATAL_ERROR and error is None:
                error = e.error_from_result(result, encoding=self.conn.info.encoding)
            result = self._result()
        if error is not None:
            raise error


class _Prefetch:
    """The COPY's blocks read by a thread of their own, up to ``depth`` blocks ahead: the
    server streams the chunk's rows while this process decodes and writes the blocks before
    them, instead of stopping on a full socket at every block (libpq's wait releases the GIL,
    and so do numpy's and Arrow's kernels and the Parquet writer). Memory stays bounded: at
    most ``depth`` blocks wait. Leaving the block stops the thread and joins it before anything
    else (``_CopyOut.__exit__``) touches the connection; an error of the read (the COPY's own
    database error) is raised to the reader."""

    def __init__(self, source: Iterator, depth: int = 2) -> None:
        self.source = source
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name="archive-copy", daemon=True)

    def __enter__(self) -> _Prefetch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def __iter__(self) -> Iterator:
        while True:
            kind, value = self.queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    def _read(self) -> None:
        try:
            for item in self.source:
                if not self._put(("block", item)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # raised again in the reader's thread
            self._put(("error", exc))

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def _chain(first, rest: Iterator) -> Iterator:
    yield first
    yield from rest
