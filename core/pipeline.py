"""Several statements in one client/server round trip: psycopg 3's pipeline mode on Django's
connection.

    with connection.cursor() as a, connection.cursor() as b:
        with one_round_trip():
            a.execute(...)   # sent, not waited for
            b.execute(...)
        row = b.fetchone()   # the results arrived when the block ended

The server runs the statements one after the other, in order, each with its own snapshot (READ
COMMITTED), exactly as if they were sent one by one; only the waiting between them is gone. The
block ends with one Sync and waits for every result. A statement that fails raises at the end
of the block, as Django's DatabaseError class of its error (``runs.engine.errors.classify`` reads its
SQLSTATE as usual); the server skips the statements after it, those before it have run. A
cursor's results are those of the last statement it executed.

Only plain cursor statements inside: the ORM reads results (``rowcount``, returned ids) as soon
as it executes. psycopg sends the ``BEGIN`` that opens a transaction in a round trip of its own
before the transaction's first statement, inside a pipeline or not. Without pipeline support in
the libpq psycopg runs on (before 14), the statements are sent one by one, with the same results
(a failing one raises at once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection


class _PipelineEcho(logging.Filter):
    """psycopg logs a warning ("error ignored exiting/terminating <Pipeline>: pipeline
    aborted") each time a pipeline ends on a statement's failure: the failure itself reaches
    the caller, who records it (a failed chunk: one line, ``runs.engine.worker``); the echo is
    dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("error ignored ") and "pipeline aborted" in text)


logging.getLogger("psycopg").addFilter(_PipelineEcho())


@contextmanager
def one_round_trip() -> Iterator[None]:
    connection.ensure_connection()
    if not psycopg.Pipeline.is_supported():
        with connection.wrap_database_errors:
            yield
        return
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield
