"""The foreground probe: the read and the durable commit of a foreground request, timed, on a
session of its own per thread (``_probe_connection``, the one place that opens it)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from runs.engine.errors import sqlstate_of
from runs.engine.guard.common import (
    _rows,
)
from targets import connections as fleet_connections

log = logging.getLogger(__name__)


PROBE_TIMEOUT_MS = 1000  # each of the probe's two statements; a probe that times out reads this
PROBE_SESSION_MAX_AGE_S = 60.0  # the probe's session is opened anew after this (a failover)
IDLE_PROBES_BUDGET_S = 1.0  # the idle probes of one sample stop after this
_probe_session = threading.local()  # each thread's connection for the probe


def _probe_connection() -> psycopg.Connection:
    """This thread's connection for the probe's commit: a session of its own (its transaction
    commits by itself, not inside the sampler's), with synchronous commit on whatever the
    product's sessions use, and marked as the product's (``retention:…``) so that the guard
    never counts it as foreground. Opened anew after an error and once a minute (a failover,
    a restart); TCP keepalives and a user timeout bound a dead network path to seconds, and
    the server's statement timeout a slow commit."""
    conn = getattr(_probe_session, "conn", None)
    opened = getattr(_probe_session, "opened", 0.0)
    here = fleet_connections.current()
    if conn is not None and (
        time.monotonic() - opened > PROBE_SESSION_MAX_AGE_S
        or getattr(_probe_session, "target", None) != here
    ):  # a minute old, or opened on another target than the one this thread is on now
        close_probe_connection()
        conn = None
    if conn is None or conn.closed or conn.broken:
        params = {
            k: v
            for k, v in connection.get_connection_params().items()
            if k not in ("cursor_factory", "context", "prepare_threshold", "autocommit")
        }
        params["application_name"] = "retention:guard-probe"
        for key, value in (
            ("connect_timeout", 2),
            ("keepalives", 1),
            ("keepalives_idle", 5),
            ("keepalives_interval", 2),
            ("keepalives_count", 2),
            ("tcp_user_timeout", 5000),
        ):
            params.setdefault(key, value)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"SET statement_timeout = {PROBE_TIMEOUT_MS}")
        conn.execute("SET synchronous_commit = on")
        _probe_session.conn, _probe_session.opened = conn, time.monotonic()
        _probe_session.target = here
    return conn


def close_probe_connection() -> None:
    """Close this thread's probe connection (a test's end, so that no session outlives it)."""
    conn = getattr(_probe_session, "conn", None)
    if conn is not None:
        conn.close()
        _probe_session.conn = None


def pinned_probe_ms() -> float | None:
    """The probe's pinned reading (``RETENTION_GUARD_PINNED_PROBE_MS``), None when it measures."""
    value = settings.RETENTION.get("GUARD_PINNED_PROBE_MS")
    return None if value is None else float(value)


def _probe_ms(spec) -> float | None:
    """The probe's time (``_probe``), None without one."""
    probe = _probe(spec)
    return None if probe is None else probe[0]


def _probe(spec) -> tuple[float, float] | None:
    """The default foreground probe, (its time, its read's time) in ms: read the newest row of
    the target by its key index (the hot end of the table, where foreground traffic lives),
    then commit a WAL record durably in a session of its own (a transactional logical message,
    no table written) — the read and the durable commit of a foreground request, timed
    together. Cleanup slows the second most: each chunk's WAL is written and flushed before a
    foreground commit behind it can be. The absolute thresholds (``probe_p95_ms``) judge the
    read, as the read alone was judged before: a commit's latency depends on the storage, and
    on a busy server fsync alone passes 25 ms; the baseline, the relative limit and the
    controller judge both, against the idle readings of the same server."""
    if spec.probe == "none":
        return None
    pinned = pinned_probe_ms()
    if pinned is not None:
        return pinned, pinned
    query = sql.SQL("SELECT 1 FROM {s}.{t} ORDER BY {k} LIMIT 1").format(
        k=sql.SQL(", ").join(
            sql.SQL("{} DESC").format(sql.Identifier(c)) for c in spec.key_columns
        ),
        s=sql.Identifier(spec.schema),
        t=sql.Identifier(spec.table),
    )
    timeout = float(PROBE_TIMEOUT_MS)  # a probe that times out reads as slow as its timeout
    t0 = time.perf_counter()
    try:
        with transaction.atomic():
            _rows("SELECT set_config('statement_timeout', %s, true)", [f"{PROBE_TIMEOUT_MS}ms"])
            _rows(query)
    except DatabaseError as exc:
        if sqlstate_of(exc) == "57014":  # query_canceled: the statement timeout
            return timeout, timeout
        log.warning("the guard's probe of %s could not read: %s", spec.qualified_table, exc)
        return None
    read_ms = (time.perf_counter() - t0) * 1000
    try:
        conn = _probe_connection()
        t1 = time.perf_counter()
        with conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, 'retention-runner-probe', '')")
        return read_ms + (time.perf_counter() - t1) * 1000, read_ms
    except psycopg.errors.QueryCanceled:
        return read_ms + timeout, read_ms
    except psycopg.Error as exc:
        # no reading rather than a made-up one (a lost session, a login that may not commit
        # the message): a 1000 ms reading would pass for pressure, or be learnt as the idle
        # baseline; the next probe opens the session anew
        close_probe_connection()
        log.warning("the guard's probe could not commit: %s", exc)
        return None


# the probes this process's sampler thread took since its last sample, per table: [[ms, in
# flight], …] — written into the next sample this process takes (``read_signals``)
_between: dict[str, list] = {}
