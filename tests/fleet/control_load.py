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
    ``SETTLE_S`` into the first read are left from before (another thread's idle connection, an
    earlier test's sampler or background read): with ``end_lingering`` (a test) they are ended
    then, since what they commit meanwhile would count as the measured work's whatever it does;
    otherwise (a bench beside its own server) they are left alone. This counter's own
    statements are counted and subtracted; its session flushes them just before each reading of
    the total (``pg_stat_force_next_flush``), so none of them is in one reading and not in the
    next."""

    def __init__(self, *, end_lingering: bool = True) -> None:
        self.end_lingering = end_lingering
        params = dict(connection.get_connection_params())
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        params["application_name"] = "test-control-load"
        self.conn = psycopg.connect(**params, autocommit=True)
        self.own = 0  # this session's statements (each its own transaction) so far
        self.before: set[int] | None = None  # the sessions left alone

    def _execute(self, query: str, params=None):
        self.own += 1
        return self.conn.execute(query, params)

    def read(self, *, timeout: float = 60) -> int:
        start = time.monotonic()
        while True:
            others = set(self._execute(OTHERS).fetchone()[0]) - (self.before or set())
            if not others:
                break
            if self.before is None and time.monotonic() - start > SETTLE_S:
                if not self.end_lingering:
                    self.before = others
                    break
                self._execute(
                    "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [list(others)]
                )
                self.before = set()  # and wait for them to end
            if time.monotonic() - start > timeout:
                raise AssertionError(f"sessions {others} still on the control database")
            time.sleep(0.05)
        if self.before is None:
            self.before = set()
        self._execute("SELECT pg_stat_force_next_flush()")  # flushed as it goes idle
        total = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()[0]
        counted = self.own  # every statement before this one, flushed
        self.own += 1
        return total - counted

    def close(self) -> None:
        self.conn.close()
