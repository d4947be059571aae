"""The planner: an incremental keyset walk of the key index that turns a run's keys into chunks.

- Index only: the walk reads the key columns (and the tenant, for per-tenant chunks) between
  the run's first and last eligible key — never the timestamp or keep-rule columns — so a
  btree on ``(tenant, key…)`` or ``key…`` answers it with an Index Only Scan and the heap is
  read once, by the DELETE, which applies the whole eligibility predicate. A chunk's
  ``planned_rows`` is therefore the keys in its range when planned: what it can delete at
  most (young, kept and held rows in the range stay).
- Bounded: it keeps at most ``PLANNER_WINDOW`` pending chunks per run, so a huge
  backlog never floods the ledger; workers call it again as chunks finish.
- A window per transaction: one step locks its cursors, reads the boundaries of up to N
  chunks in one query per cursor, inserts them in one statement, advances the cursors in
  one and commits; a crashed planner resumes from the stored cursors.
- Serialized per cursor: a step locks its cursor rows (``SKIP LOCKED``), cursors only move
  forward and chunk identity (run, pass, tenant, bounds) is unique, so two planners never
  create overlapping chunks.
- Any btree-ordered key: bounds are tuples of the key columns' texts
  (``retention.predicate.Bound``), compared as a row for a composite key.
- Memory is independent of table size: a step holds at most N + 1 keys per cursor.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from core import locks, timeouts
from core.filters import BIGINT_MAX
from retention import predicate as P
from retention.spec import PolicySpec
from runs.models import Chunk, PlannerCursor, Run, discarded_scopes, show_bound

LEDGER_KEY_MAX = BIGINT_MAX  # chunk bounds are stored as bigint


def exclusive_end(key: int) -> int | None:
    """The exclusive upper bound just past ``key``; None ("to the end") when ``key`` is the
    largest bigint, where ``key + 1`` fits neither the ledger nor the key column's type."""
    return key + 1 if key < LEDGER_KEY_MAX else None


def _context(exc: BaseException, **context) -> None:
    """Attach where planning stood to a database error (for the dead letter)."""
    exc.planning_context = {**context, **getattr(exc, "planning_context", {})}


def _fetchone(frag: P.Fragment):
    with connection.cursor() as cur:
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        return cur.fetchone()


def _fetchall(frag: P.Fragment):
    with connection.cursor() as cur:
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        return cur.fetchall()


tenants_query = P.tenants_query


def tenants(spec: PolicySpec) -> list[str]:
    return [row[0] for row in _fetchall(tenants_query(spec))]


def bounds_query(
    run_policy_id: int,
    cutoff,
    spec: PolicySpec,
    outside=(),
    columns=None,
    *,
    estimate: int | None = None,
    within: P.Fragment | None = None,
) -> P.Fragment:
    """First and last eligible key (on the chunk columns ``columns``: default the key's), each
    as an array of its columns' texts (holds left to the DELETE; ``outside``: discarded
    scopes; ``within``: a further condition, a later pass's range). The first: an ``ORDER BY
    key LIMIT 1`` read of the key's index (a composite key has no ``min``). The last, exact
    (``estimate`` None): the same read backwards — on a key in time order it passes every
    young row before the first old one, the young part of the table. With ``estimate`` (a
    number of rows) it reads at most that many rows twice instead: the last ``estimate`` keys
    of the key's index (an eligible one among them is the exact last key: ages not in key
    order), else the largest key among the ``estimate`` newest eligible rows, read backwards
    from the cutoff along the timestamp's index (a key in time order: its largest old keys
    are the newest old rows'). That is an eligible row's key, so never past the true last one;
    where it falls short, the verification finds the rows above it and the run plans another
    pass over them (``reconciler.verify``, ``next_pass_range``)."""
    where = P.eligible(
        spec, policy_id=run_policy_id, cutoff=cutoff, include_holds=False, outside=outside
    )
    if within is not None:
        where = P.Fragment.join([where, within], " AND ")
    one = sql.SQL("(SELECT ARRAY[{k}] FROM {tbl} WHERE {w} ORDER BY {o} LIMIT 1)")
    k = P.key_texts(spec, columns=columns)
    first = one.format(k=k, tbl=P.table(spec), w=where.sql, o=P.key_order(spec, columns=columns))
    descending = P.key_order(spec, descending=True, columns=columns)
    if estimate is None:
        last = one.format(k=k, tbl=P.table(spec), w=where.sql, o=descending)
        return P.Fragment(sql.SQL("SELECT {}, {}").format(first, last), where.params * 2)
    cols = sql.SQL(", ").join(P.col(c) for c in P.chunk_columns(spec, columns))
    every = sql.SQL(", ").join(
        P.col(c) for c in dict.fromkeys([*P.chunk_columns(spec, columns), *P.required_columns(spec),
                                         *(r.column for r in spec.keep)])
    )  # fmt: skip
    # the top of the key's index: exact when an eligible key is among its last ``estimate``
    top = sql.SQL(
        "(SELECT ARRAY[{k}] FROM (SELECT {every} FROM {tbl} ORDER BY {o} LIMIT %s) AS {t}"
        " WHERE {w} ORDER BY {o} LIMIT 1)"
    ).format(k=k, every=every, tbl=P.table(spec), o=descending, t=P.ROW, w=where.sql)
    # else the newest eligible rows along the timestamp's index
    newest = sql.SQL(
        "(SELECT ARRAY[{k}] FROM (SELECT {cols} FROM {tbl} WHERE {w} ORDER BY {ts} DESC"
        " LIMIT %s) AS {t} ORDER BY {o} LIMIT 1)"
    ).format(
        k=k, cols=cols, tbl=P.table(spec), w=where.sql, ts=P.col(spec.timestamp), t=P.ROW,
        o=descending,
    )  # fmt: skip
    return P.Fragment(
        sql.SQL("SELECT {}, coalesce({}, {})").format(first, top, newest),
        [*where.params, estimate, *where.params, *where.params, estimate],
    )


def estimates_last_key(spec: PolicySpec, columns=None) -> bool:
    """Whether the run's last eligible key is estimated (``bounds_query``): its chunks are not
    on the timestamp (there the exact bound is one probe of its index already) and a btree
    index leads with the timestamp column, which reads the newest eligible rows first."""
    if P.chunk_columns(spec, columns)[0] == spec.timestamp:
        return False
    return timestamp_indexed(spec)


def estimate_rows(spec: PolicySpec, columns=None) -> int | None:
    """How many rows ``bounds_query`` estimates the last key from, or None (exact)."""
    rows = settings.RETENTION["BOUND_ESTIMATE_ROWS"]
    return rows if rows and estimates_last_key(spec, columns) else None


def timestamp_indexed(spec: PolicySpec) -> bool:
    """A valid, non-partial btree index of the target leads with the timestamp column."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
            " JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid"
            " JOIN pg_catalog.pg_am am ON am.oid = ic.relam"
            " JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE i.indrelid = (SELECT c.oid FROM pg_catalog.pg_class c"
            "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            "  WHERE n.nspname = %s AND c.relname = %s)"
            " AND am.amname = 'btree' AND i.indisvalid AND i.indpred IS NULL AND a.attname = %s)",
            [spec.schema, spec.table, spec.timestamp],
        )
        return bool(cur.fetchone()[0])


def run_bounds_query(run: Run, spec: PolicySpec, outside=(), columns=None) -> P.Fragment:
    """``bounds_query`` as a run's planner sends it: the last key estimated where
    ``estimates_last_key`` (from ``RETENTION["BOUND_ESTIMATE_ROWS"]`` rows); a later pass
    within the range its verification found rows in (``next_pass_range``).

    Per-tenant chunks estimate it too: their verification reads the whole old range, so it
    finds the rows above a short estimate as any others, and another pass plans them (over
    the whole table: that verification does not say where they are). Read exactly, the last
    key of a heap clustered by tenant is a backward read of the key's index whose heap rows
    lie in every tenant's part of the table in turn (1.15 s, 4.5M buffers at 10M rows)."""
    estimate = estimate_rows(spec, columns)
    within, exact = next_pass_range(run, spec, columns)
    return bounds_query(
        run.policy_id, run.bound, spec, outside, columns,
        estimate=None if exact else estimate, within=within,
    )  # fmt: skip


def next_pass_range(run: Run, spec: PolicySpec, columns=None) -> tuple[P.Fragment | None, bool]:
    """Where a pass after the first plans, when the previous pass's verification read only what
    it may have missed (``reconciler.missed_ranges``) and found rows on one side only: from its
    last chunk on (``key >= from``: an estimated last key fell short), or below its first
    chunk (``key < below``, with the exact last key: the backward read starts there). The
    bounds then never walk the key's index across the rows the passes before deleted.
    ``(None, False)``: the whole table, as the first pass."""
    found = run.verification or {}
    missed = found.get("missed")
    if run.pass_no < 2 or not missed or found.get("pass") != run.pass_no - 1:
        return None, False
    types = P.column_types(spec)
    if missed["rows_from"] and not missed["rows_below"]:
        return P.key_compare(spec, ">=", tuple(missed["from"]), types, columns=columns), False
    if missed["rows_below"] and not missed["rows_from"]:
        return P.key_compare(spec, "<", tuple(missed["below"]), types, columns=columns), True
    return None, False


def walk_filter(
    spec: PolicySpec, *, tenant: str | None, last, outside=(), types=None, columns=None
) -> P.Fragment:
    """The keys a cursor's walk may read (the walk adds its lower bound): up to and including
    ``last`` (the run's last eligible key), not NULL, one tenant's for a per-tenant cursor,
    outside the run's discarded scopes. Key and tenant columns only — no timestamp, keep rule
    or hold — so a btree on ``(tenant, key…)`` or ``key…`` answers it with an Index Only Scan;
    the DELETE applies the full eligibility predicate. ``columns``: the chunk columns the
    bounds are on (``predicate.chunk_columns``; default the key's)."""
    types = P.column_types(spec) if types is None else types
    not_null = sql.SQL(" AND ").join(
        sql.SQL("{} IS NOT NULL").format(P.col(c)) for c in P.chunk_columns(spec, columns)
    )
    parts = [
        P.in_scope(spec, tenant=tenant, types=types),
        P.key_compare(spec, "<=", last, types, columns=columns),
        P.Fragment(not_null, []),
    ]
    if outside:
        parts.append(P.outside_scopes(spec, outside, types=types))
    return P.Fragment.join(parts, " AND ")


def window_query(
    spec: PolicySpec,
    walk: P.Fragment,
    position,
    chunk_size: int,
    chunks: int,
    types=None,
    columns=None,
) -> P.Fragment:
    """The boundaries of up to ``chunks`` chunks of ``chunk_size`` keys each, from ``position``
    on along the keys ``walk`` selects, in one statement: a recursive hop from boundary to
    boundary, each hop ``ORDER BY key OFFSET chunk_size - 1 LIMIT 2`` from the last one, an
    Index Only Scan of ``chunk_size + 1`` entries of the key's btree (``chunks * chunk_size``
    entries in all, the heap never read).

    A hop gives the chunk's last key and the next chunk's first key: ``rr_step`` TRUE (they
    differ: a chunk of exactly ``chunk_size`` keys), FALSE (one key value spans the boundary:
    the hops stop there) or NULL (exactly ``chunk_size`` keys were left: the last chunk).
    When fewer than ``chunk_size`` keys are left after the last hop, one more row counts them
    (``rr_tail``; ``rr_top``: an integer key's largest). ``boundaries`` reads the rows."""
    types = P.column_types(spec) if types is None else types
    cols = P.chunk_columns(spec, columns)
    n = len(cols)
    join = sql.SQL(", ").join
    ks = [sql.Identifier(f"rr_k{i}") for i in range(n)]  # a hop's boundary: a chunk's first key
    ls = [sql.Identifier(f"rr_l{i}") for i in range(n)]  # the key before it: a chunk's last

    def typed(column, expr):
        return P.typed_as_key(spec, column, types, expr)

    def of(alias, names):
        return [sql.SQL("{}.{}").format(sql.Identifier(alias), name) for name in names]

    def row(items):
        return items[0] if n == 1 else sql.SQL("({})").format(join(items))

    def regular(alias):  # the hop's two keys differ: the boundary is a key value's first row
        return sql.SQL("{} < {}").format(row(of(alias, ls)), row(of(alias, ks)))

    start = join(
        sql.SQL("{} AS {}").format(typed(c, sql.SQL("%s")), name)
        for c, name in zip(cols * 2, ks + ls, strict=True)
    )
    carried = join(
        typed(c, sql.SQL("({})").format(e)) for c, e in zip(cols * 2, of("x", ks + ls), strict=True)
    )
    pair = join(
        [sql.SQL("{} AS {}").format(P.col(c), name) for c, name in zip(cols, ls, strict=True)]
        + [
            sql.SQL("lead({}) OVER w AS {}").format(P.col(c), name)
            for c, name in zip(cols, ks, strict=True)
        ]
    )
    texts = join(sql.SQL("{}::text").format(e) for e in of("hop", ks + ls))
    nulls = join(sql.SQL("NULL::text") for _ in range(2 * n))
    integer = P.integer_bounds(spec, columns, types)
    top = sql.SQL("max({})::text").format(P.col(cols[0])) if integer else sql.SQL("NULL::text")
    query = sql.SQL(
        "WITH RECURSIVE hop AS ("
        "SELECT {start}, 0 AS rr_i"
        " UNION ALL"
        " SELECT {carried}, hop.rr_i + 1 FROM hop CROSS JOIN LATERAL ("
        "SELECT {pair} FROM (SELECT {key_cols} FROM {tbl} WHERE {walk} AND {key} >= {hop_key}"
        " ORDER BY {order} OFFSET %s LIMIT 2) AS {t} WINDOW w AS (ORDER BY {order})"
        " ORDER BY {order} LIMIT 1) AS x"
        " WHERE hop.rr_i < %s AND (hop.rr_i = 0 OR {hop_regular})"
        "), tail AS (SELECT * FROM hop ORDER BY rr_i DESC LIMIT 1)"
        " SELECT {hop_texts}, rr_i, {hop_regular} AS rr_step, NULL::bigint AS rr_tail,"
        " NULL::text AS rr_top FROM hop WHERE rr_i > 0"
        " UNION ALL"
        " SELECT {nulls}, tail.rr_i, NULL::boolean, x.n, x.top FROM tail CROSS JOIN LATERAL ("
        "SELECT count(*) AS n, {top} AS top FROM {tbl} WHERE {walk} AND {key} >= {tail_key}) AS x"
        " WHERE tail.rr_i < %s AND (tail.rr_i = 0 OR {tail_regular})"
        " ORDER BY rr_i, rr_tail NULLS FIRST"
    ).format(
        start=start,
        carried=carried,
        pair=pair,
        key_cols=join(P.col(c) for c in cols),
        tbl=P.table(spec),
        walk=walk.sql,
        key=P.key_expr(spec, columns=columns),
        hop_key=row(of("hop", ks)),
        order=P.key_order(spec, columns=columns),
        t=P.ROW,
        hop_regular=regular("hop"),
        hop_texts=texts,
        nulls=nulls,
        top=top,
        tail_key=row(of("tail", ks)),
        tail_regular=regular("tail"),
    )
    params = [
        *position,
        *([None] * n),
        *walk.params,
        chunk_size - 1,
        chunks,
        *walk.params,
        chunks,
    ]
    return P.Fragment(query, params)


def boundaries(rows, *, width: int, position, chunk_size: int, integer: bool):
    """Chunks from a ``window_query`` result: ``(planned, ends, tie, at)``.

    ``planned``: ``(lo, hi, keys)`` per chunk, in key order, contiguous from ``position``; a
    chunk is ``[lo, next chunk's first key)``. When the walk ends in this window (``ends``)
    its last chunk runs to the end: an integer key's to its last key + 1 (None past the
    largest bigint), any other key's to None. ``tie``: a key value the next boundary falls
    inside (the hops stopped there), to be planned from ``at`` as one chunk that takes every
    row of the value."""
    planned: list[tuple] = []
    at = tuple(position)
    if not rows:  # the statement always returns a hop or the tail; nothing: nothing left
        return planned, True, None, at
    for row in rows:
        k, last = tuple(row[:width]), tuple(row[width : 2 * width])
        step, tail, top = row[2 * width + 1], row[2 * width + 2], row[2 * width + 3]
        if tail is not None:  # fewer than chunk_size keys after ``at``: the walk's end
            if tail > 0:
                planned.append((at, _end(top, integer), tail))
            return planned, True, None, at
        if step is None:  # exactly chunk_size keys were left: the last chunk
            planned.append((at, _end(last[0], integer), chunk_size))
            return planned, True, None, at
        if not step:  # one key value spans the boundary
            return planned, False, k, at
        planned.append((at, k, chunk_size))
        at = k
    return planned, False, None, at


def _end(last_text: str | None, integer: bool):
    """The upper bound of a walk's last chunk: an integer key's last key + 1, else None."""
    if not integer or last_text is None:
        return None
    end = exclusive_end(int(last_text))
    return None if end is None else (str(end),)


def ensure_cursors(run: Run, spec: PolicySpec) -> None:
    """Create the cursors of the run's current pass (once; serialized by an advisory lock). Once
    they exist, one read says so: a planner call takes no lock that another worker's call
    would queue behind."""
    if PlannerCursor.objects.filter(run=run, pass_no=run.pass_no).exists():
        return
    with (
        transaction.atomic(),
        timeouts.bounded(timeouts.engine_statement_ms(), timeouts.target_lock_ms(spec)),
    ):
        locks.xact_lock(locks.PLANNER, run.id)
        if PlannerCursor.objects.filter(run=run, pass_no=run.pass_no).exists():
            return
        lo, hi = _fetchone(
            run_bounds_query(run, spec, discarded_scopes(run), run.bound_columns(spec))
        )
        if lo is None:
            PlannerCursor.objects.create(run=run, pass_no=run.pass_no, tenant="", exhausted=True)
            return
        names = tenants(spec) if run.per_tenant(spec) else [""]
        PlannerCursor.objects.bulk_create(
            [
                PlannerCursor(
                    run=run, pass_no=run.pass_no, tenant=name, next_at=list(lo), bound_at=list(hi)
                )
                for name in names
            ]
        )


def step(run: Run, spec: PolicySpec, chunk_size: int, chunks: int = 1) -> int | None:
    """Plan up to ``chunks`` chunks in one transaction: lock the least-planned free cursors
    (``FOR UPDATE SKIP LOCKED``, at most ``chunks`` of them; a run with key-range chunks has
    one), read each one's window of boundaries from the key index (``window_query``), insert
    the chunks in one statement and advance the cursors in one. Returns the chunks planned;
    None: no cursor left to work on. Its statements are bounded (a slow or locked target
    fails them as a transient error)."""
    with (
        transaction.atomic(),
        timeouts.bounded(timeouts.engine_statement_ms(), timeouts.target_lock_ms(spec)),
    ):
        cursors = list(
            PlannerCursor.objects.select_for_update(skip_locked=True)
            .filter(run=run, pass_no=run.pass_no, exhausted=False)
            .order_by("chunks_planned", "id")[: max(1, chunks)]
        )
        if not cursors:
            return None
        types = P.column_types(spec)
        outside = discarded_scopes(run)
        new: list[Chunk] = []
        for i, cursor in enumerate(cursors):
            share = chunks // len(cursors) + (1 if i < chunks % len(cursors) else 0)
            try:
                new += _plan_window(run, spec, cursor, chunk_size, max(1, share), outside, types)
            except DatabaseError as exc:
                _context(
                    exc,
                    stage="planning chunks",
                    tenant=cursor.tenant,
                    next_key=show_bound(cursor.position()),
                )
                raise
        if new:
            # one statement; a chunk that exists already (the same identity) is left as it is
            Chunk.objects.bulk_create(new, ignore_conflicts=True)
        fields = ["next_at", "exhausted", "chunks_planned"]
        if len(cursors) == 1:
            cursors[0].save(update_fields=fields)
        else:
            PlannerCursor.objects.bulk_update(cursors, fields)
        return len(new)


def _plan_window(
    run: Run, spec: PolicySpec, cursor: PlannerCursor, chunk_size: int, chunks: int, outside, types
) -> list[Chunk]:
    """The next chunks of ``cursor`` (up to ``chunks``, each of ``chunk_size`` keys — every row
    of a key value in one chunk), unsaved; advances the cursor in memory (exhausted when its
    walk ends). ``planned_rows`` is the keys in the chunk's range now: what it can delete at
    most (some of them are young, kept or held)."""
    columns = run.bound_columns(spec)
    integer = P.integer_bounds(spec, columns, types)
    tenant = cursor.tenant if run.per_tenant(spec) else None
    position = cursor.position()
    walk = walk_filter(
        spec, tenant=tenant, last=cursor.last(), outside=outside, types=types, columns=columns
    )
    rows = _fetchall(window_query(spec, walk, position, chunk_size, chunks, types, columns))
    planned, ends, tie, at = boundaries(
        rows, width=len(columns), position=position, chunk_size=chunk_size, integer=integer
    )
    if tie is not None:
        planned.append(_whole_value(spec, walk, at, tie, integer, types, columns))
    open_end = bool(planned) and planned[-1][1] is None
    if open_end:
        # the walk's last chunk: it ends past the run's last eligible key where the key type
        # has a successor (a uuid's), so its DELETE does not read the young rows above it
        end = P.successor(spec, cursor.last(), types, columns)
        if end is not None:
            planned[-1] = (planned[-1][0], end, planned[-1][2])
    made = []
    for lo, hi, keys in planned:
        made.append(
            Chunk(
                run=run,
                pass_no=run.pass_no,
                tenant=cursor.tenant,
                seq=cursor.chunks_planned,
                key_from=int(lo[0]) if integer else None,
                key_to=int(hi[0]) if integer and hi is not None else None,
                lo=list(lo),
                hi=None if hi is None else list(hi),
                planned_rows=keys,
            )
        )
        cursor.chunks_planned += 1
        if hi is not None:
            cursor.next_at = list(hi)
    if ends or open_end:
        cursor.exhausted = True  # the walk's end, or a chunk to the top of the key range
    return made


def _whole_value(spec: PolicySpec, walk: P.Fragment, lo, value, integer: bool, types, columns):
    """A chunk's boundary falls inside key value ``value``: the chunk ``[lo, the first key
    after it)`` takes every row of it (an integer key's: to the value + 1), counted from the
    key index."""
    after = P.Fragment.join(
        [walk, P.key_compare(spec, ">", value, types, columns=columns)], " AND "
    )
    if integer:
        hi = _end(value[0], True)
    else:
        rows = _fetchall(
            P.Fragment(
                sql.SQL("SELECT {k} FROM {tbl} WHERE {w} ORDER BY {o} LIMIT 1").format(
                    k=P.key_texts(spec, columns=columns),
                    tbl=P.table(spec),
                    w=after.sql,
                    o=P.key_order(spec, columns=columns),
                ),  # fmt: skip
                after.params,
            )
        )
        hi = tuple(rows[0]) if rows else None
    inside = P.Fragment.join(
        [walk, P.in_scope(spec, tenant=None, key_from=lo, key_to=hi, types=types, columns=columns)],
        " AND ",
    )
    (keys,) = _fetchone(P.count_where(spec, inside))
    return tuple(lo), hi, keys


class Planned(int):
    """The number of chunks a ``plan`` call created. ``busy``: it found every cursor the pass
    has left locked by another session's planner step — a window is on the way, and asking
    again before it commits would only find them locked again (``wait_for_window``)."""

    busy: bool = False

    @classmethod
    def of(cls, created: int, *, busy: bool = False) -> Planned:
        planned = cls(created)
        planned.busy = busy
        return planned


def plan(run: Run, *, window: int | None = None, deadline: float | None = None) -> Planned:
    """Top the run's pending chunks up to ``window``, a window of chunks per step (no step
    starts after ``deadline``, a ``time.monotonic()`` value); mark the planner done when every
    cursor of the pass is exhausted. Returns the number of chunks created (``Planned``: and
    whether another session's planner held the cursors)."""
    if run.planner_done:
        return Planned.of(0)
    spec = run.policy_version.parsed
    window = window or settings.RETENTION["PLANNER_WINDOW"]
    try:
        ensure_cursors(run, spec)
    except DatabaseError as exc:
        _context(exc, stage="finding the first and last eligible keys and the tenants")
        raise
    created = 0
    locked = False  # a step found no free cursor
    with connection.cursor() as cur:
        # the pending chunks, and the size chunks are planned at now: the run's, which every
        # worker draining it steps (``worker.adapt_chunk_size``), not this session's copy
        cur.execute(
            "SELECT (SELECT count(*) FROM runs_chunk WHERE run_id = %s AND state = %s),"
            " (SELECT chunk_size FROM runs_run WHERE id = %s)",
            [run.pk, Chunk.State.PENDING.value, run.pk],
        )
        pending, stored = cur.fetchone()
    run.chunk_size = stored or run.chunk_size
    chunk_size = run.chunk_size or spec.chunk_size
    while pending < window and (deadline is None or time.monotonic() < deadline):
        with P.cached_types(("run", run.pk, run.policy_version_id)):
            made = step(run, spec, chunk_size, window - pending)
        if made is None:
            locked = True
            break
        created += made
        pending += made
    left = PlannerCursor.objects.filter(run=run, pass_no=run.pass_no, exhausted=False).exists()
    if locked and left:  # every cursor left is in another planner's step
        return Planned.of(created, busy=True)
    if not left:
        # never waits for the run's row (a finisher verifying it, an operator's decision):
        # while another session holds it, the next call marks the planner done
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE runs_run SET planner_done = true WHERE id = (SELECT id FROM runs_run"
                " WHERE id = %s AND pass_no = %s FOR NO KEY UPDATE SKIP LOCKED)",
                [run.pk, run.pass_no],
            )
            run.planner_done = run.planner_done or cur.rowcount > 0
    return Planned.of(created)


def wait_for_window(run: Run, seconds: float) -> bool:
    """Wait up to ``seconds`` for another session's planner step on the run's current pass to
    end (its window committed or rolled back): a ``FOR KEY SHARE`` read of the pass's open
    cursors, which queues behind the step's ``FOR UPDATE`` of them and behind nothing else, and
    releases its lock at once. True: no step holds them now; False: the time was up first."""

    def take() -> None:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM (SELECT 1 FROM runs_plannercursor WHERE run_id = %s"
                " AND pass_no = %s AND NOT exhausted FOR KEY SHARE) AS c",
                [run.pk, run.pass_no],
            )

    return timeouts.wait_for_lock(seconds, take)
