"""The latency controller: every period, the probe's p99 against the idle value of the same
rank and the policy's budget moves the knobs (chunk transactions at once, chunk target, duty
cycle) between their floors and the policy's own settings (AIMD)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from runs.engine import prometheus
from runs.engine.guard.common import (
    BASELINE_WINDOW_S,
    _fmt,
    _pct,
    _rows,
    _since_last_chunk_s,
)
from runs.engine.guard.limit import budget_of, limit_of
from runs.engine.guard.signals import (
    idle_baseline,
)
from runs.models import GuardControl, GuardControlStep

log = logging.getLogger(__name__)


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
# over the limit with no chunk of the policy in flight for a whole period: not cleanup's doing
FOREGROUND = "foreground over"
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
        lim = limit_of(spec)
        limit_ms = lim.ms(base)
        value, measured = _measured(spec, lim, p99, base, inflation, idle, since, now)
        # the signal over the whole period rather than its tail: the probe's median reading
        # (the application's p99 from Prometheus is the period's already) — over the limit,
        # the foreground was slow throughout, not in a stall or two
        whole = _measured(spec, lim, _pct(probes, 0.5), None, None, idle, since, now)[0]
        quiet_ms = top.chunk_ms + int(cfg["GUARD_IDLE_GAP_MS"]) + 3 * int(cfg["GUARD_SAMPLE_MS"])
        if limit_ms is None and _quiet_due(row, spec, now, period):
            # the run drains without a pause long enough for an idle reading: the policy's
            # chunks wait for a moment so that the sampler takes idle probes, rather than the
            # controller judging the foreground against readings the run itself lifted
            row.quiet_until = now + timedelta(milliseconds=quiet_ms)
            action = QUIET
            reason = (
                f"no idle reading of the probe in the last {BASELINE_WINDOW_S / 60:.0f} min"
                f" while the run drains: its chunks wait {quiet_ms} ms for idle probes"
            )
        elif limit_ms is None:
            action, reason = HOLD, "no idle baseline of the probe yet"
        elif value is None:
            action = HOLD
            reason = f"{measured}: no reading of the application's p99 to judge by"
        elif value > limit_ms and whole > limit_ms and _nothing_in_flight(spec, since, now):
            # not cleanup's doing: over the limit with none of the policy's chunks in flight
            # for the whole period — the knobs stay, admission stays closed (``admission``)
            action = FOREGROUND
            reason = (
                f"the foreground is over its budget on its own: {measured} >"
                f" {lim.words(base)}, with no chunk of the policy in flight for the whole"
                f" period ({(now - since).total_seconds():.1f} s); admission stays closed"
            )
        elif value > limit_ms:
            lowered = _halved(top, concurrency, chunk_ms, duty)
            if lowered == (concurrency, chunk_ms, duty):
                # at the minimum and still over: the policy's chunks wait a period, which
                # tells the foreground's own slowness (still over with nothing in flight: the
                # next step says so and keeps admission closed) from cleanup's
                action = FLOOR
                reason = (
                    f"over the budget at the controller's minimum ({_describe(*lowered)}):"
                    f" {measured} > {lim.words(base)}"
                )
                if row.quiet_until is None or now - row.quiet_until >= timedelta(
                    seconds=QUIET_EVERY_S
                ):
                    row.quiet_until = now + period
                    reason += (
                        "; its chunks wait a period to see whether the foreground is over it"
                        " on its own"
                    )
            else:
                action = DECREASE
                reason = f"{measured} > {lim.words(base)}"
            concurrency, chunk_ms, duty = lowered
        elif pressure := _io_over(spec, since, now):
            # within the limit, but the server's WAL fsyncs or the host's I/O are under
            # pressure: a write-back burst is coming, and the foreground's stalls with it
            lowered = _halved(top, concurrency, chunk_ms, duty)
            action = DECREASE if lowered != (concurrency, chunk_ms, duty) else HOLD
            reason = (
                f"{pressure}: backing off before the write-back stalls the foreground"
                f" ({measured} within {lim.words(base)})"
                + ("" if action == DECREASE else "; at the controller's minimum")
            )
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
            reason = f"{measured} within {lim.words(base)}"
            if raised != (concurrency, chunk_ms, duty) and row.action in (
                DECREASE,
                FLOOR,
                FOREGROUND,
            ):
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
            measured=(value if value is not None else p99, base, inflation, len(probes)),
            limit_ms=limit_ms,
        )
    if action in (DECREASE, FLOOR):
        log.info("guard controller of policy %s: %s: %s", spec.slug, action, reason)
    return row


def _halved(top: Ceilings, concurrency: int, chunk_ms: int, duty: float) -> tuple[int, int, float]:
    """Every knob halved, not below its floor (multiplicative decrease)."""
    return (
        max(1, concurrency // 2),
        max(top.chunk_ms_floor, chunk_ms // 2),
        max(top.duty_floor, round(duty / 2, 4)),
    )


def _measured(spec, lim, p99, base, inflation, idle, since, now) -> tuple[float | None, str]:
    """The latency the limit judges over the period, in ms, and its words: the probe's p99
    (``signal = "probe"``), the application's own p99 from Prometheus (its highest reading in
    the period, ``"prometheus"``), or the higher of the two (``"both"``)."""
    probe = f"probe p99 {_fmt(p99)} ms" + (
        f" = {_fmt(inflation)} × {idle} {_fmt(base)} ms" if base else ""
    )
    if lim.signal == "probe":
        return p99, probe
    app = _prometheus_ms(spec, since, now)
    app_words = (
        f"application p99 {_fmt(app)} ms (prometheus)"
        if app is not None
        else "no application p99 from prometheus"
    )
    if lim.signal == "prometheus":
        return app, app_words
    return (max(p99, app) if app is not None else None), f"{probe}, {app_words}"


def _prometheus_ms(spec, since, now) -> float | None:
    """The policy's Prometheus value (seconds: the application's own p99) in ms, its highest
    in the samples of (``since``, ``now``]; None without an answer."""
    source = prometheus.source_of(spec)
    if source is None:
        return None
    ((value,),) = _rows(
        "SELECT max((values -> 'prometheus' -> %s ->> 'value')::float8) FROM runs_guardsample"
        " WHERE taken_at > %s AND taken_at <= %s",
        [source.key, since, now],
    )
    return None if value is None else round(float(value) * 1000, 3)


def _nothing_in_flight(spec, since, now) -> bool:
    """No chunk of the policy was in flight at any moment of (``since``, ``now``]: no chunk
    transaction of it (its audit rows' ``started_at`` → ``committed_at``) overlaps the period,
    and no sample of it saw the product at work on the table."""
    ((busy, seen),) = _rows(
        "SELECT EXISTS (SELECT 1 FROM runs_auditrecord WHERE policy_slug = %s"
        "  AND committed_at > %s AND started_at < %s),"
        " EXISTS (SELECT 1 FROM runs_guardsample WHERE taken_at > %s AND taken_at <= %s"
        "  AND tables -> %s ->> 'in_flight' = 'true')",
        [spec.slug, since, now, since, now, spec.qualified_table],
    )
    return not busy and not seen


def io_thresholds(spec) -> tuple[float, float]:
    """(I/O pressure share, WAL fsync ms) over which the controller backs off."""
    cfg = settings.RETENTION
    pressure = spec.io_pressure if spec.io_pressure is not None else cfg["GUARD_IO_PRESSURE"]
    fsync = spec.wal_fsync_ms if spec.wal_fsync_ms is not None else cfg["GUARD_WAL_FSYNC_MS"]
    return float(pressure), float(fsync)


def _io_over(spec, since, now) -> str:
    """The I/O signals of the period over their thresholds, in words ("" when none): the
    host's I/O pressure and the server's WAL fsync time, their highest in its samples."""
    ((pressure, fsync),) = _rows(
        "SELECT max((values ->> 'io_pressure')::float8), max((values ->> 'wal_fsync_ms')::float8)"
        " FROM runs_guardsample WHERE taken_at > %s AND taken_at <= %s",
        [since, now],
    )
    pressure_max, fsync_max = io_thresholds(spec)
    out = []
    if pressure is not None and pressure > pressure_max:
        out.append(f"I/O pressure {_fmt(float(pressure))} > {_fmt(pressure_max)}")
    if fsync is not None and fsync > fsync_max:
        out.append(f"WAL fsync {_fmt(float(fsync))} ms > {_fmt(fsync_max)} ms")
    return "; ".join(out)


def _first_wait(period: timedelta) -> timedelta:
    """Two sample intervals (at most a period): when two samples to judge can exist."""
    return min(period, timedelta(milliseconds=2 * settings.RETENTION["GUARD_SAMPLE_MS"]))


def _due(action: str | None, period: timedelta) -> timedelta:
    """How long after the last step the next is due: a period, but a run's first judgment
    (after ``start``) once two samples can exist — a run of a few seconds is controlled from
    its first second."""
    return _first_wait(period) if action == START else period


def _record_step(
    row, policy_id, now, knobs, budget, action, reason, *, measured, limit_ms=None
) -> GuardControl:
    """The step on the controller's row and in its history: ``knobs`` (concurrency, chunk ms,
    duty cycle), ``measured`` (the signal's p99, idle value, inflation, readings) and the
    limit in milliseconds it was judged against."""
    p99, base, inflation, readings = measured
    row.concurrency, row.chunk_ms, row.duty_cycle = knobs
    row.stepped_at, row.budget, row.action, row.reason = now, budget, action, reason
    row.probe_p99_ms, row.baseline_ms, row.inflation = p99, base, inflation
    row.limit_ms = limit_ms
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
        limit_ms=limit_ms,
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
