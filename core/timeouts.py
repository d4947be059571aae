"""Statement and lock timeouts for work that runs inside a django-q2 task.

django-q2 enforces its task timeout with ``TimeoutException``, a ``SystemExit``: no
``except Exception`` sees it and the whole transaction in progress is lost. So every
statement of a periodic task is bounded by a PostgreSQL timeout well inside the task
timeout, and a statement that hits it fails as an ordinary ``DatabaseError``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, connection, transaction


def task_timeout_s() -> float:
    return float(settings.Q_CLUSTER["timeout"])


def task_deadline_s() -> float:
    """How long after a task was sent the engine stops waiting for its outcome: django-q2's
    redelivery delay plus its task timeout. A message taken within that time has finished or
    been redelivered by then; one not taken at all was lost."""
    return float(settings.Q_CLUSTER["retry"]) + task_timeout_s()


def reconciler_budget() -> tuple[float, int]:
    """(seconds a reconciler pass may spend, statement/lock timeout in ms for each of its
    statements): half the task timeout, and a twelfth of it per statement (at most 10 s)."""
    timeout = task_timeout_s()
    return timeout / 2, max(100, min(10_000, int(timeout * 1000 / 12)))


def _current_ms(cur) -> tuple[int, int]:
    cur.execute(
        "SELECT (SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'),"
        " (SELECT setting::int FROM pg_settings WHERE name = 'lock_timeout')"
    )
    statement_ms, lock_ms = cur.fetchone()
    return statement_ms, lock_ms


def set_local(statement_ms: int, lock_ms: int | None = None) -> None:
    """Bound the rest of the current transaction's statements."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)",
            [
                f"{int(statement_ms)}ms",
                f"{int(lock_ms if lock_ms is not None else statement_ms)}ms",
            ],
        )


@contextmanager
def bounded(statement_ms: int, lock_ms: int | None = None):
    """Run the block's statements under at most these timeouts (a tighter one already in force
    is kept), then restore the previous values. Use it inside ``transaction.atomic()``: a
    ``SET LOCAL`` taken in a savepoint otherwise outlives the savepoint until the transaction
    ends; if the block fails, the savepoint's rollback restores them."""
    with connection.cursor() as cur:
        prev_statement, prev_lock = _current_ms(cur)
    lock_ms = statement_ms if lock_ms is None else lock_ms

    def tighter(new: int, old: int) -> int:
        return new if old == 0 else min(new, old)

    set_local(tighter(statement_ms, prev_statement), tighter(lock_ms, prev_lock))
    yield
    set_local(prev_statement, prev_lock)


def wait_for_lock(seconds: float, take) -> bool:
    """Run ``take()`` — statements that queue for a lock another session holds — in a
    transaction of its own with a lock timeout of ``seconds``: True when the lock was had (and
    released at the end of that transaction), False when the time was up first."""
    ms = max(1, int(seconds * 1000))
    try:
        with transaction.atomic(), bounded(ms + engine_statement_ms(), ms):
            take()
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        return False
    return True


@contextmanager
def session(statement_ms: int | None = None, lock_ms: int | None = None):
    """Session-level timeouts for the block (for statements that cannot run in a transaction
    block: a concurrent detach, ``VACUUM``), then the values in force before are restored —
    never ``RESET``, which would drop an engine session's default lock timeout
    (``engine_session``). ``None`` leaves that timeout as it is."""
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
        before_statement, before_lock = cur.fetchone()
        cur.execute(
            "SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
            [
                before_statement if statement_ms is None else f"{int(statement_ms)}ms",
                before_lock if lock_ms is None else f"{int(lock_ms)}ms",
            ],
        )
    try:
        yield
    finally:
        if connection.connection is not None and not connection.needs_rollback:
            try:
                with connection.cursor() as cur:
                    cur.execute(
                        "SELECT set_config('statement_timeout', %s, false),"
                        " set_config('lock_timeout', %s, false)",
                        [before_statement, before_lock],
                    )
            except DatabaseError:
                connection.close()  # a broken session: the next statement reconnects


# -- every statement of the engine waits for a lock at most this long -------------------


class _Depth(threading.local):
    """Engine work nested in this thread (each thread has its own database connection:
    ``retention drain --workers N`` runs N workers as threads of one process)."""

    value = 0


_engine_depth = _Depth()  # > 0 while this thread runs engine work (a task, ``retention drain``)


def engine_lock_ms() -> int:
    """The lock timeout every statement of the engine runs under unless it sets a tighter one
    (a chunk transaction: the policy's ``lock_timeout_ms``): the engine's per-statement bound,
    a twelfth of the task timeout, at most 10 s. No statement of a lease, a reconciler pass
    or an after-run task waits on a lock for longer: a row or table another session holds
    makes it fail like any other lock timeout (retried, postponed or recorded)."""
    return engine_statement_ms()


def _apply_engine_lock_timeout(conn) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, false)", [f"{engine_lock_ms()}ms"])


def on_connection_created(sender, connection, **kwargs) -> None:
    """A connection opened during engine work (after a lost one) gets the engine's default."""
    if _engine_depth.value > 0:
        _apply_engine_lock_timeout(connection)


@contextmanager
def engine_session():
    """Engine work (django-q2 tasks, ``retention drain``): every statement of the block's
    session waits for a lock at most ``engine_lock_ms`` — also on a connection opened during
    the block (``on_connection_created``, connected in ``core.apps``). The session's default
    is restored afterwards (a django-q2 worker reuses its connection)."""
    _engine_depth.value += 1
    try:
        if _engine_depth.value == 1 and connection.connection is not None:
            _apply_engine_lock_timeout(connection)
        yield
    finally:
        _engine_depth.value -= 1
        if (
            _engine_depth.value == 0
            and connection.connection is not None
            and not connection.needs_rollback
        ):
            try:
                with connection.cursor() as cur:
                    cur.execute("SET lock_timeout TO DEFAULT")
            except DatabaseError:
                if not connection.in_atomic_block:
                    connection.close()  # a broken session: the next statement reconnects


# -- the limits a chunk transaction must fit (policies are validated against them) --------

HEADROOM_S = 3.0  # a guard sample (2 s statement timeout) and the lease's own bookkeeping


def lease_budget_s() -> float:
    return float(settings.RETENTION["LEASE_BUDGET_S"])


def target_lock_ms(spec) -> int:
    """How long a statement of the engine outside a chunk transaction (the planner's walk, the
    geometry's sample, the admission count, a verification) waits for a lock on the policy's
    table: the policy's own lock timeout (``timeouts.lock_ms``), within the engine's bound.
    A table locked by someone's DDL costs a lease or a reconciler pass no more than that,
    and a stopping worker no longer than that to notice."""
    return max(1, min(int(spec.lock_timeout_ms), engine_statement_ms()))


def reconciler_lock_ms() -> int:
    """Lock timeout of the reconciler's own ledger statements (a row an operator's decision
    or a finisher holds): a second at most — the policy is tried again next pass."""
    return min(1_000, reconciler_budget()[1])


def engine_statement_ms() -> int:
    """Statement and lock timeout of the planner's and verification's queries inside a lease:
    the reconciler's per-statement bound (a twelfth of the task timeout, at most 10 s)."""
    return reconciler_budget()[1]


def vacuum_statement_ms() -> int:
    """Statement timeout of the ``VACUUM (ANALYZE)`` a policy with ``vacuum = "run"`` schedules
    after a drained run: one lease budget — it holds a cleanup worker no longer than a lease
    does, so chunk work waits no longer behind it — and always inside the task timeout with
    room for the task to record the outcome (two ledger statements and the headroom)."""
    fit = int((task_timeout_s() - HEADROOM_S) * 1000) - 2 * engine_statement_ms()
    return max(1_000, min(int(lease_budget_s() * 1000), fit))


def chunk_worst_ms(lock_ms: int, statement_ms: int) -> int:
    """The longest a chunk transaction can take with these timeouts: its DELETE, plus two lock
    waits (the fences in its first statement, the audit chain lock) that each end at the lock
    timeout or the statement timeout, whichever comes first."""
    return statement_ms + 2 * min(lock_ms, statement_ms)


def chunk_limit_ms() -> int:
    """What a chunk may take so that a lease never outlives django-q2's task timeout: the task
    timeout minus the lease budget (a chunk may start just before it ends), one planning step
    (two planner statements) and the headroom."""
    return int(
        (task_timeout_s() - lease_budget_s() - HEADROOM_S) * 1000 - 2 * engine_statement_ms()
    )


def chunk_timeouts_error(lock_ms: int, statement_ms: int) -> str | None:
    """One sentence naming every limit when a policy's chunk timeouts cannot fit, else None.
    A chunk killed by the task timeout records nothing and would be repeated at the same size."""
    worst, limit = chunk_worst_ms(lock_ms, statement_ms), chunk_limit_ms()
    if worst <= limit:
        return None
    return (
        f"timeouts.statement_ms {statement_ms} and timeouts.lock_ms {lock_ms} let a chunk run for "
        f"up to {worst} ms (statement_ms + 2 × min(lock_ms, statement_ms)), but a chunk must "
        f"finish within {max(0, limit)} ms: the task timeout (RETENTION_Q_TIMEOUT "
        f"{task_timeout_s():g} s) minus the lease budget (RETENTION_LEASE_BUDGET_S "
        f"{lease_budget_s():g} s), one planning step (2 × {engine_statement_ms()} ms) and "
        f"{HEADROOM_S:g} s of headroom; lower the timeouts or raise RETENTION_Q_TIMEOUT"
    )
