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

from runs.engine.guard.common import (
    BASELINE_WINDOW_S,
    _fmt,
    _limit,
    _pct,
    _rows,
    _since_last_chunk_s,
    budget_of,
)
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
