"""The admission guard: may a chunk start now, and if not, why?

Signals are measured from PostgreSQL itself by one sampler at a time (advisory
lock) and stored as ``GuardSample`` rows; workers read the latest sample
instead of each querying the catalog. Each signal has a per-policy threshold
(``[guard]`` in the policy), and a higher "critical" threshold at which the
policy is paused and an alert raised instead of just deferring the chunk.

The foreground probe is also judged against its own idle baseline (the p95 of the samples
taken while no chunk transaction of the product was in flight on the target), so CPU
contention that lifts a 1 ms probe to 10 ms counts even under the absolute threshold. That
relative pressure paces rather than stops: chunk transactions may fill at most the duty cycle
of recent wall time (docs/guard.md).

The latency controller (``control_step``) closes the loop: every period it compares the probe's
p99 since its last step with the idle baseline's p99 against the policy's inflation budget and
moves the knobs that cause the inflation — how many chunk transactions of the policy run at
once, the chunk's target duration and the duty cycle — down by half when over the budget and
a step back up towards the policy's own settings when under it (AIMD). Its state is a row per
policy (``GuardControl``, stepped under its row lock by whichever worker finds it due) and
each step is kept (``GuardControlStep``).

An external signal, a Prometheus query (runs.engine.prometheus), is read by the sampler
with the built-in signals and judged like them; no answer is pressure after a grace period.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, F, Max, Q
from django.utils import timezone
from psycopg import sql

from core import locks, timeouts
from retention import actions as policy_actions
from runs.engine import prometheus
from runs.engine.errors import sqlstate_of
from runs.models import GuardControl, GuardControlStep, GuardSample, Run

log = logging.getLogger(__name__)

IDLE_PROBE_GAP_S = 0.01  # between the probes a sample takes to learn an idle baseline
IDLE_PROBES = 10  # how many: the baseline's p99 is then not one reading's
WINDOW_S = 30.0  # sliding window for probe percentiles
BASELINE_WINDOW_S = 600.0  # idle samples of the last ten minutes make the probe's baseline
BASELINE_MIN_SAMPLES = 5  # fewer idle samples: no baseline, only the absolute threshold
BASELINE_MAX_SAMPLES = 200  # the most recent idle samples at most
# The product tells its own sessions from foreground traffic by application_name "retention:…"
# (config/settings.py); the guard's functions (database/migrations) count the others.
CONFLICTING_MODES = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str = ""
    critical: bool = False
    signals: dict = field(default_factory=dict)
    # the only pressure is the probe over its idle baseline: admission applies the duty cycle
    paced: bool = False
    # the latency controller's settings for the policy (None: not controlled, the policy's own)
    concurrency: int | None = None
    duty_cycle: float | None = None


ADMIT = Verdict(True)
UNREAD = object()  # an argument the caller did not read for us
_last_verdict: dict = {}  # the verdict for the latest sample, per process
# the controller's chunk target per policy as this process's last admission read it
_chunk_ms: dict[int, int] = {}
# policies whose duty cycle the controller had lowered at this process's last admission: their
# next admission reads the busy seconds in its one statement
_lowered: dict[int, bool] = {}


def forget_readings() -> None:
    """Drop what this process remembers of its last admissions (the verdict, the controller's
    chunk target and lowered duty cycles per policy): its next admission reads them afresh."""
    _last_verdict.clear()
    _chunk_ms.clear()
    _lowered.clear()


def budget_of(spec) -> float:
    """The policy's inflation budget: how many times its idle value the probe may read while
    its chunks run (``guard.inflation_budget``, else ``RETENTION_GUARD_PROBE_RATIO_PCT``)."""
    if spec.inflation_budget is not None:
        return float(spec.inflation_budget)
    return float(settings.RETENTION["GUARD_PROBE_RATIO"])


def _limit(base: float, budget: float) -> float:
    """The probe's limit over an idle value: the budget's multiple, and at least the margin
    above it (``RETENTION_GUARD_PROBE_MARGIN_MS``: sub-millisecond jitter is no pressure)."""
    return max(base * budget, base + float(settings.RETENTION["GUARD_PROBE_MARGIN_MS"]))


def _rows(query, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        if isinstance(query, sql.Composable):
            query = query.as_string(cur.connection)
        cur.execute(query, list(params))
        return cur.fetchall()


def _targets() -> list:
    """Specs of the runs that are draining now, one per policy (their tables are what we
    watch)."""
    specs = {}
    for run in Run.objects.filter(state=Run.State.ACTIVE).select_related("policy_version"):
        spec = run.policy_version.parsed
        specs[spec.slug] = spec
    return list(specs.values())


def _since_last_chunk_s(slugs: list[str]) -> float | None:
    """Seconds since the last chunk of these policies committed (its audit row's time, the
    database's clock), None when none ever did: one backward step of ``audit_policy_time``
    per policy."""
    return _rows(
        "SELECT extract(epoch FROM clock_timestamp() - max(last.committed_at))::float8"
        " FROM unnest(%s::text[]) AS p(slug), LATERAL (SELECT committed_at FROM runs_auditrecord"
        "  WHERE policy_slug = p.slug ORDER BY committed_at DESC LIMIT 1) AS last",
        [slugs],
    )[0][0]


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
    if conn is not None and time.monotonic() - opened > PROBE_SESSION_MAX_AGE_S:
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
    return conn


def close_probe_connection() -> None:
    """Close this thread's probe connection (a test's end, so that no session outlives it)."""
    conn = getattr(_probe_session, "conn", None)
    if conn is not None:
        conn.close()
        _probe_session.conn = None


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
    values["connections_free"] = values["max_connections"] - values["connections_used"]
    values["replication_lag_s"], values["replication_lag_bytes"] = float(lag_s), int(lag_bytes)
    values["wal_bytes"] = int(_rows("SELECT wal_bytes FROM pg_stat_wal")[0][0])
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
            elif baseline["p50"] is not None and info["probe_ms"] > _limit(
                baseline["p50"], budget_of(spec)
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
        info["dead_tuples"] = dead
        info["dead_tuple_ratio"] = round(dead / max(1, live + dead), 4)
        info["autovacuum_running"] = bool(autovacuum)
        tables[spec.qualified_table] = info
    return values, tables


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


# -- the sampler beside the chunks -------------------------------------------------------

SAMPLER_LINGER_S = 5.0  # a process samples this long after its last drain loop asked it to

_beside_lock = threading.Lock()
_beside: dict = {"thread": None, "until": 0.0, "stop": threading.Event()}
# the probes this process's sampler thread took since its last sample, per table: [[ms, in
# flight], …] — written into the next sample this process takes (``read_signals``)
_between: dict[str, list] = {}


def sample_beside(linger_s: float = SAMPLER_LINGER_S) -> None:
    """Keep a sampler thread in this process, on a connection of its own, for the next
    ``linger_s`` (``SAMPLER_LINGER_S``; a worker pausing longer under the duty cycle asks for
    its pause and that): each drain loop's turn calls this, so the thread lives as long as the
    process drains and a few seconds more. One such thread in the pool — the first to
    take the session lock ``locks.PROBER`` — takes the guard's samples every
    ``GUARD_SAMPLE_MS`` and probes the foreground between them every ``GUARD_PROBE_MS``; the
    threads of other processes stand by to take over when its process stops draining.

    A worker's own admission takes a sample between its chunks, never during one: with one
    chunk transaction at a time (the controller's floor) no probe would ever meet a chunk in
    flight, and the controller would read a foreground its chunks slow as idle. The thread's
    probes land wherever the foreground's requests land — in a chunk as often as the chunks
    fill the time — and the admission samples only when it finds no recent sample."""
    cfg = settings.RETENTION
    if not cfg.get("GUARD", True) or not cfg.get("GUARD_SAMPLER_THREAD", True):
        return
    with _beside_lock:
        _beside["until"] = max(_beside["until"], time.monotonic() + linger_s)
        if _beside["thread"] is not None:
            return
        stop = _beside["stop"] = threading.Event()
        thread = threading.Thread(
            target=_sample_beside, args=(stop,), name="guard-sampler", daemon=True
        )
        _beside["thread"] = thread
    thread.start()


def _probe_between(specs: list) -> bool:
    """One probe of each controlled target between two samples, kept for this process's next
    sample (``probes``: [ms, epoch seconds]): the controller judges a period by a few dozen
    readings rather than the four its samples take — the highest of four follows the
    foreground's typical request, not the tail that its p99 is. One thread in the pool does
    this (``locks.PROBER``). False when a probe gave no reading (the thread then waits for its
    next sample rather than opening a session ten times a second)."""
    ok = True
    for spec in {s.qualified_table: s for s in specs if controlled(s)}.values():
        probe = _probe(spec)
        if probe is None:
            ok = False
            continue
        readings = _between.setdefault(spec.qualified_table, [])
        readings.append([round(probe[0], 3), round(time.time(), 3)])
        del readings[:-200]  # at most the latest 200 while no sample of this process is taken
    return ok


def stop_sampling_beside(timeout_s: float = 5.0) -> None:
    """Stop this process's sampler thread, if any, and wait for it (a test's end)."""
    with _beside_lock:
        thread = _beside["thread"]
        _beside["stop"].set()
    if thread is not None:
        thread.join(timeout_s)


def _backend_pid() -> int | None:
    """The server process of this thread's connection (None: not connected)."""
    raw = connection.connection
    return None if raw is None or raw.closed else raw.info.backend_pid


def _sample_beside(stop: threading.Event) -> None:
    cfg = settings.RETENTION
    every = cfg["GUARD_SAMPLE_MS"] / 1000
    tick = min(every, cfg["GUARD_PROBE_MS"] / 1000)
    sampled = tried = 0.0
    specs: list = []  # the targets of the last sample, probed between samples
    # the session that holds the pool's prober lock (a session lock: a new session after a
    # lost connection holds nothing, and takes it again only if no other thread has)
    prober: int | None = None
    try:
        while True:
            with _beside_lock:
                if stop.is_set() or time.monotonic() >= _beside["until"]:
                    _beside["thread"] = None
                    return
            t0 = time.monotonic()
            try:
                with timeouts.engine_session():
                    if prober is not None and prober != _backend_pid():
                        prober = None
                        _between.clear()
                    if prober is None and t0 - tried >= every:  # standing by: seldom
                        tried = t0
                        if _targets():
                            (got,) = _rows("SELECT pg_try_advisory_lock(%s, 0)", [locks.PROBER])[0]
                            prober = _backend_pid() if got else None
                    if prober is not None and t0 - sampled >= every:
                        # the runs draining now (that this session can see): read once a
                        # sample interval, not at every probe between samples
                        specs, sampled = _targets(), t0
                        if specs:
                            sample(by="sampler")
                    elif prober is not None and specs and not _probe_between(specs):
                        specs = []  # no reading: nothing more until the next sample
            except Exception:  # noqa: BLE001 - the admission samples by itself meanwhile
                log.warning("the guard's sampler thread failed a sample", exc_info=True)
                connection.close()  # the prober's lock goes with the session
                prober, specs = None, []
                _between.clear()
            stop.wait(max(0.005, tick - (time.monotonic() - t0)))
    finally:
        with _beside_lock:
            if _beside["thread"] is threading.current_thread():
                _beside["thread"] = None
        _between.clear()
        close_probe_connection()
        connection.close()  # this thread's own connection


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


def _pct(values: list[float], p: float) -> float:
    """The ``p`` percentile (nearest rank) of sorted ``values``."""
    return round(values[min(len(values) - 1, int(round(p * (len(values) - 1))))], 2)


def _relative_probe(p95, baseline: dict, ratio: float) -> tuple[float | None, str]:
    """The probe's limit from its idle baseline (``ratio``: the policy's inflation budget),
    and the reason when ``p95`` is over it."""
    base = baseline.get("p95")
    if base is None:
        return None, ""
    margin = float(settings.RETENTION["GUARD_PROBE_MARGIN_MS"])
    limit = _limit(base, ratio)
    if p95 is None or p95 <= limit:
        return limit, ""
    how = (
        f"{_fmt(ratio)} × idle baseline {_fmt(base)} ms"
        if base * ratio >= base + margin
        else f"idle baseline {_fmt(base)} ms + {_fmt(margin)} ms"
    )
    return limit, f"probe p95 {_fmt(p95)} ms > {how} (p95 of {baseline['n']} idle samples)"


# Seconds of the policy's chunk transactions (their audit rows' started_at → committed_at)
# inside a window: ``_busy_params``.
_BUSY = (
    "SELECT coalesce(sum(extract(epoch FROM least(committed_at, %s) - greatest(started_at, %s))), 0)"
    " FROM runs_auditrecord WHERE policy_slug = %s AND committed_at > %s AND started_at < %s"
)


def _busy_params(spec, now) -> list:
    since = now - timedelta(seconds=float(settings.RETENTION["GUARD_DUTY_WINDOW_S"]))
    return [now, since, spec.slug, since, now]


def duty_cycle(spec, *, now=None, busy=None) -> float:
    """The share of the last ``GUARD_DUTY_WINDOW_S`` of wall time that the policy's chunk
    transactions filled (their audit rows' ``started_at`` → ``committed_at``, summed over
    workers, so two busy workers make 2.0). ``busy``: those seconds, read already."""
    now = now or timezone.now()
    if busy is None:
        busy = _rows(_BUSY, _busy_params(spec, now))[0][0]
    return max(0.0, float(busy)) / float(settings.RETENTION["GUARD_DUTY_WINDOW_S"])


def _pace(spec, verdict: Verdict, now=None, *, busy=None) -> Verdict:
    """Under relative pressure only: admit while chunk transactions fill less than the duty
    cycle of recent wall time; a duty cycle of 0 makes it a stop like any other signal."""
    cfg = settings.RETENTION
    cap, window = cfg["GUARD_DUTY_CYCLE"], cfg["GUARD_DUTY_WINDOW_S"]
    if cap <= 0:
        return verdict
    if verdict.duty_cycle is not None:  # the controller's setting, under the configured one
        cap = min(cap, verdict.duty_cycle)
    duty = duty_cycle(spec, now=now, busy=busy)
    signals = dict(verdict.signals)
    signals["duty_cycle"] = {"value": round(duty, 4), "threshold": cap, "unit": ""}
    knobs = {"concurrency": verdict.concurrency, "duty_cycle": verdict.duty_cycle}
    if duty < cap:
        return Verdict(True, "", False, signals, paced=True, **knobs)
    reason = (
        f"{verdict.reason + '; ' if verdict.reason else ''}{duty:.1%} of the last {window} s"
        f" in chunk transactions > duty cycle {cap:.0%}"
        + ("" if verdict.reason else " (the latency controller's setting)")
    )
    return Verdict(False, reason, False, signals, paced=True, **knobs)


def pause_after(spec, verdict: Verdict, seconds: float, *, slots: int | None = None) -> float:
    """How long a worker waits after a chunk transaction of ``seconds`` that ``verdict``
    admitted under the duty cycle, so that its chunks fill its share of the wall time (the
    duty cycle over the chunk transactions the verdict allows at once) chunk by chunk: the
    foreground then meets them spread evenly, as often as the duty cycle says, where the
    window's share alone (``_pace``) admits them back to back until the window fills and then
    stops them — a burst at every run's start. ``slots``: the run's own ceiling of chunk
    transactions at once (one for a slice run). 0 when the verdict does not pace."""
    if not verdict.paced or not verdict.admit:
        return 0.0
    cap = float(settings.RETENTION["GUARD_DUTY_CYCLE"])
    if verdict.duty_cycle is not None:
        cap = min(cap, verdict.duty_cycle)
    if cap <= 0:
        return 0.0
    at_once = verdict.concurrency or spec.policy_workers
    share = cap / max(1, min(at_once, slots) if slots else at_once)
    return max(0.0, seconds) * (1 / share - 1) if share < 1 else 0.0


def evaluate(spec, latest: GuardSample | None, *, probes=None) -> Verdict:
    """Compare the latest sample with the policy's thresholds. ``probes``: the probe's window
    (``probe_windows``), read by a caller that evaluates several policies."""
    if latest is None:
        return ADMIT
    g = spec.guard
    v = latest.values
    t = latest.tables.get(spec.qualified_table, {})
    p = probes if probes is not None else probe_percentiles(spec.qualified_table)
    signals = {
        # the absolute thresholds judge the probe's read (``_probe``)
        "probe_p95_ms": (
            p.get("read_p95", p.get("p95")),
            g["probe_p95_ms"],
            g["critical_probe_p95_ms"],
            "ms",
        ),
        "lock_waits": (v.get("lock_waits", 0) + 0, g["lock_waits"], g["critical_lock_waits"], ""),
        "replication_lag_s": (
            v.get("replication_lag_s", 0.0),
            g["replication_lag_s"],
            g["critical_replication_lag_s"],
            "s",
        ),
        "dead_tuple_ratio": (t.get("dead_tuple_ratio"), g["dead_tuple_ratio"], None, ""),
        "wal_mb_per_s": (v.get("wal_mb_per_s"), g["wal_mb_per_s"], None, "MB/s"),
    }
    baseline = idle_baseline(spec.qualified_table) if p.get("p95") is not None else {"p95": None}
    relative_limit, relative = _relative_probe(p.get("p95"), baseline, budget_of(spec))
    reasons, critical = [], False
    conflicting = t.get("conflicting_locks") or []
    if conflicting:
        reasons.append(f"lock held on {spec.qualified_table}: {conflicting[0]}")
    if t.get("lock_waits"):
        reasons.append(f"{t['lock_waits']} session(s) waiting on locks of {spec.qualified_table}")
    for name, (value, limit, crit, unit) in signals.items():
        if value is None or limit is None:
            continue
        if crit is not None and value > crit:
            critical = True
            reasons.append(f"{_label(name)} {_fmt(value)}{unit} > critical {_fmt(crit)}{unit}")
        elif value > limit:
            reasons.append(f"{_label(name)} {_fmt(value)}{unit} > {_fmt(limit)}{unit}")
    free = v.get("connections_free")
    if free is not None and free < g["connections_headroom"]:
        reasons.append(
            f"free connections {free} < reserved headroom {_fmt(g['connections_headroom'])}"
        )
    external = _prometheus_signal(spec, latest)
    if external is not None and external[1]:
        reasons.append(external[1])
    absolute_hit = any(r.startswith(_label("probe_p95_ms") + " ") for r in reasons)
    shown = {name: {"value": s[0], "threshold": s[1], "unit": s[3]} for name, s in signals.items()}
    shown["probe_baseline_ms"] = {"value": baseline.get("p95"), "threshold": None, "unit": "ms"}
    shown["probe_p95_vs_idle"] = {"value": p.get("p95"), "threshold": relative_limit, "unit": "ms"}
    shown["connections_free"] = {"value": free, "threshold": g["connections_headroom"], "unit": ""}
    shown["autovacuum_running"] = {
        "value": t.get("autovacuum_running"),
        "threshold": None,
        "unit": "",
    }
    if external is not None:
        shown["prometheus"] = external[0]
    if reasons:
        return Verdict(False, "; ".join(reasons), critical, shown)
    if relative and not absolute_hit:
        return Verdict(False, relative, False, shown, paced=True)
    return Verdict(True, "", False, shown)


def _prometheus_signal(spec, latest: GuardSample) -> tuple[dict, str] | None:
    """The policy's Prometheus signal in ``latest``: (shown signal, reason when it is pressure)
    — a value over the threshold, or no answer for longer than the grace period. None when the
    policy has no such signal or the sample has not asked it yet."""
    source = prometheus.source_of(spec)
    if source is None:
        return None
    entry = (latest.values.get("prometheus") or {}).get(source.key)
    if entry is None:
        return None
    shown = {"value": entry.get("value"), "threshold": source.threshold, "unit": ""}
    if entry.get("ok"):
        value = entry.get("value")
        if value is not None and value > source.threshold:
            return shown, (
                f"prometheus {source.query} = {_fmt(float(value))} > {_fmt(source.threshold)}"
            )
        return shown, ""
    since = datetime.fromisoformat(entry["failing_since"])
    silent_s = max(0.0, (latest.taken_at - since).total_seconds())
    shown["error"] = entry.get("error", "")
    if silent_s < source.grace_s:
        return shown, ""  # within the grace period: no answer is not pressure yet
    return shown, (
        f"prometheus at {source.url} gave no answer for {silent_s:.0f} s"
        f" (grace {source.grace_s} s): {entry.get('error', '')}"
    )


def _label(name: str) -> str:
    return {
        "probe_p95_ms": "probe p95",
        "lock_waits": "lock waits",
        "replication_lag_s": "replication lag",
        "dead_tuple_ratio": "dead tuple ratio",
        "wal_mb_per_s": "WAL rate",
    }.get(name, name)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"
    return str(value)


def admission(run, spec, *, now=None) -> Verdict:
    """Decide from the latest shared sample whether ``run`` may start a chunk.
    A critical verdict pauses the policy (with an alert in the operator log); a probe over its
    idle baseline (and nothing else) admits within the duty cycle (``now``: its clock). The
    verdict carries the latency controller's settings for the policy (``concurrency``,
    ``duty_cycle``); a controller step that is due is taken here.

    One small read per chunk: the latest sample's id and time and the controller's row (and,
    while the verdict paces, the policy's busy seconds for the duty cycle, in the same
    statement). The sample itself is read, or taken, only when it is stale or not the one the
    kept verdict was made from."""
    if not settings.RETENTION.get("GUARD", True):
        return ADMIT
    rest = (spec.qualified_table, tuple(sorted(spec.guard.items())), prometheus.source_of(spec))
    kept = next(((k[0], v) for k, v in _last_verdict.items() if k[1:] == rest), None)
    clock = now or timezone.now()
    paced = (kept is not None and kept[1].paced) or _lowered.get(run.policy_id, False)
    head_pk, taken_at, busy, knobs = _head(spec, run.policy_id, clock if paced else None)
    fresh_s = admission_fresh_s()
    if (
        kept is not None
        and head_pk is not None
        and head_pk == kept[0]
        and (timezone.now() - taken_at).total_seconds() < fresh_s
    ):
        verdict = kept[1]
    else:
        busy = None  # the verdict may change: the duty cycle is read again if it paces
        latest = sample()
        key = (latest.pk if latest else None, *rest)
        verdict = _last_verdict.get(key)
        if verdict is None:
            verdict = evaluate(spec, latest)
            _last_verdict.clear()
            _last_verdict[key] = verdict
            if verdict.critical:
                _pause_for_critical(run, verdict)
    if controlled(spec):
        period = timedelta(milliseconds=settings.RETENTION["GUARD_CONTROL_PERIOD_MS"])
        if knobs is None or timezone.now() - knobs[3] >= _due(knobs[5], period):
            stepped = control_step(run.policy_id, spec)
            if stepped is not None:
                knobs = (
                    stepped.concurrency,
                    stepped.chunk_ms,
                    stepped.duty_cycle,
                    stepped.stepped_at,
                    stepped.quiet_until,
                    stepped.action,
                )
        if knobs is not None:
            concurrency, chunk_ms, duty = _clamped(spec, *knobs[:3])
            _chunk_ms[run.policy_id] = chunk_ms
            _lowered[run.policy_id] = duty < ceilings_of(spec).duty_cycle
            verdict = replace(verdict, concurrency=concurrency, duty_cycle=duty)
            if knobs[4] is not None and knobs[4] > clock:
                return replace(
                    verdict,
                    admit=False,
                    paced=False,
                    reason=(
                        "the guard is taking idle probes of the foreground until"
                        f" {timezone.localtime(knobs[4]).time().isoformat('milliseconds')}"
                        f" (none in the last {BASELINE_WINDOW_S / 60:.0f} min)"
                    ),
                )
            if verdict.admit and duty < ceilings_of(spec).duty_cycle:
                # the controller has lowered the duty cycle: it applies whatever the probe reads
                verdict = replace(verdict, paced=True)
    if verdict.paced:  # the duty cycle is judged per chunk, not per sample
        return _pace(spec, verdict, clock, busy=busy)
    return verdict


def controlled(spec) -> bool:
    """Whether the latency controller sets the policy's knobs: the guard and its controller on,
    and a probe to judge by (a policy without one keeps its own settings)."""
    cfg = settings.RETENTION
    return bool(cfg.get("GUARD", True) and cfg["GUARD_CONTROL"] and spec.probe != "none")


def target_chunk_ms(policy_id: int, spec) -> int:
    """The chunk transaction's target duration for the policy's next chunks: the controller's
    setting as this process's last admission read it, else the policy's ``target_chunk_ms``."""
    if not controlled(spec):
        return spec.target_chunk_ms
    return min(spec.target_chunk_ms, _chunk_ms.get(policy_id, spec.target_chunk_ms))


_HEAD = (
    "SELECT s.id, s.taken_at, {busy}, c.concurrency, c.chunk_ms, c.duty_cycle, c.stepped_at,"
    " c.quiet_until, c.action"
    " FROM (SELECT 1) AS one LEFT JOIN LATERAL"
    " (SELECT id, taken_at FROM runs_guardsample ORDER BY taken_at DESC LIMIT 1) AS s ON true"
    " LEFT JOIN runs_guardcontrol c ON c.policy_id = %s"
)


def _head(spec, policy_id: int, busy_at) -> tuple:
    """(id, taken_at) of the latest sample (Nones: no sample), with ``busy_at`` the policy's
    busy seconds of the duty window ending then (else None), and the controller's knobs
    (concurrency, chunk_ms, duty_cycle, stepped_at, quiet_until, action; None before its first
    step):
    one statement."""
    if busy_at is None:
        row = _rows(sql.SQL(_HEAD).format(busy=sql.SQL("NULL")), [policy_id])[0]
    else:
        query = sql.SQL(_HEAD).format(busy=sql.SQL("({})").format(sql.SQL(_BUSY)))
        row = _rows(query, [*_busy_params(spec, busy_at), policy_id])[0]
    knobs = tuple(row[3:]) if row[3] is not None else None
    return row[0], row[1], row[2], knobs


# -- the latency controller --------------------------------------------------------------


@dataclass(frozen=True)
class Ceilings:
    """The controller's range for a policy: each knob between its floor and the policy's own
    setting (its ceiling)."""

    concurrency: int
    chunk_ms: int
    duty_cycle: float
    chunk_ms_floor: int
    duty_floor: float


def ceilings_of(spec) -> Ceilings:
    cfg = settings.RETENTION
    duty = float(cfg["GUARD_DUTY_CYCLE"])
    return Ceilings(
        concurrency=spec.policy_workers,
        chunk_ms=spec.target_chunk_ms,
        duty_cycle=duty,
        chunk_ms_floor=min(spec.target_chunk_ms, int(cfg["GUARD_CHUNK_MS_FLOOR"])),
        duty_floor=min(duty, float(cfg["GUARD_DUTY_FLOOR"])),
    )


def _clamped(spec, concurrency: int, chunk_ms: int, duty: float) -> tuple[int, int, float]:
    """Knobs within the policy's current range (a new version may have lowered its ceilings)."""
    c = ceilings_of(spec)
    return (
        max(1, min(c.concurrency, concurrency)),
        max(c.chunk_ms_floor, min(c.chunk_ms, chunk_ms)),
        max(c.duty_floor, min(c.duty_cycle, duty)),
    )


DECREASE, INCREASE, HOLD, FLOOR, QUIET = "decrease", "increase", "hold", "at floor", "measure"
START = "start"
QUIET_EVERY_S = 60.0  # a quiet window at most this often, whatever its probes found
# no step for this long (nothing of the policy drained): the next run starts at the floor again
RESTART_AFTER_S = 60.0
# periods after a run's start with no reading of the probe: the policy's own settings then
NO_READINGS_PERIODS = 3
ADDITIVE_STEPS = 5  # an increase moves chunk time and duty cycle a fifth of their range


def floor_of(spec) -> tuple[int, int, float]:
    """The controller's minimum for a policy: one chunk transaction at a time, the shortest
    chunk and the lowest duty cycle."""
    c = ceilings_of(spec)
    return 1, c.chunk_ms_floor, c.duty_floor


def _describe(concurrency: int, chunk_ms: int, duty: float) -> str:
    return (
        f"{concurrency} chunk transaction{'s' if concurrency != 1 else ''} at once,"
        f" {chunk_ms} ms chunks, duty cycle {duty:.0%}"
    )


def _readings(table: str, since, until) -> tuple[sql.Composable, list]:
    """The probe's readings of ``table`` in (``since``, ``until``] as a query of one column
    ``v`` (ms) and its parameters: each sample's own probe and the probes the sampler thread
    took between samples (kept in the next sample with their instant). The controller's
    period and the run's report (``run_budget``) read the same readings."""
    return (
        sql.SQL(
            "SELECT (tables -> %s ->> 'probe_ms')::float8 AS v FROM runs_guardsample"
            " WHERE taken_at > %s AND taken_at <= %s"
            " UNION ALL SELECT (e.r ->> 0)::float8 FROM runs_guardsample s,"
            " jsonb_array_elements(coalesce(s.tables -> %s -> 'probes', '[]')) AS e(r)"
            " WHERE s.taken_at > %s AND (e.r ->> 1)::float8"
            "  BETWEEN extract(epoch FROM %s::timestamptz) AND extract(epoch FROM %s::timestamptz)"
        ),
        [table, since, until, table, since, since, until],
    )


def control_step(policy_id: int, spec, *, now=None) -> GuardControl | None:
    """Take the controller's step for the policy if one is due: from the probe's p99 over the
    samples since the last step against its idle baseline's p99, halve the knobs when the
    inflation is over the budget and step them back up towards the policy's own settings when
    it is not (additive increase, multiplicative decrease). At the floor and still over the
    budget, its reason says so with the figures. A run starts at the floor (the policy's
    first, and any after ``RESTART_AFTER_S`` without a step): the controller knows nothing of
    the foreground's tolerance before its first period, and the additive increase takes the
    knobs to the policy's settings in ``ADDITIVE_STEPS`` periods within the budget. Returns
    the row after the step, or None when another worker holds the row, the step is not due or
    there were not two samples since the last one to judge (the next step is then due a
    period later). The row is shared by every process and host (its row lock orders the
    steps)."""
    cfg = settings.RETENTION
    now = now or timezone.now()
    period = timedelta(milliseconds=cfg["GUARD_CONTROL_PERIOD_MS"])
    top = ceilings_of(spec)
    floor = floor_of(spec)
    budget = budget_of(spec)
    with transaction.atomic():
        with connection.cursor() as cur:
            # a new row is stale at once: the step below starts it at the floor
            cur.execute(
                "INSERT INTO runs_guardcontrol (policy_id, concurrency, chunk_ms, duty_cycle,"
                " stepped_at, budget, action, reason) VALUES (%s, %s, %s, %s, %s, %s, %s, '')"
                " ON CONFLICT (policy_id) DO NOTHING",
                [
                    policy_id,
                    *floor,
                    now - timedelta(seconds=RESTART_AFTER_S) - period,
                    budget,
                    HOLD,
                ],
            )
        row = (
            GuardControl.objects.select_for_update(skip_locked=True)
            .filter(policy_id=policy_id)
            .first()
        )
        if row is None or now - row.stepped_at < _due(row.action, period):
            return None
        if now - row.stepped_at >= timedelta(seconds=RESTART_AFTER_S) + period:
            idle_s = (now - row.stepped_at).total_seconds()
            _record_step(
                row,
                policy_id,
                now,
                floor,
                budget,
                START,
                (
                    "a run starts at the controller's minimum"
                    + (f" (no step for {idle_s:.0f} s)" if row.reason else "")
                    + f": {_describe(*floor)}, stepped up each period within the budget"
                ),
                measured=(None, None, None, 0),
            )
            return row
        # the run's readings since the last step (since its start: none from before it)
        since = row.stepped_at if row.action == START else max(row.stepped_at, now - 3 * period)
        readings, params = _readings(spec.qualified_table, since, now)
        probes = sorted(
            v
            for (v,) in _rows(
                sql.SQL("SELECT v FROM ({}) r WHERE v IS NOT NULL").format(readings), params
            )
        )
        if len(probes) < 2 and row.action == START:
            if now - row.stepped_at < NO_READINGS_PERIODS * period:
                # its first judgment comes once two readings exist, at the next admission
                return None
            # no reading of the probe since the run started (a probe that fails, a table the
            # sampler cannot read): nothing to judge the foreground by — the policy's own
            # settings, as without the controller, rather than its minimum for good
            return _record_step(
                row,
                policy_id,
                now,
                (top.concurrency, top.chunk_ms, top.duty_cycle),
                budget,
                HOLD,
                f"no reading of the probe in the {(now - row.stepped_at).total_seconds():.0f} s"
                " since the run started: the policy's own settings",
                measured=(None, None, None, len(probes)),
            )
        if len(probes) < 2:
            # nothing to judge yet (samples are taken only while chunks are asked for): the
            # next step is due once two more samples can exist — a run's first step comes in
            # its first second, not a period later — and not at every admission meanwhile
            row.stepped_at = now - period + _first_wait(period)
            row.save(update_fields=["stepped_at"])
            return None
        concurrency, chunk_ms, duty = _clamped(spec, row.concurrency, row.chunk_ms, row.duty_cycle)
        # the run's p99 of n readings is their highest below a hundred: what an idle spell
        # would read as its highest of n is the idle readings' n/(n+1) percentile, so that is
        # the idle value it is judged against — the p99 of hundreds of idle readings would let
        # four readings of a run at 2 × its idle typical value pass as "within the budget"
        rank = min(0.99, len(probes) / (len(probes) + 1))
        base = idle_baseline(spec.qualified_table, now=now, rank=rank)["at_rank"]
        idle = f"idle p{round(rank * 100)}"
        p99 = _pct(probes, 0.99)
        inflation = round(p99 / base, 3) if base else None
        measured = f"probe p99 {_fmt(p99)} ms = {_fmt(inflation)} × {idle} {_fmt(base)} ms"
        quiet_ms = top.chunk_ms + int(cfg["GUARD_IDLE_GAP_MS"]) + 3 * int(cfg["GUARD_SAMPLE_MS"])
        if base is None and _quiet_due(row, spec, now, period):
            # the run drains without a pause long enough for an idle reading: the policy's
            # chunks wait for a moment so that the sampler takes idle probes, rather than the
            # controller judging the foreground against readings the run itself lifted
            row.quiet_until = now + timedelta(milliseconds=quiet_ms)
            action = QUIET
            reason = (
                f"no idle reading of the probe in the last {BASELINE_WINDOW_S / 60:.0f} min"
                f" while the run drains: its chunks wait {quiet_ms} ms for idle probes"
            )
        elif base is None:
            action, reason = HOLD, "no idle baseline of the probe yet"
        elif p99 > _limit(base, budget):
            lowered = (
                max(1, concurrency // 2),
                max(top.chunk_ms_floor, chunk_ms // 2),
                max(top.duty_floor, round(duty / 2, 4)),
            )
            if lowered == (concurrency, chunk_ms, duty):
                action = FLOOR
                reason = (
                    f"over the budget at the controller's minimum ({_describe(*lowered)}):"
                    f" {measured} > budget {_fmt(budget)} ×"
                )
            else:
                action = DECREASE
                reason = f"{measured} > budget {_fmt(budget)} ×"
            concurrency, chunk_ms, duty = lowered
        else:
            raised = (
                min(top.concurrency, concurrency + 1),
                min(
                    top.chunk_ms,
                    chunk_ms + max(1, (top.chunk_ms - top.chunk_ms_floor) // ADDITIVE_STEPS),
                ),
                min(
                    top.duty_cycle,
                    round(duty + (top.duty_cycle - top.duty_floor) / ADDITIVE_STEPS, 4),
                ),
            )
            reason = measured
            if p99 > base * budget:  # over the budget's multiple, under the margin over idle
                margin = float(cfg["GUARD_PROBE_MARGIN_MS"])
                reason += (
                    f", under the limit of idle + {_fmt(margin)} ms (the margin for jitter;"
                    f" budget {_fmt(budget)} ×)"
                )
            else:
                reason += f" within budget {_fmt(budget)} ×"
            if raised != (concurrency, chunk_ms, duty) and row.action in (DECREASE, FLOOR):
                # one period within the budget right after a decrease is as likely the
                # foreground's quiet moment as headroom: a second one steps up (without it, a
                # few samples' p99 had the knobs go up and down every period)
                raised = (concurrency, chunk_ms, duty)
                reason += "; a second period within it before stepping up after a decrease"
            action = HOLD if raised == (concurrency, chunk_ms, duty) else INCREASE
            concurrency, chunk_ms, duty = raised
        _record_step(
            row,
            policy_id,
            now,
            (concurrency, chunk_ms, duty),
            budget,
            action,
            reason,
            measured=(p99, base, inflation, len(probes)),
        )
    if action in (DECREASE, FLOOR):
        log.info("guard controller of policy %s: %s: %s", spec.slug, action, reason)
    return row


def _first_wait(period: timedelta) -> timedelta:
    """Two sample intervals (at most a period): when two samples to judge can exist."""
    return min(period, timedelta(milliseconds=2 * settings.RETENTION["GUARD_SAMPLE_MS"]))


def _due(action: str | None, period: timedelta) -> timedelta:
    """How long after the last step the next is due: a period, but a run's first judgment
    (after ``start``) once two samples can exist — a run of a few seconds is controlled from
    its first second."""
    return _first_wait(period) if action == START else period


def _record_step(row, policy_id, now, knobs, budget, action, reason, *, measured) -> GuardControl:
    """The step on the controller's row and in its history: ``knobs`` (concurrency, chunk ms,
    duty cycle) and ``measured`` (probe p99, idle value, inflation, readings)."""
    p99, base, inflation, readings = measured
    row.concurrency, row.chunk_ms, row.duty_cycle = knobs
    row.stepped_at, row.budget, row.action, row.reason = now, budget, action, reason
    row.probe_p99_ms, row.baseline_ms, row.inflation = p99, base, inflation
    row.save()
    GuardControlStep.objects.create(
        policy_id=policy_id,
        taken_at=now,
        concurrency=knobs[0],
        chunk_ms=knobs[1],
        duty_cycle=knobs[2],
        probe_p99_ms=p99,
        baseline_ms=base,
        inflation=inflation,
        budget=budget,
        samples=readings,
        action=action,
        reason=reason,
    )
    return row


def _quiet_due(row: GuardControl, spec, now, period: timedelta) -> bool:
    """A quiet window is due: the policy's chunks committed within the last period (its run
    drains, so no idle reading comes by itself) and the last window is over a minute old."""
    if row.quiet_until is not None and now - row.quiet_until < timedelta(seconds=QUIET_EVERY_S):
        return False
    since = _since_last_chunk_s([spec.slug])
    return since is not None and since < period.total_seconds()


def control_summary(policy, spec=None, *, row=UNREAD) -> dict | None:
    """The controller as the run page, ``retention status`` and /metrics show it for
    ``policy``: budget, measured inflation, current settings and their ceilings, the last
    action and its reason. None before its first step. A page showing several policies passes
    each one's row (``control_of`` a policy read with its row), read once for all of them."""
    if row is UNREAD:
        row = GuardControl.objects.filter(policy=policy).first()
    if row is None:
        return None
    if spec is None:
        version = policy.approved_version
        spec = version.parsed if version is not None else None
    top = ceilings_of(spec) if spec is not None else None
    concurrency, chunk_ms, duty = (
        _clamped(spec, row.concurrency, row.chunk_ms, row.duty_cycle)
        if spec is not None
        else (row.concurrency, row.chunk_ms, row.duty_cycle)
    )
    return {
        "budget": row.budget if spec is None else budget_of(spec),
        "inflation": row.inflation,
        "probe_p99_ms": row.probe_p99_ms,
        "idle_p99_ms": row.baseline_ms,
        "concurrency": concurrency,
        "concurrency_ceiling": top.concurrency if top else None,
        "chunk_ms": chunk_ms,
        "chunk_ms_ceiling": top.chunk_ms if top else None,
        "duty_cycle": duty,
        "duty_cycle_ceiling": top.duty_cycle if top else None,
        "action": row.action,
        "reason": row.reason,
        "stepped_at": row.stepped_at,
    }


def run_budget(run) -> dict | None:
    """The controller's report over ``run``: the steps it took for the run's policy while the
    run drained (its history, kept for a day), how many judged the foreground over the
    budget, how many of those at its minimum, and the worst inflation it measured; and the
    run as a whole — the p99 of every probe reading taken while it drained against the idle
    readings' percentile of the same rank (``pooled``). A period judges twenty-odd readings,
    whose p99 is their highest: a short run's two periods can each pass while its hundred
    readings' p99 does not. The sentence says whether the run kept the budget: over it as a
    whole is over it, whatever its periods said. None when no step falls within the run."""
    if run.started_at is None:
        return None
    end = run.finished_at or timezone.now()
    steps = GuardControlStep.objects.filter(
        policy_id=run.policy_id, taken_at__gte=run.started_at, taken_at__lte=end
    )
    # counted by the database: a day of steps is tens of thousands of rows, and the run page
    # asks at every refresh of its live part
    judged_q = Q(inflation__isnull=False)
    counts = steps.aggregate(
        steps=Count("id"),
        judged=Count("id", filter=judged_q),
        # against the budget itself, not the controller's limit (which allows a jitter margin)
        over=Count(
            "id",
            filter=judged_q & (Q(inflation__gt=F("budget")) | Q(action__in=(DECREASE, FLOOR))),
        ),
        at_floor=Count("id", filter=judged_q & Q(action=FLOOR)),
        worst=Max("inflation"),
    )
    if not counts["steps"]:
        return None
    budget = steps.order_by("-taken_at", "-id").values_list("budget", flat=True).first()
    over, at_floor, worst, n = counts["over"], counts["at_floor"], counts["worst"], counts["judged"]
    pooled = _pooled(run.policy_version.parsed.qualified_table, run.started_at, end)
    pooled_over = pooled is not None and pooled["inflation"] > budget
    judged_text = f"the {n} period judged" if n == 1 else f"{n} periods judged"
    if not n:
        verdict = "the controller judged no period of this run (it ended before its first)"
    elif at_floor:
        verdict = (
            f"over the budget at the controller's minimum in {at_floor} of {judged_text}"
            f" (worst {_fmt(worst)} × idle, budget {_fmt(budget)} ×): the foreground's budget"
            " and this run's progress could not both be had"
            + (f"; over it in {over} periods in all" if over > at_floor else "")
        )
    elif over:
        verdict = (
            f"over the budget in {over} of {judged_text} (worst {_fmt(worst)} × idle, budget"
            f" {_fmt(budget)} ×); never at the controller's minimum"
        )
    elif pooled_over:
        verdict = (
            f"over the budget over the run as a whole, though within it in"
            f" {'all ' if n > 1 else ''}{judged_text} (worst {_fmt(worst)} × idle)"
        )
    else:
        verdict = (
            f"within the budget in {'all ' if n > 1 else ''}{judged_text}"
            f" (worst {_fmt(worst)} × idle, budget {_fmt(budget)} ×)"
        )
    if pooled is not None:
        verdict += (
            f"; the run as a whole: probe p99 of {pooled['readings']} readings"
            f" {_fmt(pooled['p99_ms'])} ms = {_fmt(pooled['inflation'])} × idle"
            f" p{pooled['rank']} {_fmt(pooled['baseline_ms'])} ms"
            + (f" > budget {_fmt(budget)} ×" if pooled_over else f", within {_fmt(budget)} ×")
        )
    return {
        "steps": counts["steps"],
        "judged": n,
        "over_budget": over,
        "over_at_minimum": at_floor,
        "worst_inflation": worst,
        "budget": budget,
        "pooled": pooled,
        "verdict": verdict,
    }


def _pooled(table: str, since, until) -> dict | None:
    """The probe over (``since``, ``until``] as one period: the p99 of all its readings (by
    the database: an hour's run is tens of thousands), the idle baseline's percentile of the
    rank a highest-of-n reading has (``n/(n+1)``, at most p99, as the controller judges a
    period) and their ratio. None with fewer than two readings or no idle baseline."""
    readings, params = _readings(table, since, until)
    ((count, p99),) = _rows(
        sql.SQL(
            "SELECT count(v), percentile_disc(0.99) WITHIN GROUP (ORDER BY v)"
            " FROM ({}) r WHERE v IS NOT NULL"
        ).format(readings),
        params,
    )
    if count < 2:
        return None
    rank = min(0.99, count / (count + 1))
    base = idle_baseline(table, now=until, rank=rank)["at_rank"]
    if not base:
        return None
    return {
        "readings": count,
        "p99_ms": round(p99, 2),
        "rank": round(rank * 100),
        "baseline_ms": base,
        "inflation": round(p99 / base, 3),
    }


def _pause_for_critical(run, verdict: Verdict) -> None:
    """Pause the policy through the same action an operator uses (one writer of the
    paused flag, one operator-log row); a policy already paused is left as it is."""
    try:
        policy_actions.pause_policy(
            run.policy, actor="guard", reason=f"guard critical: {verdict.reason}", alert=True
        )
    except policy_actions.ActionError:  # already paused, by a person or another worker
        return
    log.error("ALERT policy %s paused by the guard: %s", run.policy.slug, verdict.reason)


def control_of(policy) -> GuardControl | None:
    """The policy's controller row as loaded with it (``select_related("guard_control")``),
    None when it has none."""
    try:
        return policy.guard_control
    except GuardControl.DoesNotExist:
        return None


def latest_sample():
    return GuardSample.objects.order_by("-taken_at").first()


def current_state(policy, *, version=UNREAD, latest=UNREAD, control=UNREAD, probes=None) -> dict:
    """The guard as the dashboard shows it for ``policy``:
    ``{"level": "ok"|"throttled"|"critical", "reasons": [str], "signals": {name: {"value", "threshold", "unit"}},
    "sampled_at": datetime|None}``. A page showing several policies passes the latest sample
    (``latest_sample``), each policy's approved version, its controller row (``control_of``;
    None: it has none) and its table's probe window (``probe_windows``), read once for all."""
    if version is UNREAD:
        version = policy.approved_version
    if latest is UNREAD:
        latest = latest_sample()
    if version is None or latest is None:
        return {
            "level": "ok",
            "reasons": [],
            "signals": {},
            "sampled_at": latest.taken_at if latest else None,
        }
    verdict = evaluate(version.parsed, latest, probes=probes)
    if policy.paused and policy.paused_reason.startswith("guard critical"):
        level = "critical"
    else:
        level = "critical" if verdict.critical else ("ok" if verdict.admit else "throttled")
    reasons = [r for r in verdict.reason.split("; ") if r]
    signals = dict(verdict.signals)
    control = control_summary(policy, version.parsed, row=control)
    if control is not None:
        signals.update(control_signals(control))
        period_s = settings.RETENTION["GUARD_CONTROL_PERIOD_MS"] / 1000
        recent = (timezone.now() - control["stepped_at"]).total_seconds() < 3 * period_s
        if control["action"] == FLOOR and recent:
            reasons.append(control["reason"])
            if level == "ok":
                level = "throttled"
    return {
        "level": level,
        "reasons": reasons,
        "signals": signals,
        "sampled_at": latest.taken_at,
    }


def control_signals(control: dict) -> dict:
    """The controller's figures as guard signals (value, threshold, unit): the inflation
    against the budget, and each setting against its ceiling."""
    return {
        "probe_p99_inflation": {
            "value": control["inflation"],
            "threshold": control["budget"],
            "unit": "×",
        },
        "control_concurrency": {
            "value": control["concurrency"],
            "threshold": control["concurrency_ceiling"],
            "unit": "",
        },
        "control_chunk_ms": {
            "value": control["chunk_ms"],
            "threshold": control["chunk_ms_ceiling"],
            "unit": "ms",
        },
        "control_duty_cycle": {
            "value": control["duty_cycle"],
            "threshold": control["duty_cycle_ceiling"],
            "unit": "",
        },
    }
