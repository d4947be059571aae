"""The reconciler: every minute, each policy in its own transaction (one advisory lock each).

It re-publishes lost or stale leases, starts runs that waited for an earlier
one, creates one catch-up run for missed schedule windows, finishes runs
(verification before ``drained``; then the dead tuples the run left and the policy's
``vacuum``, ``runs.engine.maintenance``), drops detached partition tables whose
``detached_keep`` has passed, and keeps the app's own tables bounded.

A pass works on the database in place: the control database, or a target's ledger inside
``targets.connections.on`` (``runs.fleet.reconcile`` runs one pass per target). On a target
it does all of the above for that target's runs; the policies' schedules and the archive's
orphan files are the control database's pass's alone.
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from psycopg import sql

from archive import objects
from core import locks, timeouts
from retention import cascades, decisions, introspect
from retention import predicate as P
from retention.models import KillSwitch, LegalHold, Policy, PolicyVersion
from retention.schedule_math import latest_tick, ticks_before
from retention.spec import SpecError
from runs import archive_expiry
from runs.actions import (
    conclude_count,
    conclude_pass,
    expire_confirm_holds,
    run_key_for,
    start_waiting_runs,
    supersede_open_runs,
    trigger_run,
)
from runs.engine import dispatch, stopping
from runs.engine.maintenance import reclaim_vacuums, record_after_run
from runs.engine.partitions import drop_kept_detached, settle_left_behind
from runs.engine.planner import timestamp_indexed
from runs.engine.schedules import sync_policy_schedule
from runs.evidence import archives, audit
from runs.models import (
    AuditRecord,
    Chunk,
    DeadLetter,
    GuardControlStep,
    GuardSample,
    PartitionAction,
    PlannerCursor,
    Run,
    discarded_letters,
    discarded_scopes,
    show_bound,
)
from targets import connections as C

log = logging.getLogger(__name__)

CATCH_UP_GRACE = timedelta(minutes=2)  # a tick is "missed" this long after it was due
MAX_SKIPPED_RECORDED = 500
TIMED_OUT = ("57014", "55P03")  # statement timeout / lock timeout: try again later


def _count(frag: P.Fragment) -> int:
    with connection.cursor() as cur:
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        return cur.fetchone()[0]


def verify(run: Run, *, limit: int = 100_000) -> dict:
    """Eligible rows still present under the run's cutoff (kept and held rows, and the run's
    discarded scopes, excluded: the same predicate its later passes plan and delete by), rows
    deferred by legal holds, rows never eligible because a planned column is NULL, each count
    stopping at ``limit``, and the rows left in each discarded scope. ``holds``: the ids of
    the legal holds in force for that statement (what a drained run's leftover rows are judged
    by after a hold's release: ``runs.evidence.invariants``).

    Where the pass's chunks tell what the run cannot have missed (``missed_ranges``), only the
    rest is read: the keys below the pass's first chunk and from its last chunk on (that chunk
    again, and everything above it: what an estimated last key left out). Elsewhere, one
    statement and one scan of the whole old range (``predicate.verification_counts``).
    ``read``: which of the two it was."""
    spec = run.policy_version.parsed
    types = P.column_types(spec)
    graph, cascade = cascades.for_run(
        spec, policy_id=run.policy_id, cutoff=run.bound, tick=run.tick
    )
    hidden = introspect.hidden_tables(graph)
    if hidden:  # this login cannot see every row: it cannot say none is left
        raise SpecError(f"cannot verify: {hidden[0]}")
    # a BEFORE DELETE trigger may have skipped rows inside the chunks' ranges: a chunk done
    # does not prove its range empty, so the whole old range is read
    triggers = introspect.before_delete_triggers(graph.names)
    selfs = cascades.self_blocking_keys(spec)
    referenced = cascades.deferred_references(spec)
    if selfs or referenced:
        # rows a row that stays references through the table's own blocking keys are kept
        # (the chunks spared them): counted apart, the whole old range read
        outside = discarded_scopes(run)

        def rows_of(alias: str) -> P.Fragment:
            with P.aliased(alias):
                return P.eligible(
                    spec, policy_id=run.policy_id, cutoff=run.bound, outside=outside, types=types
                )

        kept = [cascades.kept_referenced(referenced)] if referenced else []
        if selfs:
            kept.append(cascades.spare_referenced(spec, selfs, rows_of))
        guard = P.Fragment.join(([cascade] if cascade is not None else []) + kept, " AND ")
        result = _verify(run, spec, types, guard, limit=limit, trust_chunks=False)
        if cascade is None:
            result["kept_referenced"] = result.pop("deferred_by_cascades", 0)
        if result.get("kept_referenced") or (
            cascade is not None and result.get("deferred_by_cascades")
        ):
            # why: per key, the rows that stay and reference them, one of them named
            causes = cascades.referencing_causes(spec, referenced, selfs, rows_of, limit=limit)
            result["kept_referenced_by"] = [c.to_json() for c in causes]
    else:
        result = _verify(run, spec, types, cascade, limit=limit, trust_chunks=not triggers)
    if triggers:  # rows such a trigger skipped are still here, counted in ``remaining``
        result["before_delete_triggers"] = [f"{t} on {name}" for name, t in triggers]
        # what the pass's DELETEs matched and the trigger kept, from their audit records
        result["kept_by_triggers"] = audit.rows_kept_by_triggers(run.pk, run.pass_no) or 0
    return result


def _verify(run: Run, spec, types: dict, cascade, *, limit: int, trust_chunks: bool) -> dict:
    outside = discarded_scopes(run)
    ranges = missed_ranges(run, spec, types=types, cascade=cascade) if trust_chunks else None
    if ranges is not None:
        first, last = ranges
        early = early_read(run, spec)
        frag = missed_count(
            run, spec, first, last, outside=outside, limit=limit, types=types, early=early
        )
        with transaction.atomic(), bitmap_scan(spec), connection.cursor() as cur:
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            below, above = cur.fetchone()
        read = (
            f"outside the pass's chunks: below {show_bound(first)}, from {show_bound(last)} on;"
            f" rows older than the cutoff {shown_cutoff(run)}"
        )
        if early is not None:
            read = (
                f"outside the pass's chunks: below {show_bound(first)}, from {show_bound(last)}"
                f" to {show_bound(tuple(early['last']))}, from {show_bound(tuple(early['top']))}"
                f" on, and the {len(early['found'])} eligible key(s) between them that a read"
                f" at {early['at']} found; rows older than the cutoff {shown_cutoff(run)}"
            )
        return {
            "remaining": min(below + above, limit),
            # where a later pass plans (``planner.next_pass_range``)
            "missed": {
                "below": list(first),
                "from": list(last),
                "rows_below": below,
                "rows_from": above,
            },  # fmt: skip
            "deferred_by_holds": 0,
            "holds": [],
            "discarded": discarded_report(run, spec, types=types),
            "not_eligible_null": 0,
            "limit": limit,
            "read": read,
            **({"read_above": early} if early is not None else {}),
            "checked_at": timezone.now().isoformat(),
            "pass": run.pass_no,
        }
    counts = P.verification_counts(
        spec,
        policy_id=run.policy_id,
        cutoff=run.bound,
        outside=outside,
        limit=limit,
        types=types,
        cascade=cascade,
    )
    with transaction.atomic(), bitmap_scan(spec), connection.cursor() as cur:
        cur.execute(counts.sql.as_string(cur.connection), counts.params)
        remaining, deferred, nulls, hold_ids, blocked = cur.fetchone()
    found = {"deferred_by_cascades": blocked} if cascade is not None else {}
    return {
        "remaining": remaining,
        "deferred_by_holds": deferred,
        **found,
        "holds": list(hold_ids or []),
        "discarded": discarded_report(run, spec, types=types),
        "not_eligible_null": nulls,
        "limit": limit,
        "read": f"the whole range older than the cutoff {shown_cutoff(run)}",
        "checked_at": timezone.now().isoformat(),
        "pass": run.pass_no,
    }


def shown_cutoff(run: Run) -> str:
    """The bound a run's verification compares rows with (its cutoff, a slice run's slice
    bound), as its text says it."""
    return f"{run.bound.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def missed_ranges(run: Run, spec, *, types: dict, cascade=None) -> tuple | None:
    """Where the run's current pass may have left eligible rows, when its chunks tell:
    ``(first, last)`` — the keys (on the run's chunk columns) below ``first``, the pass's first
    chunk's lower bound, and from ``last``, its last chunk's lower bound, on. None: the whole
    old range must be read.

    A pass's chunks are contiguous key ranges from its first eligible key to its last one
    (``runs.engine.planner``); each done chunk's DELETE removed every row of its range that was
    eligible in its snapshot. What can still be eligible is outside them: above an estimated
    last key (``planner.bounds_query``), or written below the first key since; and the last
    chunk is read again, the range a row written meanwhile most likely lands in. That holds
    when nothing else can leave an eligible row inside a done chunk, so None when:

    - chunks are per tenant (one walk per tenant: their union is not one range);
    - a chunk of the pass is not done (dead-lettered, cancelled: their rows are counted);
    - a legal hold applied to the policy at any time since the run was created (a row it
      deferred becomes eligible again on its release, and the figures name the holds) — or
      was released so shortly before that a worker's list of releases may still have held it
      in force, or by a row no signature vouches for;
    - a planned column can be NULL (those rows are counted and reported), or the table's
      cascades are guarded (rows the guard defers are counted);
    - the run has handled partitions (``runs.engine.partitions``)."""
    if not _chunks_can_tell(run, spec, types=types, cascade=cascade):
        return None
    chunks = Chunk.objects.filter(run=run, pass_no=run.pass_no)
    if chunks.exclude(state__in=(Chunk.State.DONE, Chunk.State.SPLIT)).exists():
        return None
    # a split chunk keeps its row (and its whole range) beside its halves: first by id
    first = chunks.filter(tenant="").order_by("seq", "id").first()
    last = chunks.filter(tenant="").order_by("-seq", "id").first()
    if first is None or chunks.exclude(tenant="").exists():
        return None
    return first.bounds()[0], last.bounds()[0]


def _chunks_can_tell(run: Run, spec, *, types: dict, cascade) -> bool:
    """The conditions of ``missed_ranges`` that do not depend on the pass's chunks' states."""
    if cascade is not None or run.per_tenant(spec):
        return False
    known_not_null = {name for name, t in types.items() if t.not_null}
    if any(c not in known_not_null for c in P.required_columns(spec)):
        return False
    # a hold the run's chunks may have honoured: in force, released since the run was made or
    # in the window before it a worker's list of verified releases may lag by
    # (``decisions.RELEASES_TTL_S``), or released by a row no signature vouches for
    lagging = run.created_at - timedelta(seconds=decisions.RELEASES_TTL_S)
    holds = LegalHold.objects.filter(Q(policy__isnull=True) | Q(policy_id=run.policy_id)).filter(
        Q(released_at__isnull=True)
        | Q(released_at__gte=lagging)
        | ~Q(pk__in=decisions.verified_release_ids())
    )
    return not (holds.exists() or PartitionAction.objects.filter(run=run).exists())


FOUND_MAX = 100  # eligible keys above the last key an early read names; more: the finish reads all


def reads_above_early(run: Run, spec) -> bool:
    """Whether the run's verification reads what lies above the walk's last key early
    (``read_above``): its chunks are key ranges across tenants on the key itself. Not for
    chunks in timestamp order: there the rows above the last chunk that can be eligible are
    a short range of the timestamp's own index, read at the finish as before."""
    if run.per_tenant(spec):
        return False
    return P.chunk_columns(spec, run.bound_columns(spec))[0] != spec.timestamp


def read_above(run: Run) -> dict | None:
    """The verification's read above the pass's last key, taken once and early — beside the
    pass's chunks: ``runs.engine.worker.drain`` starts it once the pass's bounds are known —
    so that the finish does not read it after them.

    The run's cutoff never changes, so a row that is not eligible when read (young, kept)
    becomes eligible only by a write: an INSERT, or an UPDATE of its timestamp, a kept column
    or its key. This read records ``top``, the highest key in the table, and then, in a
    statement that starts after that one, the eligible rows' keys above ``last``, the walk's
    last key (``found``: at most ``FOUND_MAX``, else None): every row with a key up to ``top``
    that existed then was judged. The finish reads only the last chunk's range up to
    ``last``, the keys from ``top`` on (rows written since: a key in time order puts new rows
    there) and the ``found`` keys again (``missed_count``). Not looked for: a row that a write
    after this read made eligible with a key between ``last`` and ``top`` — as a row made
    eligible inside a done chunk's range after its DELETE is not.

    One session takes it: it holds the pass's read-above lock while it reads (a finisher that
    finds it held waits for it, ``early_read``), not the cursor's row, which the planner's steps
    lock — a read of the old range at 10M rows takes half a second, and the planner would
    find the cursor taken and every worker wait for it. None: it does not apply (``reads_above_early``,
    the conditions of ``missed_ranges`` that do not depend on the chunks), the pass has no
    bounds yet (or nothing to plan), or another session took it."""
    spec = run.policy_version.parsed
    if not reads_above_early(run, spec):
        return None
    types = P.column_types(spec)
    _graph, cascade = cascades.for_run(
        spec, policy_id=run.policy_id, cutoff=run.bound, tick=run.tick
    )
    if not _chunks_can_tell(run, spec, types=types, cascade=cascade):
        return None
    with (
        transaction.atomic(),
        timeouts.bounded(timeouts.engine_statement_ms(), timeouts.target_lock_ms(spec)),
    ):
        # one reader: the lock, then the look (a reader that committed before has left none)
        if not locks.try_xact_lock(locks.READ_ABOVE, run.pk):
            return None
        unread = PlannerCursor.objects.filter(
            run=run, pass_no=run.pass_no, tenant="", read_above__isnull=True
        )
        cursor = unread.first()
        if cursor is None or cursor.last() is None:
            return None
        last = cursor.last()
        top_query, found_query = above_queries(run, spec, last, types=types)
        # the highest key first, then the rows above ``last``: a row committed between the two
        # statements is seen by the second
        top = _fetch(top_query)
        if top is None:
            return None
        with bitmap_scan(spec):
            found = _fetch(found_query)
        record = {
            "last": list(last),
            "top": list(top),
            "found": [list(k) for k in found] if len(found) <= FOUND_MAX else None,
            "at": timezone.now().isoformat(),
        }
        # the cursor's row only now: a planner step holding it is a short wait
        unread.filter(pk=cursor.pk).update(read_above=record)
    return record


def above_queries(run: Run, spec, last, *, types: dict) -> tuple[P.Fragment, P.Fragment]:
    """``read_above``'s two statements: the highest key in the table (one probe of the key's
    index), and the keys of up to ``FOUND_MAX`` + 1 eligible rows above ``last`` (run under
    ``bitmap_scan``: on a key in time order, the old range by the timestamp's index)."""
    columns = run.bound_columns(spec)
    keys = P.key_texts(spec, columns=columns)
    top = sql.SQL("SELECT ARRAY[{k}] FROM {t} ORDER BY {o} LIMIT 1").format(
        k=keys, t=P.table(spec), o=P.key_order(spec, descending=True, columns=columns)
    )
    above = P.key_compare(spec, ">", last, types, columns=columns)
    # discarded scopes are not left out: the finish counts the keys found under the run's
    # scopes as they are then
    cond = P.eligible(spec, policy_id=run.policy_id, cutoff=run.bound, types=types)
    found = sql.SQL(
        "SELECT coalesce(array_agg(DISTINCT k), '{{}}') FROM (SELECT ARRAY[{k}] AS k"
        " FROM {t} WHERE {a} AND {c} LIMIT %s) AS s"
    ).format(k=keys, t=P.table(spec), a=above.sql, c=cond.sql)
    return P.Fragment(top, []), P.Fragment(found, [*above.params, *cond.params, FOUND_MAX + 1])


def _fetch(frag: P.Fragment):
    with connection.cursor() as cur:
        cur.execute(frag.sql.as_string(cur.connection), frag.params)
        row = cur.fetchone()
        return row[0] if row else None


def above_unread(run: Run) -> bool:
    """Whether the pass has bounds whose range above the last key nobody has read yet."""
    return PlannerCursor.objects.filter(
        run=run, pass_no=run.pass_no, tenant="", bound_at__isnull=False, read_above__isnull=True
    ).exists()


def early_read(run: Run, spec, *, wait_s: float | None = None) -> dict | None:
    """The pass's read above its last key (``read_above``), when it was taken and names what it
    found. While another session takes it (holds the read-above lock) wait for it — at most
    ``wait_s``, default the read's own statement bound — rather than read the same range beside
    it. None: the finish reads everything from the last chunk on."""
    if not reads_above_early(run, spec):
        return None
    mine = PlannerCursor.objects.filter(run=run, pass_no=run.pass_no, tenant="")

    def record():
        return mine.values_list("read_above", flat=True).first()

    def take() -> None:  # queues behind the early reader's lock, nothing else
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [locks.READ_ABOVE, run.pk])

    found = record()
    if found is None:
        seconds = timeouts.engine_statement_ms() / 1000 if wait_s is None else wait_s
        if not timeouts.wait_for_lock(seconds, take):
            return None
        found = record()
    if not found or found.get("found") is None:  # not taken, or it found too many to name
        return None
    return found


def missed_count(
    run: Run,
    spec,
    first,
    last,
    *,
    outside,
    limit: int,
    types: dict,
    early: dict | None = None,
) -> P.Fragment:
    """The eligible rows (holds applied, discarded scopes left out) with a key below ``first``,
    and those from ``last`` on (``missed_ranges``), each counted up to ``limit``, in two
    subqueries that PostgreSQL plans apart (run under ``bitmap_scan``, as the whole-range
    count). Each reads the smaller of two sets: the keys beyond that end of the pass's chunks (few, when the last
    eligible key is near the top of the key range: ages not in key order), or the rows older
    than the cutoff by the timestamp's index (a key in time order, where every young row lies
    above the last chunk: then it costs what the whole-range count did).

    With an ``early`` read above the walk's last key (``read_above``), the side from the last
    chunk on reads only the last chunk's range up to that key, the keys from the highest key
    the early read saw on, and the keys it found: a few ranges of the key's index."""
    columns = run.bound_columns(spec)
    cond = P.eligible(spec, policy_id=run.policy_id, cutoff=run.bound, outside=outside, types=types)
    below = P.key_compare(spec, "<", first, types, columns=columns)
    above = P.key_compare(spec, ">=", last, types, columns=columns)
    if early is not None:
        parts = [
            P.key_compare(spec, "<=", tuple(early["last"]), types, columns=columns),
            P.key_compare(spec, ">=", tuple(early["top"]), types, columns=columns),
            *(P.key_compare(spec, "=", tuple(k), types, columns=columns) for k in early["found"]),
        ]
        either = P.Fragment.join(parts, " OR ")
        above = P.Fragment(
            sql.SQL("{} AND ({})").format(above.sql, either.sql), above.params + either.params
        )
    part = sql.SQL("(SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {k} AND {c} LIMIT %s) AS s)")
    text = sql.SQL("SELECT {}, {}").format(
        part.format(t=P.table(spec), k=below.sql, c=cond.sql),
        part.format(t=P.table(spec), k=above.sql, c=cond.sql),
    )
    params = [*below.params, *cond.params, limit, *above.params, *cond.params, limit]
    return P.Fragment(text, params)


PLAN_METHODS = ("enable_indexscan", "enable_indexonlyscan", "enable_seqscan")


@contextmanager
def bitmap_scan(spec):
    """Within the block (inside a transaction), read the target by bitmap scans: when a btree
    index leads with the timestamp column, the verification reads the old range through it
    with a bitmap heap scan. After a run that range is mostly dead tuples, and the statistics
    (from before the deletes) cannot say so: an index scan visits every dead tuple from its
    index entry and, marking each entry dead, writes every index page in the range to the WAL
    again (a full-page image with data checksums); a bitmap heap scan visits each heap page
    once, in physical order. The previous settings are restored after the block (a failure
    rolls the caller's savepoint back, and the settings with it)."""
    indexed = timestamp_indexed(spec)
    if indexed:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT current_setting(%s), current_setting(%s), current_setting(%s)",
                list(PLAN_METHODS),
            )
            before = cur.fetchone()
            _set_local(cur, {name: "off" for name in PLAN_METHODS})
    yield
    if indexed:
        with connection.cursor() as cur:
            _set_local(cur, dict(zip(PLAN_METHODS, before, strict=True)))


def _set_local(cur, values: dict) -> None:
    cur.execute(
        "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(values)),
        [x for pair in values.items() for x in pair],
    )


def discarded_report(run: Run, spec, *, types: dict | None = None) -> list[dict]:
    """Eligible rows left in each of the run's discarded scopes (``models.discarded_letters``,
    at most ``MAX_DISCARDED_SCOPES``): an operator gave up on them, so verification does not
    count them as remaining; it reports them, by whom, why. One count per scope, each over
    the scope's tenant and key interval."""
    types = P.column_types(spec) if types is None else types
    out = []
    for letter in discarded_letters(run):
        chunk = letter.chunk
        lo, hi = chunk.bounds()
        scope = P.in_scope(
            spec,
            tenant=chunk.tenant if run.per_tenant(spec) else None,
            key_from=lo,
            key_to=hi,
            columns=run.bound_columns(spec),
            types=types,
        )
        cond = P.eligible(spec, policy_id=run.policy_id, cutoff=run.bound, types=types)
        where = P.Fragment(
            sql.SQL("{} AND {}").format(scope.sql, cond.sql), scope.params + cond.params
        )
        out.append(
            {
                "chunk": chunk.pk, "tenant": chunk.tenant, "key_from": chunk.key_from,
                "key_to": chunk.key_to, "interval": chunk.interval,
                "rows": _count(P.count_where(spec, where)),
                "by": letter.resolved_by, "why": letter.resolution_reason,
            }
        )  # fmt: skip
    return out


def finish_run(run: Run) -> str:
    """Close an active run whose planner is done and which has no pending chunk:
    verify, then drained / another pass / needs attention. Returns the new state.

    The session that locks the run's row concludes it, once; a caller that finds the row
    locked (another lease or the reconciler is verifying it, an operator's decision is
    committing) does not wait for it: it returns the run's state as last committed and moves
    on. Should the holder die before it commits, the run is still active with its planner
    done and nothing pending, and the reconciler's next pass finishes it."""
    with transaction.atomic():
        locked = (
            # NO KEY UPDATE: rows that only reference the run (audit records, leases) do not
            # count as holding it
            Run.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
            .select_related("policy_version")
            .filter(pk=run.pk)
            .first()
        )
        if locked is None:
            return Run.objects.filter(pk=run.pk).values_list("state", flat=True).first() or ""
        run = locked
        # never contended between finishers (the row lock above chooses one): it lets an idle
        # drain wait for this transaction instead of polling the run (``runs.cli``)
        locks.xact_lock(locks.FINISHER, run.pk)
        if run.state != Run.State.ACTIVE or not run.planner_done:
            return run.state
        if Chunk.objects.pending().filter(run=run).exists():
            return run.state
        open_letters = DeadLetter.objects.filter(
            run=run, resolution=DeadLetter.Resolution.OPEN
        ).count()
        if run.counts_only:
            conclude_count(run, open_letters=open_letters, actor="reconciler")
            if run.state == Run.State.COUNTED:
                start_waiting_runs(run.policy)
            return run.state
        try:
            with (
                transaction.atomic(),
                timeouts.bounded(
                    timeouts.engine_statement_ms(),
                    timeouts.target_lock_ms(run.policy_version.parsed),
                ),
            ):
                result = verify(run)
        except SpecError as exc:  # the table's cascades changed into ones no guard can follow
            result = {"error": str(exc), "checked_at": timezone.now().isoformat(),
                      "pass": run.pass_no}  # fmt: skip
        except DatabaseError as exc:
            reason = _first_line(exc)
            sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
            if sqlstate in TIMED_OUT:
                # a slow or locked target: the run stays active and is verified again next pass
                run.state_reason = f"verification postponed ({reason}); tried again next pass"
                run.save(update_fields=["state_reason"])
                return run.state
            result = {
                "error": reason,
                "checked_at": timezone.now().isoformat(),
                "pass": run.pass_no,
            }
        conclude_pass(run, result, open_letters=open_letters, actor="reconciler")
        if run.state == Run.State.ACTIVE:
            dispatch.republish_all(run)
        elif run.state == Run.State.DRAINED:
            record_after_run(run)  # dead tuples; VACUUM recommended or sent after the commit
            start_waiting_runs(run.policy)
        return run.state


def catch_up(policy: Policy, now, *, version: PolicyVersion | None = None) -> Run | None:
    """One run for the newest missed tick of the policy, the older missed ticks recorded on it.
    ``version``: the policy's approved version as the caller read it (read here when not given)."""
    version = version or policy.approved_version
    if version is None or not policy.enabled:
        return None
    spec = version.parsed
    if spec.catch_up == "none":
        return None
    newest = latest_tick(policy, now - CATCH_UP_GRACE)
    if Run.objects.filter(run_key=run_key_for(policy, newest)).exists():
        return None  # it ran (the common case: no need to read when the policy was approved)
    # never catch up ticks from before the policy's first approval (a later version's
    # approval does not forgive a tick missed under the earlier one)
    first = (
        policy.versions.filter(state__in=("approved", "superseded"), decided_at__isnull=False)
        .order_by("decided_at")
        .values_list("decided_at", flat=True)
        .first()
    )
    since = first or version.decided_at or version.created_at
    if newest <= since:
        return None
    # the newest run before it: a later tick that already ran (fired on time after an outage
    # whose own ticks were lost) must not hide the missed ones from the record
    last = (
        Run.objects.filter(policy=policy, tick__lt=newest)
        .order_by("-tick")
        .values_list("tick", flat=True)
        .first()
    )
    start = max(filter(None, [last, since]))
    skipped = _ticks_before(policy, newest, after=start, limit=MAX_SKIPPED_RECORDED)
    run, _ = trigger_run(
        policy, tick=newest, source="catch-up", actor="reconciler",
        skipped_ticks=[t.isoformat() for t in skipped],
    )  # fmt: skip
    return run


def rerun_superseded(policy: Policy, *, version: PolicyVersion | None = None) -> Run | None:
    """The policy's newest period, when a newly approved version superseded its run, runs
    again under that version (``trigger_run`` makes the re-run, keyed ``<period>/v<number>``,
    with the superseded run's source and skipped ticks): the period does not wait for the
    next tick. An older superseded period is covered by the newest one's cutoff. ``version``: as
    for ``catch_up``."""
    version = version or policy.approved_version
    if version is None or not policy.enabled:
        return None
    newest = Run.objects.filter(policy=policy).order_by("-tick", "-id").first()
    if (
        newest is None
        or newest.state != Run.State.SUPERSEDED
        or newest.policy_version_id == version.pk
    ):
        return None
    run, created = trigger_run(
        policy, tick=newest.tick, source=newest.source, actor="reconciler",
        skipped_ticks=newest.skipped_ticks,
    )  # fmt: skip
    return run if created else None


def _ticks_before(policy: Policy, newest, *, after, limit: int) -> list:
    """The ticks in (after, newest), oldest first — the newest ``limit`` of them when there are
    more (after a long outage the recent ones are the ones worth recording)."""
    return ticks_before(policy, newest, after=after, limit=limit)[::-1]


def prune_own_tables(now) -> dict:
    """Keep the app's own bulky tables bounded, a batch per pass: guard samples and the guard
    controller's steps after a day
    (django-q2's results live in the cluster cache and expire there). Audit rows and the
    operator log are evidence and are never pruned here."""
    out = {}
    for model, field, age in (
        (GuardSample, "taken_at", timedelta(days=1)),
        (GuardControlStep, "taken_at", timedelta(days=1)),
    ):
        ids = list(
            model.objects.filter(**{f"{field}__lt": now - age}).values_list("id", flat=True)[:5000]
        )
        out[model.__name__] = model.objects.filter(id__in=ids).delete()[0] if ids else 0
    return out


def _policies_to_reconcile() -> list[Policy]:
    """Every enabled policy, and every other policy that still has an open run; in a fresh
    random order each pass, so a policy that uses up the pass's time never starves the same
    others twice. On a target, of the enabled policies only those that name it (the control
    database's pass arms every policy's schedule)."""
    has_open = Run.objects.filter(policy=OuterRef("pk"), state__in=Run.OPEN)
    policies = list(Policy.objects.filter(Q(enabled=True) | Exists(has_open)))
    if C.current() != C.DEFAULT:
        open_here = set(Run.objects.filter(state__in=Run.OPEN).values_list("policy_id", flat=True))
        policies = [p for p in policies if p.pk in open_here or runs_here(p)]
    random.shuffle(policies)
    return policies


def runs_here(policy: Policy, *, version: PolicyVersion | None = None) -> bool:
    """Whether the policy's periods run in the database in place (it is one of the policy's
    targets): only there does a pass make its catch-up run or re-run a superseded period.
    ``version``: as for ``catch_up``."""
    return C.current() in C.targets_of(policy, version=version)


@dataclass
class PassBudget:
    """The time a pass may still spend, and whether the worker is stopping. A step that reads a
    policy's table (a geometry sample, an admission count, a verification, a detached
    partition's census) starts only while one bounded statement still fits and no stop was
    requested: the pass never outlives its budget by more than one statement, and a stopping
    worker ends it at the next step instead of after every policy."""

    deadline: float
    statement_s: float

    def stopping(self) -> bool:
        return stopping.requested()

    def fits(self) -> bool:
        return not self.stopping() and time.monotonic() + self.statement_s <= self.deadline


class _Deferred(Exception):
    """The rest of a policy's steps wait for the next pass (time spent, or a stop requested)."""


def reconcile_policy(
    policy: Policy, now, report: dict, *, kill: bool, stale_s: float, budget: PassBudget
) -> None:
    """Everything one pass does for one policy (inside that policy's own transaction): repair
    its schedule, catch up a missed tick or run a superseded period again, start a waiting
    run, finish or re-publish active runs, look after drained runs' VACUUM, drop detached
    partitions past their keep. Before each step that reads the policy's table it checks the
    pass's budget (``_Deferred``: the steps done so far commit, the rest wait)."""

    def step() -> None:
        if not budget.fits():
            raise _Deferred

    on_control = C.current() == C.DEFAULT
    # read once for the policy's steps (under its lock, in its transaction); a run's trigger
    # (``trigger_run``) still reads its own
    version = policy.approved_version
    if on_control and policy.enabled and sync_policy_schedule(policy, now=now, version=version):
        report["rearmed"].append(policy.slug)
    expiry_s = settings.RETENTION.get("CONFIRM_EXPIRY_S", 86_400)
    for expired in expire_confirm_holds(policy, now, expiry_s=expiry_s):
        report["expired"].append(expired.run_key)
    if not on_control and policy.enabled:
        # a version approved on the control database ended that database's open runs of older
        # versions in its own transaction; here the mirror now says so, and the pass ends them
        if version is not None:
            for ended in supersede_open_runs(
                policy, keep_version_id=version.pk, actor="reconciler",
                reason=f"v{version.number} was approved; runs of older versions can never run again",
            ):  # fmt: skip
                report["superseded"].append(ended.run_key)
    caught_up = rerun = None
    if policy.enabled and runs_here(policy, version=version):
        # no savepoint of their own: an error in either ends the policy's whole transaction
        step()
        caught_up = catch_up(policy, now, version=version)
        if caught_up is not None:
            report["caught_up"].append(caught_up.run_key)
        else:
            step()
            rerun = rerun_superseded(policy, version=version)
            if rerun is not None:
                report["rerun"].append(rerun.run_key)
    if caught_up is None and rerun is None:  # a new run has just been through admission
        step()
        start_waiting_runs(policy)
    for run in Run.objects.filter(policy=policy, state=Run.State.ACTIVE).select_related(
        "policy", "policy_version"
    ):
        if run.planner_done and not Chunk.objects.pending().filter(run=run).exists():
            step()
            report["finished"].append((run.run_key, finish_run(run)))
            continue
        if kill or run.policy.paused:
            continue
        report["republished"] += dispatch.ensure_leases(run, stale_after_s=stale_s)
    # a drained run's VACUUM that waits on a task: sent again, or why it never ran
    report["vacuum"] += reclaim_vacuums(policy, now)
    # partitions no run is finishing: put back, or surfaced (docs/engine.md, "Partitions")
    step()
    report["partitions"] += settle_left_behind(policy, version=version)
    if not kill and not policy.paused:
        # detached partition tables whose detached_keep has passed (docs/engine.md, "Partitions")
        step()
        report["detached"] += drop_kept_detached(policy, now)
    # archive objects of attempts that did not commit (docs/engine.md, "Archiving"): each
    # database's pass judges its own (their names carry the target's)
    report["archive_orphans"] += remove_archive_orphans(policy, version=version)
    if not kill and not policy.paused:
        # archive objects past the approved version's [archive] keep_years, each named in an
        # audit record before its file goes (docs/policies.md, "Archiving before deleting")
        step()
        report["archive_expired"] += archive_expiry.expire_archives(policy, now, version=version)


def remove_archive_orphans(policy: Policy, *, version: PolicyVersion | None = None) -> list[str]:
    """Remove the archive objects under the approved version's ``[archive] to`` that no audit
    record names and whose chunk is no longer pending: files of attempts that were killed or
    failed between their write and their commit (a chunk still pending may be being written
    by its attempt, so its files wait); and files an expiry record names (``[archive]
    keep_years``) that a pass stopped before removing. The names removed. ``version``: as for
    ``catch_up``."""
    version = version or policy.approved_version
    spec = version.parsed if version is not None else None
    if spec is None or not spec.archive_dir:
        return []
    named: set[str] = set()
    states: dict[int, str] = {}
    expired: set[str] | None = None

    def keep(run_id: int, chunk_id: int, name: str) -> bool:
        nonlocal expired
        if expired is None:  # named by an expiry record whose pass stopped before the file went
            expired = archives.expired_names()
        if name in expired:
            return False
        if chunk_id not in states:
            row = Chunk.objects.filter(pk=chunk_id, run_id=run_id, run__policy=policy)
            states[chunk_id] = row.values_list("state", flat=True).first() or ""
            archive = (
                AuditRecord.objects.filter(chunk_id=chunk_id)
                .values_list("archive", flat=True)
                .first()
            )
            named.update(o["name"] for o in (archive or {}).get("objects", []))
        state = states[chunk_id]
        # not this database's chunk (another installation's files): left alone
        return name in named or state in ("", Chunk.State.PENDING)

    return objects.remove_orphans(
        spec.archive_dir, objects.policy_prefix(spec.slug, C.current()), keep
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def pass_budget() -> PassBudget:
    """A whole pass's budget: half the task timeout (``timeouts.reconciler_budget``)."""
    pass_s, statement_ms = timeouts.reconciler_budget()
    return PassBudget(time.monotonic() + pass_s, statement_ms / 1000)


def reconcile(now=None, *, budget: PassBudget | None = None, kill: bool | None = None) -> dict:
    """One reconciler pass over the database in place; returns what it did. ``budget``: the
    time left of a pass that goes on to other databases (``runs.fleet.reconcile``); ``kill``:
    the kill switch as the control database says it (default: read here).

    Each policy is reconciled in its own transaction under its own advisory lock (a policy
    another pass is still working on is skipped), with every statement bounded by a timeout
    well inside django-q2's task timeout and every wait for a lock on a policy's table by the
    policy's lock timeout: one policy's failure, lock queue or slow table never rolls back or
    holds up another's. A step that reads a table starts only while one statement still fits
    the pass's budget (``PassBudget``); what is left when the time is spent waits for the next
    pass (``deferred``). A stop requested of the worker ends the pass at its next step
    (``stopped``): the steps done commit, the rest wait."""
    now = now or timezone.now()
    report = {
        "republished": 0, "caught_up": [], "finished": [], "started": 0, "rearmed": [],
        "expired": [], "failed": [], "busy": [], "deferred": [], "pruned": {}, "detached": [],
        "vacuum": [], "rerun": [], "superseded": [], "partitions": [], "archive_orphans": [],
        "archive_expired": [],
        "stopped": False,
    }  # fmt: skip
    statement_ms = timeouts.reconciler_budget()[1]
    budget = budget or pass_budget()
    kill = KillSwitch.is_on() if kill is None else kill
    stale_s = settings.RETENTION["LEASE_STALE_S"] or settings.RETENTION["LEASE_BUDGET_S"] * 3 + 30
    for policy in _policies_to_reconcile():
        if budget.stopping():
            report["stopped"] = True
            break
        if not budget.fits():
            report["deferred"].append(policy.slug)
            continue
        try:
            with transaction.atomic():
                timeouts.set_local(statement_ms, timeouts.reconciler_lock_ms())
                if not locks.try_xact_lock(locks.RECONCILER, policy.pk):
                    report["busy"].append(policy.slug)
                    continue
                try:
                    reconcile_policy(policy, now, report, kill=kill, stale_s=stale_s, budget=budget)
                except _Deferred:
                    report["deferred"].append(policy.slug)
        except Exception as exc:  # one bad policy must not block the others
            log.exception("reconciling policy %s failed", policy.slug)
            report["failed"].append((policy.slug, _first_line(exc)))
    if budget.stopping():
        report["stopped"] = True
        return report
    try:
        with transaction.atomic():
            timeouts.set_local(statement_ms, timeouts.reconciler_lock_ms())
            if locks.try_xact_lock(locks.RECONCILER, 0):
                report["pruned"] = prune_own_tables(now)
    except Exception as exc:
        log.exception("pruning the app's own tables failed")
        report["failed"].append(("prune", _first_line(exc)))
    return report
