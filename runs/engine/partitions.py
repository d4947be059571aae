"""Partition-aware runs: a partition wholly past the cutoff, with nothing in it kept or held,
is detached and dropped (or left detached) instead of deleted row by row; everything else is
left to the planner's chunks over the parent. docs/engine.md, "Partitions".

Ordering against decisions is the chunk's: the global fence and the policy's fence are taken
shared before anything is read, and held until the drop (or the detach) has committed, so a
legal hold that commits first is seen, and one placed later waits for the drop. No held row is
ever dropped: the drop transaction checks every row of the detached table again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from psycopg import sql

from core import locks, timeouts
from core.oplog import record_action
from database.grants import partition_function
from retention import decisions
from retention import partitions as RP
from retention.models import PolicyVersion
from retention.spec import SpecError
from runs import actions
from runs.engine import guard, planner
from runs.engine.errors import PERMANENT, backoff, classify, connection_lost, dead_letter
from runs.evidence import audit
from runs.models import Chunk, DeadLetter, PartitionAction, PlannerCursor, Run, discarded_scopes

log = logging.getLogger(__name__)

HOST = socket.gethostname()
PARTITIONS = 0x52520040  # one lease settles a run's partitions at a time (run id)

SETTLED = "settled"
# throttled or busy: the planner must not start yet; "postponed: <why>" when the run should
# say why (``worker.note_idle``)
POSTPONED = "postponed"
REFUSED = "refused: "  # + why the run may not act now (kill switch, paused, cancelled, ...)


def _exec(query, params=()):
    with connection.cursor() as cur:
        cur.execute(
            query.as_string(cur.connection) if not isinstance(query, str) else query, params
        )
        return cur.fetchall() if cur.description else None


def statement_ms(spec) -> int:
    """Statement timeout of a partition's statements (its census, the detach, the drop
    transaction's census): the policy's, or half of what a chunk may take inside the task
    timeout when that is longer — a census reads the whole partition once."""
    return max(spec.statement_timeout_ms, timeouts.chunk_limit_ms() // 2)


OWNER, FUNCTION = "owner", "function"


def _ddl_mode(spec) -> str | None:
    """How this session may detach, attach and drop the table's partitions: ``owner`` — its
    role owns the table (or belongs to the role that does), so it runs the DDL itself;
    ``function`` — it may run the target owner's partition function (database.grants: the
    least-privilege workers); None — neither: every old row is deleted in chunks."""
    rows = _exec(
        "SELECT pg_has_role(c.relowner, 'USAGE'),"
        " coalesce(has_function_privilege(to_regprocedure(%s), 'EXECUTE'), false)"
        " FROM pg_catalog.pg_class c"
        " WHERE c.oid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))",
        [_function_signature(spec), spec.schema, spec.table],
    )
    if not rows:
        return None
    owner, function = rows[0]
    return OWNER if owner else FUNCTION if function else None


def _function_signature(spec) -> str:
    return partition_function(spec.schema).as_string(None) + "(text, bigint, regclass)"


def _through_function(spec, step: str, action) -> None:
    """One partition step done by the target owner's partition function, which checks in the
    database that the run may take this partition (database.grants.PARTITION_SQL).
    ``action``: the run's PartitionAction, or (run id, schema, name) before there is one."""
    run_id, schema, name = (
        action if isinstance(action, tuple) else (action.run_id, action.schema, action.name)
    )
    _exec(
        sql.SQL("SELECT {}(%s, %s, %s::regclass)").format(partition_function(spec.schema)),
        [step, run_id, f'"{schema}"."{name}"'],
    )


def needs_settling(run: Run) -> bool:
    """Pass 1 before its first plan step (the planner's cursors not made yet); never for a
    count run."""
    return (
        run.pass_no == 1
        and not run.counts_only  # a count run takes nothing whole: its chunks count every row
        and not run.planner_done
        and not PlannerCursor.objects.filter(run=run, pass_no=1).exists()
    )


def _refusal(run: Run) -> str:
    """Why the run may not act now ('' when it may): the worker's admission read, in a
    statement of its own after the fences were granted (runs.engine.worker._open_chunk_transaction)."""
    ((kill, state, enabled, paused, version_state),) = _exec(
        "SELECT coalesce((SELECT k.on FROM retention_killswitch k WHERE k.name = 'global'), false),"
        " (SELECT r.state FROM runs_run r WHERE r.id = %s),"
        " (SELECT p.enabled FROM retention_policy p WHERE p.id = %s),"
        " (SELECT p.paused FROM retention_policy p WHERE p.id = %s),"
        " (SELECT v.state FROM retention_policyversion v WHERE v.id = %s)",
        [run.pk, run.policy_id, run.policy_id, run.policy_version_id],
    )
    if kill:
        return "global kill switch is on"
    if state != Run.State.ACTIVE:
        return f"run is {state}"
    if not enabled:
        return "policy is disabled"
    if paused:
        return "policy is paused"
    if version_state != PolicyVersion.State.APPROVED:
        return "policy version superseded"
    # the partition function checks the state only: the approval's signature is checked here
    return decisions.approval_refusal(run.policy_version)


@contextmanager
def _session_fences(run: Run, spec):
    """The global fence and the policy's fence, shared, for the session (a concurrent detach
    cannot run inside a transaction), under the policy's lock timeout. Released on exit, and
    the session's timeouts as they were before."""
    with timeouts.session(statement_ms(spec), spec.lock_timeout_ms):
        _exec("SELECT pg_advisory_lock_shared(%s, 0)", [locks.HOLDS])
        try:
            _exec("SELECT pg_advisory_lock_shared(%s, %s)", [locks.POLICY_FENCE, run.policy_id])
            try:
                yield
            finally:
                _exec(
                    "SELECT pg_advisory_unlock_shared(%s, %s)", [locks.POLICY_FENCE, run.policy_id]
                )
        finally:
            _exec("SELECT pg_advisory_unlock_shared(%s, 0)", [locks.HOLDS])


def settle(run: Run, *, deadline: float | None = None) -> str:
    """Take whole what the partitions allow, before the planner's first step of pass 1.
    ``SETTLED``: the planner may plan the parent; ``REFUSED`` + why: the run may not act now
    (kill switch, pause, cancel: the lease stops, as for a chunk); ``POSTPONED``: try again
    later (no partition
    is started after ``deadline``, a ``time.monotonic()`` value: the next lease goes on)."""
    spec = run.policy_version.parsed
    try:
        tree = RP.read_tree(spec)
    except (SpecError, DatabaseError) as exc:
        if isinstance(exc, DatabaseError) and connection_lost(exc):
            raise
        # validation accepted the table, the catalog changed since (or cannot be read by
        # this role): nothing is taken whole, the chunks decide row by row
        log.warning("run %s: partitions not read, deleting in chunks: %s", run.run_key, exc)
        return SETTLED
    if tree is None or not tree.on:
        return SETTLED
    if _ddl_mode(spec) is None:
        # detaching and dropping are the table owner's: a worker login without the owner's
        # partition function deletes every old row in chunks (docs/security.md)
        log.info(
            "run %s: %s is not owned by this role: chunks only", run.run_key, spec.qualified_table
        )
        return SETTLED
    if deadline is not None and time.monotonic() >= deadline:
        return POSTPONED
    if not _exec("SELECT pg_try_advisory_lock(%s, %s)", [PARTITIONS, run.id])[0][0]:
        return POSTPONED  # another lease settles them
    try:
        if not needs_settling(run):
            return SETTLED
        verdict = guard.admission(run, spec)
        if not verdict.admit:
            return f"{POSTPONED}: throttled: {verdict.reason}"
        # an intent left by an interrupted attempt first: a table has one pending detach at a
        # time (a partition whose concurrent detach waits for a foreground snapshot is not in
        # the tree any more, and PostgreSQL refuses to detach another one meanwhile)
        for action in PartitionAction.objects.filter(
            run=run, state=PartitionAction.State.DETACHING
        ):
            if action.not_before is not None and action.not_before > timezone.now():
                # backing off after a failed attempt (its note says why)
                return f"{POSTPONED}: partition {action.schema}.{action.name}: {action.note}"
            with _session_fences(run, spec):
                refusal = _refusal(run)
                if refusal:
                    return REFUSED + refusal
                outcome = _settle_intent(run, spec, tree, action)
                if outcome != SETTLED:
                    return outcome
        for part in tree.partitions:
            if deadline is not None and time.monotonic() >= deadline:
                return POSTPONED
            outcome = settle_one(run, spec, tree, part)
            if outcome != SETTLED:
                return outcome
        return SETTLED
    except DatabaseError as exc:
        if connection_lost(exc):
            raise
        detaching = PartitionAction.objects.filter(
            run=run, state=PartitionAction.State.DETACHING
        ).exists()
        if classify(exc).kind == PERMANENT and not detaching:
            # a permanent error (a privilege, a changed table) would fail every attempt: take
            # nothing whole, the chunks decide row by row
            log.warning("run %s: partitions left to chunks: %s", run.run_key, exc)
            return SETTLED
        log.warning("run %s: partitions postponed: %s", run.run_key, exc)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
        return f"{POSTPONED}: {classify(exc).label}: {first}"
    finally:
        if connection.connection is not None and not connection.needs_rollback:
            try:
                _exec("SELECT pg_advisory_unlock(%s, %s)", [PARTITIONS, run.id])
            except DatabaseError:
                connection.close()


def settle_one(run: Run, spec, tree: RP.Tree, part: RP.Partition) -> str:
    existing = PartitionAction.objects.filter(run=run, schema=part.schema, name=part.name).first()
    if existing is not None and existing.state != PartitionAction.State.DETACHING:
        return SETTLED
    if existing is None and not RP.bound_past(spec, tree, part, run.bound):
        return SETTLED
    with _session_fences(run, spec):
        refusal = _refusal(run)
        if refusal:
            return REFUSED + refusal
        if existing is None:
            if _ddl_mode(spec) == FUNCTION:  # the workers may read it through the function
                _through_function(spec, "read", (run.id, part.schema, part.name))
            try:
                census = RP.census(spec, part, policy_id=run.policy_id, cutoff=run.bound,
                                   outside=discarded_scopes(run), digest=True)  # fmt: skip
            except DatabaseError as exc:
                if classify(exc).sqlstate != "57014":
                    raise
                # too large to read within the timeout: the chunks delete it, never stuck here
                PartitionAction.objects.create(
                    run=run, schema=part.schema, name=part.name, bounds=part.bound,
                    action=spec.partition_action, state=PartitionAction.State.LEFT,
                    note=f"its census exceeded the {statement_ms(spec)} ms statement timeout",
                    done_at=timezone.now(),
                )  # fmt: skip
                return SETTLED
            if not census.droppable:
                return SETTLED  # held, kept, not eligible or empty: the chunks decide per row
            blocked = RP.blocker(spec, part)
            if blocked:  # a DELETE trigger, a view, a foreign key to it: the chunks delete it
                PartitionAction.objects.create(
                    run=run, schema=part.schema, name=part.name, bounds=part.bound,
                    action=spec.partition_action, state=PartitionAction.State.LEFT,
                    note=blocked[:2000], done_at=timezone.now(),
                )  # fmt: skip
                return SETTLED
            # DETACH CONCURRENTLY needs PostgreSQL 14, no default partition, and no
            # transaction block around it
            concurrently = (
                connection.pg_version >= 140000
                and not tree.has_default
                and not connection.in_atomic_block
                # a function runs in a transaction: the partition function detaches plainly
                and _ddl_mode(spec) == OWNER
            )
            existing = PartitionAction.objects.create(
                run=run, schema=part.schema, name=part.name, bounds=part.bound,
                action=spec.partition_action, concurrently=concurrently, rows=census.rows,
            )  # fmt: skip
        return _settle_intent(run, spec, tree, existing)


def _settle_intent(run: Run, spec, tree: RP.Tree, action: PartitionAction) -> str:
    """``_finish`` the detaching partition; a failure is ``_intent_failed``'s to judge."""
    try:
        return _finish(run, spec, tree, action)
    except DatabaseError as exc:
        if connection_lost(exc):
            raise
        return _intent_failed(run, spec, tree, action, exc)


def _intent_failed(run: Run, spec, tree: RP.Tree, action: PartitionAction, exc) -> str:
    """A step of a detaching partition failed (the detach, FINALIZE, the census, putting it
    back, the drop). Never a state without an exit:

    - still attached and the error permanent (no privilege to detach): the chunks delete it;
    - transient (a lock timeout, a statement timeout): tried again after a back-off, at most
      ``RETENTION_MAX_ATTEMPTS`` times; then, still attached, the chunks delete it this run
      (and a later run detaches it, or drops it once empty);
    - detached or DETACH PENDING — its rows out of the application's sight — and permanent
      or out of attempts: the run needs attention, with a dead letter naming the partition,
      the error and the ways out (remove the cause and replay it; or discard it to keep the
      partition detached, on the record)."""
    cls = classify(exc)
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    state = _attached(spec, action)
    attached = state is not None and state[0] and not state[1]
    attempts = action.attempts + 1
    name = f"{action.schema}.{action.name}"
    if attached and cls.kind == PERMANENT:
        log.warning("run %s: %s left to chunks: %s", run.run_key, name, message)
        _leave(action, f"not detached: {message}")
        return SETTLED
    if cls.kind != PERMANENT and attempts < settings.RETENTION["MAX_ATTEMPTS"]:
        retry_at = timezone.now() + timedelta(seconds=backoff(attempts))
        note = (
            f"{message}; tried again after {retry_at:%H:%M:%S} (attempt {attempts} of "
            f"{settings.RETENTION['MAX_ATTEMPTS']})"
        )
        PartitionAction.objects.filter(pk=action.pk).update(
            attempts=attempts, not_before=retry_at, note=note[:2000]
        )
        log.warning("run %s: partition %s: %s", run.run_key, name, note)
        return f"{POSTPONED}: partition {name}: {note}"
    if attached:
        _leave(
            action,
            f"not detached after {attempts} attempts ({message}): deleted in chunks this run;"
            " a later run detaches it, or drops it once it is empty",
        )
        return SETTLED
    where = "DETACH PENDING" if state is not None and state[1] else "detached"
    rows = f"{action.rows:,} row(s)" if action.rows is not None else "rows"
    cause = message
    if cls.sqlstate == "23514" and tree.has_default:
        cause += (
            f" (the default partition holds rows in its range, {action.bounds}: move them out"
            " of the default partition)"
        )
    reason = (
        f"partition {name} is {where} and cannot be finished or put back: {cause}. Its "
        f"{rows} are out of the application's sight until then. Ways out: remove the cause "
        "and replay the run's dead letter (the partition is tried again), or discard it to "
        "keep the partition detached, on the record (its rows neither deleted nor audited)"
    )[:2000]
    with transaction.atomic():
        PartitionAction.objects.filter(pk=action.pk).update(
            attempts=attempts, not_before=None, note=reason
        )
        moved = actions.run_needs_attention(run, actor="worker", reason=reason)
        open_letter = DeadLetter.objects.filter(
            run=run, resolution=DeadLetter.Resolution.OPEN, context__partition_action=action.pk
        ).exists()
        if moved and not open_letter:
            dead_letter(
                chunk=None, run=run, error_class=cls.kind if cls.kind == PERMANENT else "exhausted",
                sqlstate=cls.sqlstate, message=reason, attempts=attempts,
                extra={"stage": "partition", "partition": name, "partition_action": action.pk,
                       "bounds": action.bounds, "state": where, "error": message},
            )  # fmt: skip
    log.error("run %s needs attention: %s", run.run_key, reason)
    return REFUSED + reason


def _parent(spec) -> sql.Identifier:
    return sql.Identifier(spec.schema, spec.table)


def _attached(spec, action: PartitionAction) -> tuple[bool, bool] | None:
    """(attached to the policy's table, detach pending); None: no such table any more."""
    rows = _exec(
        "SELECT i.inhparent = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)),"
        " coalesce(i.inhdetachpending, false)"
        " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid"
        " WHERE n.nspname = %s AND c.relname = %s",
        [spec.schema, spec.table, action.schema, action.name],
    )
    if not rows:
        return None
    return bool(rows[0][0]), bool(rows[0][1])


def _detach(spec, action: PartitionAction) -> None:
    """Detach the partition: concurrently (two transactions of PostgreSQL's own, outside any
    block of ours) when the server allows it, else in a transaction under the lock timeout;
    one whose concurrent detach was interrupted (DETACH PENDING) is finalized. The one place a
    partition is detached."""
    child = sql.Identifier(action.schema, action.name)
    state = _attached(spec, action)
    if state is None or not state[0]:
        return  # detached already (an earlier attempt got this far)
    by_function = _ddl_mode(spec) == FUNCTION
    # under the session's statement timeout (_session_fences)
    if state[1]:  # an interrupted concurrent detach: finish it
        if by_function:
            _through_function(spec, "finalize", action)
        else:
            _exec(
                sql.SQL("ALTER TABLE {} DETACH PARTITION {} FINALIZE").format(_parent(spec), child)
            )
    elif action.concurrently and not by_function:
        _exec(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(_parent(spec), child)
        )
    else:
        with transaction.atomic():
            _exec("SELECT set_config('lock_timeout', %s, true)", [f"{spec.lock_timeout_ms}ms"])
            if by_function:
                _through_function(spec, "detach", action)
            else:
                _exec(sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(_parent(spec), child))


def _attach(spec, action: PartitionAction) -> None:
    """Attach a detached partition to the policy's table again, with the bounds it had (the
    catalog's own text, recorded with the intent; the partition function keeps its own record).
    The one place a partition is attached."""
    if _ddl_mode(spec) == FUNCTION:
        _through_function(spec, "attach", action)
        return
    _exec(
        sql.SQL("ALTER TABLE {} ATTACH PARTITION {} {}").format(
            _parent(spec),
            sql.Identifier(action.schema, action.name),
            sql.SQL(action.bounds),  # catalog text
        )
    )


def _drop(spec, action: PartitionAction) -> None:
    """Drop a detached partition's table. The one place a partition is dropped."""
    if _ddl_mode(spec) == FUNCTION:
        _through_function(spec, "drop", action)
        return
    _exec(sql.SQL("DROP TABLE {}").format(sql.Identifier(action.schema, action.name)))


def _finish(run: Run, spec, tree: RP.Tree, action: PartitionAction) -> str:
    """Detach (if not yet), then in one transaction: check every row again, audit, drop."""
    _detach(spec, action)  # a failure is _intent_failed's (retried, left to chunks, attention)
    part = RP.Partition(action.schema, action.name, action.bounds, None, None, None)
    started = timezone.now()
    with transaction.atomic():
        _exec(
            "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true),"
            " pg_advisory_xact_lock_shared(%s, 0), pg_advisory_xact_lock_shared(%s, %s)",
            [f"{spec.lock_timeout_ms}ms", f"{statement_ms(spec)}ms", locks.HOLDS,
             locks.POLICY_FENCE, run.policy_id],
        )  # fmt: skip
        if _attached(spec, action) is None:
            # dropped by someone else after this run detached it: its rows cannot be audited
            # (the invariant checker reports them as gone unaudited); the run goes on
            _leave(
                action, "the detached table was dropped outside the run: its rows are not audited"
            )
            return SETTLED
        _exec(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(part.ident()))
        census = RP.census(spec, part, policy_id=run.policy_id, cutoff=run.bound,
                           outside=discarded_scopes(run), digest=True)  # fmt: skip
        blocked = RP.blocker(spec, part)
        if not census.droppable or blocked:
            # a row may no longer go (a hold that committed while the detach was interrupted),
            # or a trigger, view or foreign key came since: put the partition back with the
            # bounds it had, and let the chunks decide per row
            _attach(spec, action)
            _leave(action, f"{blocked or f'{census.protected} row(s) may not go'}: attached again")
            return SETTLED
        dropped = action.action == "drop"
        chunk = Chunk.objects.create(
            run=run, pass_no=0, tenant="", seq=0, key_from=census.min_key,
            key_to=None if census.max_key is None else planner.exclusive_end(census.max_key),
            # a key that is not one integer column has no bigint bounds: the partition names it
            lo=None if census.min_key is not None else [f"partition {action.schema}.{action.name}"],
            planned_rows=census.rows, state=Chunk.State.DONE,
            done_at=timezone.now(), attempts=1,
        )  # fmt: skip
        facts = {
            "name": f"{action.schema}.{action.name}",
            "bounds": action.bounds,
            "rows": census.rows,
            "digest": f"md5:{census.digest}",
            "action": "dropped" if dropped else "detached",
            "concurrently": action.concurrently,
        }
        audit.append(
            chunk_id=chunk.id, run_id=run.id, policy_version_id=run.policy_version_id,
            policy_slug=spec.slug, table_name=spec.qualified_table, cutoff=run.bound, tenant="",
            key_from=chunk.key_from, key_to=chunk.key_to, attempt=1, worker_host=HOST,
            worker_pid=os.getpid(), rows_deleted=census.rows, started_at=started,
            outcome=facts["action"], run_key=run.run_key, partition=facts,
            **audit.version_facts(run.policy_version),
        )  # fmt: skip
        PartitionAction.objects.filter(pk=action.pk).update(
            state=PartitionAction.State.DROPPED if dropped else PartitionAction.State.DETACHED,
            rows=census.rows, digest=census.digest or "", chunk=chunk, done_at=timezone.now(),
        )  # fmt: skip
        if dropped:
            _drop(spec, action)
    log.info(
        "run %s: partition %s %s (%s rows)",
        run.run_key,
        facts["name"],
        facts["action"],
        census.rows,
    )
    return SETTLED


def _leave(action: PartitionAction, why: str) -> None:
    PartitionAction.objects.filter(pk=action.pk).update(
        state=PartitionAction.State.LEFT, note=why[:2000], done_at=timezone.now()
    )
    log.info("partition %s.%s: %s", action.schema, action.name, why)


def drop_kept_detached(policy, now) -> list[str]:
    """Drop the detached partition tables of ``policy``'s runs whose detach is older than the
    run's version's ``detached_keep`` (the reconciler's step; docs/engine.md, "Partitions").
    Each in a savepoint of the caller's transaction, under the policy's lock timeout and the
    fences a chunk takes: the table must still exist, be attached to nothing, hold exactly
    the rows (count, md5 of the ordered keys) its audit record names, none of them held now.
    A table dropped or attached again by someone else, or whose rows changed, is left alone
    for good with a note; a held row keeps it until the hold is released. Its rows were
    audited when the run detached it: the drop is a ledger update (``dropped_at``) and an
    operator-log row, no second audit record. Returns one line per table it looked at."""
    out = []
    candidates = PartitionAction.objects.filter(
        run__policy=policy, state=PartitionAction.State.DETACHED, dropped_at__isnull=True, note=""
    ).select_related("run", "run__policy_version")
    for action in candidates.order_by("done_at", "id"):
        spec = action.run.policy_version.parsed
        keep = spec.detached_keep_delta
        if keep is None or action.done_at is None or action.done_at > now - keep:
            continue
        try:
            with transaction.atomic():
                out.append(_drop_detached(action, spec, now))
        except DatabaseError as exc:
            if connection_lost(exc):
                raise
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("detached %s.%s not dropped yet: %s", action.schema, action.name, first)
            out.append(f"{action.schema}.{action.name}: postponed ({first})")
    return out


def _drop_detached(action: PartitionAction, spec, now) -> str:
    run = action.run
    name = f"{action.schema}.{action.name}"
    ((lock_was,),) = _exec("SELECT current_setting('lock_timeout')")
    _exec(
        "SELECT set_config('lock_timeout', %s, true), pg_advisory_xact_lock_shared(%s, 0),"
        " pg_advisory_xact_lock_shared(%s, %s)",
        [f"{spec.lock_timeout_ms}ms", locks.HOLDS, locks.POLICY_FENCE, run.policy_id],
    )
    rows = _exec(
        "SELECT i.inhparent::regclass::text FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid"
        " WHERE n.nspname = %s AND c.relname = %s",
        [action.schema, action.name],
    )
    why = ""
    if not rows:
        why = "the detached table was dropped outside the run: left alone"
    elif rows[0][0] is not None:
        why = f"the detached table was attached to {rows[0][0]} again: left alone, not dropped"
    else:
        part = RP.Partition(action.schema, action.name, action.bounds, None, None, None)
        _exec(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(part.ident()))
        census = RP.census(spec, part, policy_id=run.policy_id, cutoff=run.bound,
                           outside=discarded_scopes(run), digest=True)  # fmt: skip
        if census.rows != action.rows or (census.digest or "") != action.digest:
            why = (
                f"the detached table holds {census.rows} row(s) with digest md5:{census.digest},"
                f" its audit record names {action.rows} with md5:{action.digest}: left alone,"
                " not dropped"
            )
        elif census.protected:
            _exec("SELECT set_config('lock_timeout', %s, true)", [lock_was])
            # a hold placed since the detach covers some of its rows: kept while it lasts
            return f"{name}: kept, {census.protected} row(s) may not go (held) now"
        else:
            _drop(spec, action)
            note = f"detached table dropped by the reconciler after {spec.detached_keep}"
            PartitionAction.objects.filter(pk=action.pk).update(dropped_at=now, note=note)
            record_action(
                "reconciler", "partition.drop_detached", action, reason=note, run=run.run_key,
                partition=name, rows=census.rows, digest=f"md5:{census.digest}",
                detached_at=action.done_at.isoformat(), detached_keep=spec.detached_keep,
            )  # fmt: skip
            _exec("SELECT set_config('lock_timeout', %s, true)", [lock_was])
            log.info("detached partition %s dropped after %s", name, spec.detached_keep)
            return f"{name}: dropped"
    PartitionAction.objects.filter(pk=action.pk).update(note=why[:2000])
    record_action(
        "reconciler", "partition.leave_detached", action, reason=why, run=run.run_key,
        partition=name, detached_keep=spec.detached_keep,
    )  # fmt: skip
    _exec("SELECT set_config('lock_timeout', %s, true)", [lock_was])
    log.info("detached partition %s: %s", name, why)
    return f"{name}: {why}"


def settle_left_behind(policy, *, version: PolicyVersion | None = None) -> list[str]:
    """The reconciler's step for partitions no run is finishing (docs/engine.md, "Partitions").
    Returns one line per partition it acted on or surfaces.

    - A partition a run started to detach (its intent still ``detaching``) whose run ended —
      cancelled, superseded, expired — before the drop: nothing may delete it any more, so it
      is put back: a DETACH PENDING one finalized, then attached with the bounds it had
      (``partition.put_back`` on the operator log; the intent ``left``). One that cannot be
      put back (the default partition holds rows in its range, a lock held too long) is
      tried again each pass, its note and the operator log (``partition.left_detached``, once
      per reason) saying why. An open run's intents are its own settle's (retried, or
      attention with a dead letter).
    - A partition of the policy's table DETACH PENDING that no run of the policy started is
      surfaced, not touched: it is someone else's, and no partition of the table can be
      detached until it is finished or attached again.

    Each partition in a savepoint of the caller's transaction, under the policy's lock
    timeout (``timeouts.target_lock_ms``). ``version``: the policy's approved version as the
    caller read it (read here when not given)."""
    out = []
    ended = PartitionAction.objects.filter(
        run__policy=policy, state=PartitionAction.State.DETACHING, run__state__in=Run.TERMINAL
    ).select_related("run", "run__policy_version")
    for action in ended.order_by("id"):
        spec = action.run.policy_version.parsed
        try:
            with transaction.atomic():
                out.append(_put_back(action, spec))
        except DatabaseError as exc:
            if connection_lost(exc):
                raise
            out.append(_left_detached(action, exc))
    version = version or policy.approved_version
    pending = _detach_pending(version.parsed) if version is not None else []
    if pending:
        spec = version.parsed
        owned = set(
            PartitionAction.objects.filter(
                run__policy=policy, state=PartitionAction.State.DETACHING, run__state__in=Run.OPEN
            ).values_list("schema", "name")
        )
        for schema, name in pending:
            if (schema, name) not in owned:
                line = (
                    f"{schema}.{name}: DETACH PENDING on {spec.qualified_table}, not started by a"
                    " run of this policy: finish it (ALTER TABLE … DETACH PARTITION … FINALIZE)"
                    " or attach it again; no partition of the table can be detached until then"
                )
                log.warning("policy %s: %s", policy.slug, line)
                out.append(line)
    return out


def _detach_pending(spec) -> list[tuple[str, str]]:
    return [
        (schema, name)
        for schema, name in _exec(
            "SELECT n.nspname, c.relname FROM pg_catalog.pg_inherits i"
            " JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE i.inhparent = to_regclass(quote_ident(%s) || '.' || quote_ident(%s))"
            " AND i.inhdetachpending ORDER BY 1, 2",
            [spec.schema, spec.table],
        )
    ]


def _put_back(action: PartitionAction, spec) -> str:
    run = action.run
    name = f"{action.schema}.{action.name}"
    _exec("SELECT set_config('lock_timeout', %s, true)", [f"{timeouts.target_lock_ms(spec)}ms"])
    state = _attached(spec, action)
    if state is None:
        why = f"the detached table is gone (dropped outside the run {run.run_key})"
        _leave(action, why)
        record_action("reconciler", "partition.left_detached", action, reason=why, partition=name)
        return f"{name}: {why}"
    if state[0] and state[1]:  # DETACH PENDING: finish the detach, then attach it again
        _detach(spec, action)
        state = (False, False)
    if not state[0]:
        _attach(spec, action)
    why = (
        f"put back by the reconciler: run {run.run_key} ended ({run.state}) before the partition"
        " was dropped; nothing in it was deleted"
    )
    _leave(action, why)
    record_action(
        "reconciler", "partition.put_back", action, reason=why, partition=name, run=run.run_key
    )
    return f"{name}: put back (run {run.state})"


def _left_detached(action: PartitionAction, exc) -> str:
    name = f"{action.schema}.{action.name}"
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    why = (
        f"left detached: run {action.run.run_key} ended ({action.run.state}) and the partition"
        f" cannot be put back: {message}; tried again each reconciler pass"
    )[:2000]
    if action.note != why:
        PartitionAction.objects.filter(pk=action.pk).update(note=why)
        record_action("reconciler", "partition.left_detached", action, reason=why, partition=name)
    log.warning("partition %s: %s", name, why)
    return f"{name}: {why}"
