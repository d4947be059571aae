"""The control database's transactions as its server counts them (``pg_stat_database``), for
the tests and ``bench/fleet.py``: what a drain costs the control database, by count."""

from __future__ import annotations

import time

import psycopg
from django.db import connection

OTHERS = (
    "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)
SETTLE_S = 5.0  # a session that lingers this long at the first read was there before


class ControlTransactions:
    """``xact_commit + xact_rollback`` of the control database, less this counter's own.

    A session's counts reach ``pg_stat_database`` when it ends (or idles a while), so ``read``
    waits until every session that was not there at the first read has ended: close this
    process's own first (``django.db.connections.close_all``). Sessions still there
    ``SETTLE_S`` into the first read (another thread's idle connection) are left alone. This
    counter's session flushes its own counts before each read (``pg_stat_force_next_flush``)
    and subtracts them."""

    def __init__(self) -> None:
        params = dict(connection.get_connection_params())
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        params["application_name"] = "test-control-load"
        self.conn = psycopg.connect(**params, autocommit=True)
        self.own = 0  # this session's transactions flushed so far
        self.unflushed = 0  # and since its last flush
        self.before: set[int] | None = None  # the sessions left alone

    def read(self, *, timeout: float = 60) -> int:
        self.conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as it goes idle
        self.own += self.unflushed + 1
        self.unflushed = 0
        start = time.monotonic()
        while True:
            self.unflushed += 1
            others = set(self.conn.execute(OTHERS).fetchone()[0]) - (self.before or set())
            if not others:
                break
            if self.before is None and time.monotonic() - start > SETTLE_S:
                self.before = others
                break
            if time.monotonic() - start > timeout:
                raise AssertionError(f"sessions {others} still on the control database")
            time.sleep(0.05)
        if self.before is None:
            self.before = set()
        self.unflushed += 1
        total = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()[0]
        return total - self.own

    def close(self) -> None:
        self.conn.close()
