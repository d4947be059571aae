"""Statement and lock timeouts for work that runs inside a django-q2 task.

django-q2 enforces its task timeout with ``TimeoutException``, a ``SystemExit``: no
``except Exception`` sees it and the whole transaction in progress is lost. So every
statement of a periodic task is bounded by a PostgreSQL timeout well inside the task
timeout, and a statement that hits it fails as an ordinary ``DatabaseError``.
"""

from __future__ import annotations

from contextlib import contextmanager

from django.conf import settings
from django.db import connection


def task_timeout_s() -> float:
    return float(settings.Q_CLUSTER["timeout"])


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
