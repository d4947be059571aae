"""After a run: the dead tuples its deletes left on the target, and ``VACUUM (ANALYZE)`` as the
policy's ``vacuum`` says — recommended (``recommend``), scheduled on the cleanup cluster once
the drain has committed (``run``), or neither (``off``). What it finds and does is stored with
the run's verification (``Run.verification``), which the run page, ``retention status`` and
the evidence manifest read (docs/guard.md, "After a run")."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import DatabaseError, connection, transaction
from django.db.models import Sum
from django.utils import timezone
from psycopg import sql

from core import timeouts
from core.oplog import record_action
from retention.models import KillSwitch
from runs.engine import dispatch
from runs.models import AuditRecord, Run

log = logging.getLogger(__name__)

VACUUM_TASK = "runs.tasks.vacuum_target"
STATS_TIMEOUT_MS = 2_000

# Both statements read the target's leaves: the table itself, or each leaf partition of a
# partitioned table (``leaves``).
# Dead and live tuples as PostgreSQL's statistics count them (what autovacuum acts on), summed
# over the leaves.
TUPLES_SQL = (
    "WITH target AS (SELECT c.oid, c.relkind FROM pg_catalog.pg_class c"
    "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    "  WHERE n.nspname = %s AND c.relname = %s),"
    " leaves AS (SELECT oid AS relid FROM target WHERE relkind <> 'p'"
    "  UNION SELECT t.relid FROM target, pg_catalog.pg_partition_tree(target.oid::regclass) t"
    "  WHERE target.relkind = 'p' AND t.isleaf)"
    " SELECT sum(s.n_dead_tup)::bigint, sum(s.n_live_tup)::bigint, count(s.relid)"
    " FROM leaves JOIN pg_catalog.pg_stat_user_tables s USING (relid)"
)
# The leaves a manual VACUUM has not finished on since the given instant (a VACUUM the role
# may not run skips the table with only a WARNING: this is how the task knows).
NOT_VACUUMED_SQL = (
    "WITH target AS (SELECT c.oid, c.relkind FROM pg_catalog.pg_class c"
    "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    "  WHERE n.nspname = %s AND c.relname = %s),"
    " leaves AS (SELECT oid AS relid FROM target WHERE relkind <> 'p'"
    "  UNION SELECT t.relid FROM target, pg_catalog.pg_partition_tree(target.oid::regclass) t"
    "  WHERE target.relkind = 'p' AND t.isleaf)"
    " SELECT count(*) FILTER (WHERE s.last_vacuum IS NULL OR s.last_vacuum < %s),"
    " count(*) FROM leaves JOIN pg_catalog.pg_stat_user_tables s USING (relid)"
)

SCHEDULED, RUNNING, DONE, FAILED, NOT_RUN = "scheduled", "running", "done", "failed", "not run"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _tuples(spec) -> tuple[int | None, int | None, int]:
    with connection.cursor() as cur:
        cur.execute(TUPLES_SQL, [spec.schema, spec.table])
        dead, live, leaves = cur.fetchone()
    return dead, live, leaves


def left_by_run(run: Run) -> int:
    """Dead tuples the run's deletes left on its target: the rows its chunks deleted, from its
    own ledger (exact at once, whatever PostgreSQL's statistics have been told yet; a
    partition dropped whole leaves none)."""
    total = AuditRecord.objects.filter(run=run, partition__isnull=True).aggregate(
        rows=Sum("rows_deleted")
    )["rows"]
    return int(total or 0)


def after_run_maintenance(run: Run) -> dict:
    """What a run that has just drained leaves for ``VACUUM``: the dead and live tuples on its
    target and a note saying what is recommended or scheduled. Call it inside the transaction
    that drains the run; with ``vacuum = "run"`` the ``vacuum_target`` task is sent only once
    that transaction commits.

    The dead tuples are at least the rows the run's chunks deleted (``left_by_run``, from the
    ledger), more when PostgreSQL's statistics count more on the target (summed over the
    leaves of a partitioned table). The statistics alone would be stale: a backend reports its
    deletes about a second after they commit, and the finisher is usually the worker that
    deleted the last chunks. They are read in a savepoint under a short timeout: when they
    cannot be read, the note says so and the run drains all the same."""
    spec = run.policy_version.parsed
    table = spec.qualified_table
    unread = ""
    counted = live = None
    try:
        with transaction.atomic(), timeouts.bounded(STATS_TIMEOUT_MS):
            counted, live, leaves = _tuples(spec)
        if not leaves:
            unread = "PostgreSQL keeps no statistics for it"
    except DatabaseError as exc:
        unread = _first_line(exc)
    dead = max(left_by_run(run), counted or 0)
    out: dict = {"dead_tuples": dead, "live_tuples": live, "vacuum": spec.vacuum}
    unread_note = f"the statistics could not be read ({unread})" if unread else ""
    if spec.vacuum == "run":
        dispatch.enqueue_after_commit(VACUUM_TASK, run.id)
        out["vacuum_state"] = SCHEDULED
        out["vacuum_scheduled_at"] = timezone.now().isoformat()
        out["vacuum_sends"] = 1
        out["vacuum_note"] = "; ".join(
            filter(None, [f"VACUUM (ANALYZE) {table} scheduled", unread_note])
        )
    elif spec.vacuum == "recommend":
        if dead:
            note = f"recommended: VACUUM (ANALYZE) {table} ({dead:,} dead tuples)"
        else:
            note = f"no dead tuples counted on {table}: no VACUUM needed"
        out["vacuum_note"] = "; ".join(filter(None, [note, unread_note]))
    return out


def record_after_run(run: Run) -> None:
    """Add ``after_run_maintenance`` to a run that has just drained (its row locked by the
    caller, in the drain's transaction)."""
    run.verification = {**(run.verification or {}), **after_run_maintenance(run)}
    run.save(update_fields=["verification"])


def _record(run_id: int, update: dict, *, expect: str | None = None) -> bool:
    """Merge ``update`` into the run's verification; with ``expect``, only while its
    ``vacuum_state`` is that (a second delivery of the task finds it changed). True if done."""
    with transaction.atomic():
        timeouts.set_local(timeouts.engine_statement_ms())
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return False
        verification = run.verification or {}
        if expect is not None and verification.get("vacuum_state") != expect:
            return False
        run.verification = {**verification, **update}
        run.save(update_fields=["verification"])
    return True


def _set_timeouts(cur, statement: str, lock: str) -> None:
    cur.execute(
        "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
        [statement, lock],
    )


def _failure(exc: DatabaseError, table: str, *, seconds: float, statement_ms: int, lock_ms: int):
    sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
    if sqlstate == "57014":  # statement timeout
        return (
            f"VACUUM (ANALYZE) {table} stopped after {seconds:.0f} s: a scheduled VACUUM takes a "
            f"cleanup worker for at most {statement_ms / 1000:g} s (one lease budget, "
            "RETENTION_LEASE_BUDGET_S), so that chunk work does not wait behind it; run it by "
            "hand at a quiet time, or leave it to autovacuum"
        )
    if sqlstate == "55P03":  # lock timeout
        return (
            f"VACUUM (ANALYZE) {table} not run: another session held a conflicting lock on it "
            f"for over {lock_ms / 1000:g} s"
        )
    return f"VACUUM (ANALYZE) {table} failed: {_first_line(exc)}"


def _vacuum(spec, statement_ms: int) -> tuple[str, str]:
    """Run ``VACUUM (ANALYZE)`` on the target in autocommit under a statement timeout, then
    check in the statistics that every leaf was vacuumed (PostgreSQL skips a table the role
    may not vacuum with only a WARNING, whose words the note then quotes). The session's
    timeouts are restored afterwards. Returns (state, note)."""
    table = spec.qualified_table
    statement = sql.SQL("VACUUM (ANALYZE) {}.{}").format(
        sql.Identifier(spec.schema), sql.Identifier(spec.table)
    )
    lock_ms = min(statement_ms, timeouts.engine_statement_ms())
    warnings: list[str] = []

    def on_notice(diag) -> None:
        if diag.severity_nonlocalized == "WARNING" and diag.message_primary:
            warnings.append(diag.message_primary)

    connection.ensure_connection()
    raw = connection.connection
    with connection.cursor() as cur:
        cur.execute(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
            " clock_timestamp()"
        )
        before_statement, before_lock, started_at = cur.fetchone()
        started = time.monotonic()
        raw.add_notice_handler(on_notice)
        try:
            _set_timeouts(cur, f"{statement_ms}ms", f"{lock_ms}ms")
            cur.execute(statement.as_string(cur.connection))
            seconds = time.monotonic() - started
            cur.execute(NOT_VACUUMED_SQL, [spec.schema, spec.table, started_at])
            missed, leaves = cur.fetchone()
        except DatabaseError as exc:
            seconds = time.monotonic() - started
            return FAILED, _failure(
                exc, table, seconds=seconds, statement_ms=statement_ms, lock_ms=lock_ms
            )
        finally:
            raw.remove_notice_handler(on_notice)
            try:
                _set_timeouts(cur, before_statement, before_lock)
            except DatabaseError:
                connection.close()  # a broken session: the next statement reconnects
    if missed or not leaves:
        why = warnings[0] if warnings else "PostgreSQL skipped it"
        return FAILED, (
            f"VACUUM (ANALYZE) {table} failed: {why}. The workers' database role may not "
            "vacuum it: only the table's owner may (on PostgreSQL 17 and later also a role "
            'granted MAINTAIN on it); see docs/security.md, or set vacuum = "recommend"'
        )
    return DONE, f"VACUUM (ANALYZE) {table} done in {seconds:.1f} s"


def vacuum_target(run_id: int) -> str:
    """``VACUUM (ANALYZE)`` the target of a drained run whose policy says ``vacuum = "run"``,
    once: a delivery that finds the run's vacuum no longer scheduled (a second delivery, or
    one that started and died) changes nothing. Runs outside any transaction, bounded by
    ``timeouts.vacuum_statement_ms`` so that it fits the task timeout; not while the kill
    switch is on or the policy is paused. The outcome — done, or one sentence saying why not
    (the role may not vacuum the table, it took too long, the table stayed locked) — is
    recorded on the run's verification, where the run page, ``retention status`` and the
    evidence manifest show it. Returns that sentence."""
    if connection.in_atomic_block:
        raise RuntimeError("VACUUM cannot run inside a transaction")
    run = Run.objects.select_related("policy_version", "policy").filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} not found"
    spec = run.policy_version.parsed
    table = spec.qualified_table
    state = (run.verification or {}).get("vacuum_state")
    if state != SCHEDULED:
        return f"VACUUM (ANALYZE) {table}: nothing to do ({state or 'not scheduled'})"
    if KillSwitch.is_on() or run.policy.paused:
        why = (
            "the kill switch is on" if KillSwitch.is_on() else f"policy {run.policy.slug} is paused"
        )
        note = f"VACUUM (ANALYZE) {table} not run: {why}"
        _record(run_id, {"vacuum_state": NOT_RUN, "vacuum_note": note}, expect=SCHEDULED)
        return note
    started = timezone.now()
    claimed = _record(
        run_id,
        {
            "vacuum_state": RUNNING,
            "vacuum_note": f"VACUUM (ANALYZE) {table} running (no outcome recorded yet)",
            "vacuum_started_at": started.isoformat(),
            "vacuum_tries": (run.verification or {}).get("vacuum_tries", 0) + 1,
        },
        expect=SCHEDULED,
    )
    if not claimed:
        return f"VACUUM (ANALYZE) {table}: another delivery took it"
    state, note = _vacuum(spec, timeouts.vacuum_statement_ms())
    if state != DONE:
        log.warning("run %s: %s", run.run_key, note)
    connection.close_if_unusable_or_obsolete()  # a lost connection: record on a new one
    _record(
        run_id,
        {
            "vacuum_state": state,
            "vacuum_note": note,
            "vacuum_finished_at": timezone.now().isoformat(),
        },
    )
    return note


# -- the owner of a VACUUM that waits on a task ------------------------------------------

VACUUM_TRIES = 3  # messages sent, or deliveries that died before recording an outcome


def _when(value, default):
    try:
        return datetime.fromisoformat(value) if value else default
    except (TypeError, ValueError):
        return default


def reclaim_vacuums(policy, now) -> list[str]:
    """The reconciler's step for the policy's drained runs whose ``VACUUM`` waits on a task
    (in the caller's transaction; returns one line per run it acted on). A ``scheduled``
    VACUUM whose message was not taken within ``timeouts.task_deadline_s`` of its sending is
    sent again (the after-commit send is no outbox: a process that died after the drain's
    commit lost it); a ``running`` one whose task started longer ago than the task timeout
    and headroom died without recording an outcome (its worker killed) and is scheduled
    again. After ``VACUUM_TRIES`` sends, or deliveries that died, it is not tried again and
    the note says why. Each decision is on the operator log."""
    out = []
    sent_deadline = timedelta(seconds=timeouts.task_deadline_s())
    run_deadline = timedelta(seconds=timeouts.task_timeout_s() + timeouts.HEADROOM_S)
    waiting = Run.objects.select_for_update(skip_locked=True, of=("self",)).filter(
        policy=policy, state=Run.State.DRAINED, verification__vacuum_state__in=(SCHEDULED, RUNNING)
    )
    for run in waiting.select_related("policy_version"):
        v = dict(run.verification)
        table = run.policy_version.parsed.qualified_table
        if v["vacuum_state"] == SCHEDULED:
            sent = _when(v.get("vacuum_scheduled_at"), run.finished_at or now)
            if now - sent < sent_deadline:
                continue
            sends = int(v.get("vacuum_sends", 1))
            if sends >= VACUUM_TRIES:
                action, update = (
                    "run.vacuum_not_run",
                    {
                        "vacuum_state": NOT_RUN,
                        "vacuum_note": (
                            f"VACUUM (ANALYZE) {table} not run: its task was sent {sends} times and "
                            "never started (is a cleanup cluster running?); run it by hand or "
                            "leave it to autovacuum"
                        ),
                    },
                )
            else:
                action, update = (
                    "run.vacuum_resend",
                    {
                        "vacuum_sends": sends + 1,
                        "vacuum_scheduled_at": now.isoformat(),
                        "vacuum_note": (
                            f"VACUUM (ANALYZE) {table} scheduled (sent again: no worker took the "
                            f"message within {sent_deadline.total_seconds():g} s)"
                        ),
                    },
                )
        else:
            started = _when(v.get("vacuum_started_at"), run.finished_at or now)
            if now - started < run_deadline:
                continue
            tries = int(v.get("vacuum_tries", 1))
            if tries >= VACUUM_TRIES:
                action, update = (
                    "run.vacuum_failed",
                    {
                        "vacuum_state": FAILED,
                        "vacuum_note": (
                            f"VACUUM (ANALYZE) {table} failed: its task was killed {tries} times "
                            "before it recorded an outcome (a worker crash or restart); run it by "
                            "hand or leave it to autovacuum"
                        ),
                    },
                )
            else:
                action, update = (
                    "run.vacuum_resend",
                    {
                        "vacuum_state": SCHEDULED,
                        "vacuum_sends": 1,
                        "vacuum_scheduled_at": now.isoformat(),
                        "vacuum_note": (
                            f"VACUUM (ANALYZE) {table} scheduled again: the task that started it at "
                            f"{started:%Y-%m-%d %H:%M:%S} recorded no outcome (its worker was killed)"
                        ),
                    },
                )
        run.verification = {**v, **update}
        run.save(update_fields=["verification"])
        record_action("reconciler", action, run, reason=update["vacuum_note"])
        if run.verification["vacuum_state"] == SCHEDULED:
            dispatch.enqueue(VACUUM_TASK, run.id)  # with the ORM broker: in this transaction
        out.append(f"{run.run_key}: {update['vacuum_note']}")
    return out
