"""The planner: an incremental keyset walk that turns a run's eligible rows into chunks.

- Bounded: it keeps at most ``PLANNER_WINDOW`` pending chunks per run, so a huge
  backlog never floods the ledger; workers call it again as chunks finish.
- Durable: each step creates one chunk and advances that tenant's cursor in one
  transaction; a crashed planner resumes from the stored cursor.
- Serialized per cursor: a step locks its cursor row (``SKIP LOCKED``), and chunk
  identity (run, pass, tenant, bounds) is unique, so two planners never create
  overlapping chunks.
- Any btree-ordered key: bounds are tuples of the key columns' texts
  (``retention.predicate.Bound``), compared as a row for a composite key.
- Memory is independent of table size: it holds one cursor and one key at a time.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from psycopg import sql

from core import locks, timeouts
from retention import predicate as P
from retention.spec import PolicySpec
from runs.models import Chunk, PlannerCursor, Run, discarded_scopes, show_bound

LEDGER_KEY_MAX = 2**63 - 1  # chunk bounds are stored as bigint


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


def _planning_filter(run: Run, spec: PolicySpec, outside) -> P.Fragment:
    # Holds are left to the DELETE (they may change while the run goes on); discarded scopes
    # are never planned again.
    return P.eligible(
        spec, policy_id=run.policy_id, cutoff=run.cutoff, include_holds=False, outside=outside
    )


def tenants_query(spec: PolicySpec) -> P.Fragment:
    """Distinct tenants, by a loose index scan over the (tenant, key) index."""
    tcol = sql.Identifier(spec.tenant)
    tbl = sql.SQL("{}.{}").format(sql.Identifier(spec.schema), sql.Identifier(spec.table))
    query = sql.SQL(
        "WITH RECURSIVE walk(v) AS ("
        " (SELECT {t} FROM {tbl} WHERE {t} IS NOT NULL ORDER BY {t} LIMIT 1)"
        " UNION ALL"
        " SELECT (SELECT {t} FROM {tbl} WHERE {t} > walk.v ORDER BY {t} LIMIT 1) FROM walk WHERE walk.v IS NOT NULL"
        ") SELECT v::text FROM walk WHERE v IS NOT NULL"
    ).format(t=tcol, tbl=tbl)
    return P.Fragment(query, [])


def tenants(spec: PolicySpec) -> list[str]:
    return [row[0] for row in _fetchall(tenants_query(spec))]


def bounds_query(run_policy_id: int, cutoff, spec: PolicySpec, outside=()) -> P.Fragment:
    """First and last eligible key, each as an array of its columns' texts (holds left to the
    DELETE; ``outside``: discarded scopes). Two ``ORDER BY key LIMIT 1`` reads of the key's
    index, for any key type (a composite key has no ``min``)."""
    where = P.eligible(
        spec, policy_id=run_policy_id, cutoff=cutoff, include_holds=False, outside=outside
    )
    one = sql.SQL("(SELECT ARRAY[{k}] FROM {tbl} WHERE {w} ORDER BY {o} LIMIT 1)")
    first = one.format(k=P.key_texts(spec), tbl=P.table(spec), w=where.sql, o=P.key_order(spec))
    last = one.format(
        k=P.key_texts(spec), tbl=P.table(spec), w=where.sql, o=P.key_order(spec, descending=True)
    )
    return P.Fragment(sql.SQL("SELECT {}, {}").format(first, last), where.params * 2)


def step_query(spec: PolicySpec, where: P.Fragment, chunk_size: int) -> P.Fragment:
    """The key ``chunk_size`` eligible rows ahead of the cursor, and the one after it (the
    next chunk's first key): at most two rows of the key's column texts."""
    return P.Fragment(
        sql.SQL("SELECT {k} FROM {tbl} WHERE {w} ORDER BY {o} OFFSET %s LIMIT 2").format(
            k=P.key_texts(spec), tbl=P.table(spec), w=where.sql, o=P.key_order(spec)
        ),
        [*where.params, chunk_size - 1],
    )


def ensure_cursors(run: Run, spec: PolicySpec) -> None:
    """Create the cursors of the run's current pass (once; serialized by an advisory lock)."""
    with transaction.atomic(), timeouts.bounded(timeouts.engine_statement_ms()):
        locks.xact_lock(locks.PLANNER, run.id)
        if PlannerCursor.objects.filter(run=run, pass_no=run.pass_no).exists():
            return
        lo, hi = _fetchone(bounds_query(run.policy_id, run.cutoff, spec, discarded_scopes(run)))
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


def step(run: Run, spec: PolicySpec, chunk_size: int) -> bool | None:
    """Plan one chunk for the least-planned free cursor. None: no cursor left to work on.
    Its statements are bounded (a slow or locked target fails them as a transient error)."""
    with transaction.atomic(), timeouts.bounded(timeouts.engine_statement_ms()):
        cursor = (
            PlannerCursor.objects.select_for_update(skip_locked=True)
            .filter(run=run, pass_no=run.pass_no, exhausted=False)
            .order_by("chunks_planned", "id")
            .first()
        )
        if cursor is None:
            return None
        try:
            made = _plan_chunk(run, spec, cursor, chunk_size)
        except DatabaseError as exc:
            _context(
                exc,
                stage="planning a chunk",
                tenant=cursor.tenant,
                next_key=show_bound(cursor.position()),
            )
            raise
        cursor.save(update_fields=["next_at", "exhausted", "chunks_planned"])
        return made


def _plan_chunk(run: Run, spec: PolicySpec, cursor: PlannerCursor, chunk_size: int) -> bool:
    """The next chunk of ``cursor``: up to ``chunk_size`` eligible keys from its position,
    or the rest of its walk (then the cursor is exhausted). Advances the cursor in memory.

    A chunk is ``[position, next chunk's first key)``; for a plain integer key ``[position,
    last key + 1)``, as bigints too. The last chunk of a walk runs to the end of the keys
    (an integer key's: to its last key + 1)."""
    types = P.column_types(spec)
    integer = P.integer_key(spec, types)
    tenant = cursor.tenant if run.per_tenant(spec) else None
    position, last_key = cursor.position(), cursor.last()
    scope = P.in_scope(spec, tenant=tenant, key_from=position, types=types)
    upto = P.key_compare(spec, "<=", last_key, types)  # the run's last eligible key
    where = P.Fragment.join(
        [scope, upto, _planning_filter(run, spec, discarded_scopes(run))], " AND "
    )
    rows = _fetchall(step_query(spec, where, chunk_size))
    if len(rows) == 2:
        last, planned, following = tuple(rows[0]), chunk_size, tuple(rows[1])
    elif len(rows) == 1:
        last, planned, following = tuple(rows[0]), chunk_size, None
        cursor.exhausted = True
    else:
        (planned,) = _fetchone(
            P.Fragment(
                sql.SQL("SELECT count(*) FROM {tbl} WHERE {w}").format(
                    tbl=P.table(spec), w=where.sql
                ),
                where.params,
            )
        )
        last = following = None
        cursor.exhausted = True
        if planned and integer:
            (top,) = _fetchone(
                P.Fragment(
                    sql.SQL("SELECT max({k}) FROM {tbl} WHERE {w}").format(
                        k=P.key_expr(spec), tbl=P.table(spec), w=where.sql
                    ),
                    where.params,
                )
            )
            last = (str(top),)
    if planned <= 0:
        return False
    if integer:
        key_to = exclusive_end(int(last[0]))
        hi = None if key_to is None else (str(key_to),)
        if key_to is None:  # the top of the key range: nothing can follow this chunk
            cursor.exhausted = True
    else:
        hi = following
        if hi is not None and not _after(spec, hi, position, types):
            # one key on more rows than a chunk: [position, following) would be empty and
            # the cursor would not move; the chunk takes every row of that key
            hi = _first_after(spec, where, position, types)
            cursor.exhausted = cursor.exhausted or hi is None
    made = False
    try:
        with transaction.atomic():
            Chunk.objects.create(
                run=run,
                pass_no=run.pass_no,
                tenant=cursor.tenant,
                seq=cursor.chunks_planned,
                key_from=int(position[0]) if integer else None,
                key_to=int(hi[0]) if integer and hi is not None else None,
                lo=list(position),
                hi=None if hi is None else list(hi),
                planned_rows=planned,
            )
        made = True
    except IntegrityError:
        pass  # the same chunk exists already: a step that crashed after insert is replayed
    cursor.chunks_planned += 1
    if hi is not None:
        cursor.next_at = list(hi)
    return made


def _after(spec: PolicySpec, a, b, types) -> bool:
    """Whether key value ``a`` sorts after ``b`` (in the key's types and collations)."""
    x, y = P.key_value(spec, a, types), P.key_value(spec, b, types)
    query = P.Fragment(sql.SQL("SELECT {} > {}").format(x.sql, y.sql), [*x.params, *y.params])
    return bool(_fetchone(query)[0])


def _first_after(spec: PolicySpec, where: P.Fragment, position, types):
    """The first eligible key after ``position`` (None: there is none)."""
    ahead = P.key_compare(spec, ">", position, types)
    rows = _fetchall(
        P.Fragment(
            sql.SQL("SELECT {k} FROM {tbl} WHERE {w} AND {a} ORDER BY {o} LIMIT 1").format(
                k=P.key_texts(spec), tbl=P.table(spec), w=where.sql, a=ahead.sql,
                o=P.key_order(spec),
            ),
            [*where.params, *ahead.params],
        )
    )  # fmt: skip
    return tuple(rows[0]) if rows else None


def plan(run: Run, *, window: int | None = None, deadline: float | None = None) -> int:
    """Top the run's pending chunks up to ``window`` (no step starts after ``deadline``, a
    ``time.monotonic()`` value); mark the planner done when every cursor of the pass is
    exhausted. Returns the number of chunks created."""
    if run.planner_done:
        return 0
    spec = run.policy_version.parsed
    window = window or settings.RETENTION["PLANNER_WINDOW"]
    chunk_size = run.chunk_size or spec.chunk_size
    try:
        ensure_cursors(run, spec)
    except DatabaseError as exc:
        _context(exc, stage="finding the first and last eligible keys and the tenants")
        raise
    created = 0
    pending = Chunk.objects.pending().filter(run=run).count()
    while pending < window and (deadline is None or time.monotonic() < deadline):
        with P.cached_types(("run", run.pk, run.policy_version_id)):
            made = step(run, spec, chunk_size)
        if made is None:
            break
        if made:
            created += 1
            pending += 1
    if not PlannerCursor.objects.filter(run=run, pass_no=run.pass_no, exhausted=False).exists():
        Run.objects.filter(pk=run.pk, pass_no=run.pass_no).update(planner_done=True)
        run.planner_done = True
    return created
