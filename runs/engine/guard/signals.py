"""Reading the signals: one round of catalog queries per sample (``read_signals``), the samples
themselves (``sample``: one sampler at a time for the pool), the probe's window and its idle
baseline."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import locks, timeouts
from runs.engine import prometheus
from runs.engine.guard.common import (
    BASELINE_MAX_SAMPLES,
    BASELINE_MIN_SAMPLES,
    BASELINE_WINDOW_S,
    CONFLICTING_MODES,
    IDLE_PROBE_GAP_S,
    IDLE_PROBES,
    WINDOW_S,
    _pct,
    _rows,
    _since_last_chunk_s,
    _targets,
)
from runs.engine.guard.limit import (
    limit_of,
)
from runs.engine.guard.probe import (
    IDLE_PROBES_BUDGET_S,
    PROBE_TIMEOUT_MS,
    _between,
    _probe,
    _probe_ms,
    pinned_probe_ms,
)
from runs.models import GuardSample

log = logging.getLogger(__name__)


def _table_signals(oid: int) -> tuple:
    """(in_flight, lock_waits, conflicting_locks, autovacuum_running) of a target, read by
    the SECURITY DEFINER function ``guard_table_signals`` (database/migrations): aggregates of
    other sessions' locks, never their statements. ``in_flight``: work of the product is in
    flight on the table — another of its sessions holds a lock on it: a chunk's DELETE, the
    planner's reads of a window, the verification's count."""
    return _rows(
        "SELECT * FROM guard_table_signals(%s::oid::regclass, %s)", [oid, list(CONFLICTING_MODES)]
    )[0]


def _in_flight(oid: int) -> bool:
    return bool(_table_signals(oid)[0])


def _idle_probes(spec, oid: int, count: int, slugs: list[str]) -> list[float]:
    """``count`` more probes of a table that has no idle baseline yet, taken now while nothing
    is in flight on it (none if a chunk of ``slugs`` ran meanwhile): a run's first sample
    learns the baseline at once instead of draining on absolute thresholds for its first
    minutes, and a quiet window of the controller learns it anew."""
    probes = []
    t0 = time.monotonic()
    for _ in range(count):
        time.sleep(IDLE_PROBE_GAP_S)
        value = _probe_ms(spec)
        if (
            value is None
            or value >= PROBE_TIMEOUT_MS
            or time.monotonic() - t0 > IDLE_PROBES_BUDGET_S
        ):
            return []  # no idle reading from a probe that failed, timed out or ran long
        probes.append(round(value, 3))
    if _in_flight(oid):
        return []
    since = _since_last_chunk_s(slugs)
    if since is not None and since < time.monotonic() - t0:
        return []  # a chunk started and committed while they were taken
    return probes


def read_signals(specs: list | None = None) -> tuple[dict, dict]:
    """Measure instance-wide and per-target signals now (one round of catalog queries) on the
    tables of ``specs`` (default: those of the runs draining now)."""
    values: dict = {}
    # other sessions, as aggregates (database/migrations: guard_instance_signals)
    (
        values["connections_used"],
        values["max_connections"],
        values["lock_waits"],
        lag_s,
        lag_bytes,
        values["replicas"],
    ) = _rows("SELECT * FROM guard_instance_signals()")[0]
    pinned = pinned_probe_ms() is not None
    if pinned:  # what other sessions of the server do reads as calm (settings.py)
        values["connections_used"], values["lock_waits"], lag_s, lag_bytes = 1, 0, 0, 0
    values["connections_free"] = values["max_connections"] - values["connections_used"]
    values["replication_lag_s"], values["replication_lag_bytes"] = float(lag_s), int(lag_bytes)
    wal = _wal()
    values["wal_bytes"] = wal.pop("wal_bytes")
    if not pinned:  # pinned, the server's WAL fsyncs and the host's I/O read as calm too
        values.update(wal)
        io_us = _io_pressure_us()
        if io_us is not None:
            values["io_some_us"] = io_us
    if connection.pg_version >= 170000:
        values["checkpoints_requested"] = _rows("SELECT num_requested FROM pg_stat_checkpointer")[
            0
        ][0]
    else:
        values["checkpoints_requested"] = _rows("SELECT checkpoints_req FROM pg_stat_bgwriter")[0][
            0
        ]

    tables: dict = {}
    specs = specs if specs is not None else _targets()
    slugs: dict[str, list[str]] = {}
    for spec in specs:
        slugs.setdefault(spec.qualified_table, []).append(spec.slug)
    gap_s = float(settings.RETENTION["GUARD_IDLE_GAP_MS"]) / 1000
    for spec in {s.qualified_table: s for s in specs}.values():
        oid_rows = _rows("SELECT to_regclass(%s)::oid", [f'"{spec.schema}"."{spec.table}"'])
        oid = oid_rows[0][0] if oid_rows else None
        if oid is None:
            continue
        probe = _probe(spec)
        info: dict = {"probe_ms": probe[0] if probe else None}
        if probe:
            info["probe_read_ms"] = round(probe[1], 3)
        between = _between.pop(spec.qualified_table, None)
        if between:
            # this process's sampler thread's probes since its last sample: [ms, in flight]
            info["probes"] = between
        in_flight, lock_waits, conflicting, autovacuum = _table_signals(oid)
        # a chunk transaction of the product in flight on the target: this sample's probe is
        # not an idle reading
        info["in_flight"] = bool(in_flight)
        since = None
        if not info["in_flight"] and info["probe_ms"] is not None and gap_s > 0:
            since = _since_last_chunk_s(slugs[spec.qualified_table])
        if since is not None and since < gap_s:
            # nothing in flight, but a chunk has just committed: the CPU it leaves behind (its
            # WAL, the next chunk's plan) is the run's own load, not the foreground's idle
            info["not_baseline"] = f"a chunk committed {since:.2f} s before"
        elif not info["in_flight"] and info["probe_ms"] is not None:
            baseline = idle_baseline(spec.qualified_table)
            if baseline["n"] < BASELINE_MIN_SAMPLES:
                probes = _idle_probes(spec, oid, IDLE_PROBES, slugs[spec.qualified_table])
                if probes:
                    info["idle_probes_ms"] = probes
                    # the sample's own probe may be the session's first read of the table
                    # (catalog and plan caches cold): the idle probes that follow are the
                    # baseline, so one cold reading does not lift it for its whole window
                    info["not_baseline"] = "first probe"
            elif baseline["p50"] is not None and info["probe_ms"] > limit_of(spec).relative_ms(
                baseline["p50"]
            ):
                # the foreground is slow with nothing of ours in flight: pressure, not a new
                # normal — kept out of the baseline, which the controller judges against (an
                # inflation that outlasts the baseline window is learnt anew, by idle probes).
                # Judged against the idle median, not a tail percentile: a tail of a few
                # readings would let each admitted reading lift the next one's limit.
                info["not_baseline"] = "over budget"
        info["lock_waits"] = lock_waits
        info["conflicting_locks"] = list(conflicting)
        live, dead = _rows(
            "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relid = %s", [oid]
        )[0]
        if pinned:
            dead, autovacuum = 0, False
        info["dead_tuples"] = dead
        info["dead_tuple_ratio"] = round(dead / max(1, live + dead), 4)
        info["autovacuum_running"] = bool(autovacuum)
        tables[spec.qualified_table] = info
    return values, tables


def _wal() -> dict:
    """The server's WAL so far, in one statement: its bytes, its fsyncs and the milliseconds
    they took (``wal_syncs``, ``wal_sync_ms``) — ``pg_stat_wal`` up to PostgreSQL 17,
    ``pg_stat_io``'s WAL rows from 18, where those columns moved. The times are counted only
    with ``track_wal_io_timing`` on (``wal_io_timing``); without it the guard has no fsync time
    to judge."""
    if connection.pg_version >= 180000:
        query = (
            "SELECT w.wal_bytes, io.fsyncs, io.fsync_time,"
            " current_setting('track_wal_io_timing') FROM pg_stat_wal w,"
            " (SELECT coalesce(sum(fsyncs), 0) AS fsyncs, coalesce(sum(fsync_time), 0)"
            "  AS fsync_time FROM pg_stat_io WHERE object = 'wal') io"
        )
    else:
        query = (
            "SELECT wal_bytes, wal_sync, wal_sync_time, current_setting('track_wal_io_timing')"
            " FROM pg_stat_wal"
        )
    wal_bytes, syncs, ms, timing = _rows(query)[0]
    return {
        "wal_bytes": int(wal_bytes),
        "wal_syncs": int(syncs),
        "wal_sync_ms": float(ms),
        "wal_io_timing": timing == "on",
    }


PRESSURE_IO = "/proc/pressure/io"


def _database_on_this_host() -> bool:
    """Whether the database server shares this host: a Unix socket or a loopback address."""
    host = str(connection.settings_dict.get("HOST") or "")
    return host == "" or host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")


def _io_pressure_us() -> int | None:
    """The host's I/O pressure so far: the microseconds in which some task waited on I/O
    (``some … total=`` of ``/proc/pressure/io``), when the database shares this host
    (``RETENTION_GUARD_IO_PRESSURE_SOURCE``: auto, on, off) and the kernel has PSI."""
    source = settings.RETENTION.get("GUARD_IO_PRESSURE_SOURCE", "auto")
    if source == "off" or (source == "auto" and not _database_on_this_host()):
        return None
    try:
        with open(PRESSURE_IO) as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _io_rates(values: dict, before: dict, dt: float) -> dict:
    """The I/O signals over the interval since the sample ``before``: the share of wall time
    some task waited on I/O (``io_pressure``) and the average WAL fsync in ms
    (``wal_fsync_ms``; 0 with no fsync in the interval, absent without the timing)."""
    out: dict = {}
    if values.get("io_some_us") is not None and before.get("io_some_us") is not None:
        waited = max(0, values["io_some_us"] - before["io_some_us"]) / 1e6
        out["io_pressure"] = round(min(1.0, waited / dt), 4)
    if values.get("wal_io_timing") and "wal_syncs" in before:
        syncs = values["wal_syncs"] - before["wal_syncs"]
        spent = values["wal_sync_ms"] - before.get("wal_sync_ms", 0.0)
        out["wal_fsync_ms"] = round(spent / syncs, 3) if syncs > 0 else 0.0
    return out


SAMPLER_WAIT_S = 2.0  # the longest a worker waits for another's sample when it has none recent


def sample(*, force: bool = False, by: str = "admission") -> GuardSample | None:
    """Take a sample if the latest is older than ``RETENTION_GUARD_SAMPLE_MS`` and no one else
    is sampling; return the latest. While another session samples, the latest is returned if
    it is recent (two intervals); otherwise — a run starting after a quiet spell, whose first
    sample takes its idle probes — the sample being taken is waited for, so that no chunk is
    admitted on a reading from before the run and in flight during those probes (the wait is
    bounded: after ``SAMPLER_WAIT_S`` the latest sample, or none, is judged). ``by``: who
    takes it, kept in the sample (``values["taken_by"]``): "sampler" (the thread beside the
    chunks), "admission" (a worker before its next chunk) or "lease" (a lease's first)."""
    fresh_s = settings.RETENTION["GUARD_SAMPLE_MS"] / 1000
    if by != "sampler":  # a worker's: the sampler thread's sample, when recent, is taken
        fresh_s = admission_fresh_s()
    latest = GuardSample.objects.order_by("-taken_at").first()
    if (
        not force
        and latest is not None
        and (timezone.now() - latest.taken_at).total_seconds() < fresh_s
    ):
        return latest
    taken = _take_sample(force, fresh_s, by)
    if taken is not _BUSY_SAMPLER:
        return taken
    if latest is not None and (timezone.now() - latest.taken_at).total_seconds() < 2 * fresh_s:
        return latest
    timeouts.wait_for_lock(SAMPLER_WAIT_S, lambda: locks.xact_lock(locks.SAMPLER, 0))
    return GuardSample.objects.order_by("-taken_at").first()


_BUSY_SAMPLER = object()  # another session holds the sampler's lock


def admission_fresh_s() -> float:
    """How old a sample an admission (or a lease's first look) judges by before it takes one
    itself: a sample interval without the sampler thread; with it, two — the thread samples
    every interval and carries the probes it took between samples in its own, which a worker
    whose admission took the sample first would lose (with two workers, most of them: a short
    run's controller then judged eight readings in three seconds instead of thirty). The
    admission steps in when the thread is late (a process that stopped draining, a thread
    standing by)."""
    cfg = settings.RETENTION
    fresh_s = cfg["GUARD_SAMPLE_MS"] / 1000
    if cfg.get("GUARD_SAMPLER_THREAD", True):
        return 2 * fresh_s
    return fresh_s


def _take_sample(force: bool, fresh_s: float, by: str):
    with transaction.atomic():
        if not locks.try_xact_lock(locks.SAMPLER, 0):
            return _BUSY_SAMPLER
        again = GuardSample.objects.order_by("-taken_at").first()
        if (
            not force
            and again is not None
            and (timezone.now() - again.taken_at).total_seconds() < fresh_s
        ):
            return again
        specs = _targets()
        values, tables = read_signals(specs)
        if again is not None:
            dt = max(0.001, (timezone.now() - again.taken_at).total_seconds())
            values["wal_mb_per_s"] = round(
                max(0, values["wal_bytes"] - again.values.get("wal_bytes", 0)) / dt / 1e6, 3
            )
            values.update(_io_rates(values, again.values, dt))
        readings = _read_prometheus(specs, again)
        if readings:
            values["prometheus"] = readings
        values["taken_by"] = by
        return GuardSample.objects.create(values=values, tables=tables)


def _read_prometheus(specs: list, previous: GuardSample | None) -> dict:
    """Each Prometheus source of the draining policies, asked once: ``{key: {"url", "query",
    "ok", "value", "error", "failing_since"}}``. ``failing_since`` (ISO time) is carried over
    from the previous sample while the source keeps giving no answer."""
    sources = {s.key: s for s in map(prometheus.source_of, specs) if s is not None}
    before = (previous.values.get("prometheus") or {}) if previous is not None else {}
    out = {}
    for key, source in sources.items():
        entry: dict = {"url": source.url, "query": source.query}
        try:
            entry.update(ok=True, value=prometheus.query(source))
        except prometheus.NoAnswer as exc:
            last = before.get(key) or {}
            since = last.get("failing_since") if not last.get("ok", True) else None
            entry.update(
                ok=False,
                value=None,
                error=str(exc)[:300],
                failing_since=since or timezone.now().isoformat(),
            )
        out[key] = entry
    return out


def probe_percentiles(table: str, *, now=None) -> dict:
    """p50/p95/p99 of the probe latency over the sliding window."""
    return probe_windows([table], now=now)[table]


def probe_windows(tables, *, now=None) -> dict[str, dict]:
    """``probe_percentiles`` of each of ``tables`` from one read of the window's samples, which
    extracts only their probe values (not every table's signals)."""
    now = now or timezone.now()
    tables = list(dict.fromkeys(tables))
    values: dict[str, list[float]] = {t: [] for t in tables}
    reads: dict[str, list[float]] = {t: [] for t in tables}
    if tables:
        for table, v, read in _rows(
            "SELECT t.name, (s.tables -> t.name ->> 'probe_ms')::float8,"
            " coalesce(s.tables -> t.name ->> 'probe_read_ms', s.tables -> t.name ->> 'probe_ms')"
            "::float8 FROM runs_guardsample s, unnest(%s::text[]) AS t(name)"
            " WHERE s.taken_at >= %s AND s.tables -> t.name ->> 'probe_ms' IS NOT NULL",
            [tables, now - timedelta(seconds=WINDOW_S)],
        ):
            values[table].append(v)
            reads[table].append(read)
    out = {}
    for table, found in values.items():
        found.sort()
        read = sorted(reads[table])
        out[table] = (
            {
                "p50": _pct(found, 0.50),
                "p95": _pct(found, 0.95),
                "p99": _pct(found, 0.99),
                "n": len(found),
                "read_p95": _pct(read, 0.95),
            }
            if found
            else {}
        )
    return out


def idle_baseline(table: str, *, now=None, rank: float | None = None) -> dict:
    """The probe's idle baseline on ``table``: p95 of the probe over the samples of the last
    ``BASELINE_WINDOW_S`` taken while no chunk transaction of the product was in flight on it
    (with the idle probes a first sample took, ``idle_probes_ms``), but not the probes a sample
    marked ``not_baseline`` (over the budget of the idle median, or a cold first probe before
    idle probes). ``{"p50", "p95", "p99": ms | None, "n": idle probes}``, and ``"at_rank"``:
    the percentile ``rank`` when asked; no percentile under ``BASELINE_MIN_SAMPLES``."""
    now = now or timezone.now()
    values = sorted(
        v
        for (v,) in _rows(
            "SELECT p.v FROM runs_guardsample s,"
            " LATERAL (SELECT (s.tables -> %s ->> 'probe_ms')::float8 AS v, 0 AS n"
            "  WHERE s.tables -> %s ->> 'not_baseline' IS NULL"
            "  UNION ALL SELECT e.v::float8, e.n"
            "  FROM jsonb_array_elements_text(coalesce(s.tables -> %s -> 'idle_probes_ms', '[]'))"
            "  WITH ORDINALITY AS e(v, n)) AS p"
            " WHERE s.taken_at >= %s AND s.tables -> %s ->> 'in_flight' = 'false'"
            " AND p.v IS NOT NULL ORDER BY s.taken_at DESC, p.n LIMIT %s",
            [
                table,
                table,
                table,
                now - timedelta(seconds=BASELINE_WINDOW_S),
                table,
                BASELINE_MAX_SAMPLES,
            ],
        )
    )
    if len(values) < BASELINE_MIN_SAMPLES:
        return {"p50": None, "p95": None, "p99": None, "n": len(values), "at_rank": None}
    return {
        "p50": _pct(values, 0.50),
        "p95": _pct(values, 0.95),
        "p99": _pct(values, 0.99),
        "n": len(values),
        "at_rank": _pct(values, rank) if rank is not None else None,
    }


def latest_sample():
    return GuardSample.objects.order_by("-taken_at").first()
