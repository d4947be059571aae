"""Drain window: will a policy's backlog clear before the next retention boundary?

Everything is derived at read time from the target table (through its timestamp
index) and the audit trail; nothing is stored.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Max, Min, Sum
from django.utils import timezone
from django_q.models import Schedule
from psycopg import sql

from core import timeouts
from core.formatting import duration as _human
from retention import predicate as P
from retention.models import KillSwitch
from retention.preview import ASSUMED_ROWS_PER_SECOND, bounds_now, measured_rate
from runs.counts import count_inflow, last_counts, rows_counted
from runs.engine import guard
from runs.engine.schedules import schedule_name
from runs.models import AuditRecord, Chunk, Run
from runs.progress import progress_for, stopped_by
from targets import connections as fleet
from targets.models import DEFAULT

RATE_WINDOW = timedelta(minutes=10)


def _one(frag: P.Fragment, timeout_ms: int = 2000):
    try:
        with transaction.atomic(), timeouts.bounded(timeout_ms), connection.cursor() as cur:
            cur.execute(frag.sql.as_string(cur.connection), frag.params)
            return cur.fetchone()[0]
    except Exception:  # the forecast is best effort; a slow or missing table says "unknown"
        return None


def observed_rate(policy, now=None) -> float | None:
    """Rows per second deleted for the policy over the last ten minutes of committed chunks."""
    now = now or timezone.now()
    agg = AuditRecord.objects.filter(
        policy_slug=policy.slug, committed_at__gte=now - RATE_WINDOW
    ).aggregate(rows=Sum("rows_deleted"), start=Min("started_at"), end=Max("committed_at"))
    if not agg["rows"] or agg["start"] is None:
        return None
    seconds = max(1.0, (agg["end"] - agg["start"]).total_seconds())
    return agg["rows"] / seconds


CACHE_SECONDS = 15


UNREAD = object()
BACKLOG = ":backlog"


def _cache_key(policy, part: str = "") -> str:
    return f"retention:drain-window{part}:{policy.pk}:{policy.created_at.timestamp()}"


def measurements(policies) -> dict[int, dict | None]:
    """Each policy's cached measurement (None: expired or never taken), one cache read for
    all of them, for a page that judges several policies' drain windows."""
    keys = [k for p in policies for k in (_cache_key(p), _cache_key(p, BACKLOG))]
    found = cache.get_many(keys)
    out = {}
    for p in policies:
        measured = found.get(_cache_key(p))
        if measured is not None and _cache_key(p, BACKLOG) in found:
            measured = {**measured, "table_backlog": found[_cache_key(p, BACKLOG)]}
        out[p.pk] = measured
    return out


def drain_window(
    policy,
    *,
    fresh: bool = False,
    progress: dict | None = None,
    latest_run=UNREAD,
    next_tick=UNREAD,
    kill_switch=UNREAD,
    measured=UNREAD,
    control=UNREAD,
) -> dict:
    """The policy's drain window. The counts behind it read the target table, so they are
    measured at most every CACHE_SECONDS (the overview polls; ``fresh`` bypasses the cache);
    the verdict and its sentence are judged on every call, as of now, from the run's current
    state and chunks and the tick the schedule is armed for — the same tick the page shows.
    ``progress`` (run id → ``RunProgress``, from the caller's own ``progress_for``) saves
    reading the policy's latest run's progress a second time; a page showing several
    policies passes what it read for all of them at once: the policy's latest run (None: no
    run), the tick its schedule is armed for, the global ``KillSwitch`` row and the cached
    measurement (``measurements``; None: none cached) and its guard controller row
    (``guard.control_of``; None: it has none)."""
    if fresh or measured is UNREAD:
        measured = measured_here(policy, fresh=fresh)
    elif measured is None:
        measured = measured_here(policy, fresh=True)
    known = {"run": latest_run, "next_tick": next_tick, "kill_switch": kill_switch}
    now = timezone.now()
    out = _judge(policy, measured, now, progress or {}, known, fresh=fresh)
    return _foreground_note(policy, out, now, control)


def measured_here(policy, *, fresh: bool = False) -> dict:
    """The policy's measurement in the database in place (its oldest eligible row, a day's
    inflow, the observed rate): the one cached there within ``CACHE_SECONDS``, else taken
    now and cached. A target's reading measures its own table this way (``runs.fleet.view``)."""
    measured = None if fresh else cache.get(_cache_key(policy))
    if measured is None:
        measured = _measure(policy)
        cache.set(_cache_key(policy), measured, CACHE_SECONDS)
    return measured


def _foreground_note(policy, out: dict, now, control=UNREAD) -> dict:
    """While the guard's controller finds the foreground over its limit on its own (no chunk
    of the policy in flight for a whole period: admission closed, not cleanup's doing), the
    window says so and whether the backlog still converges at the rate of the last ten
    minutes (``foreground_over``)."""
    row = guard.control_of(policy) if control is UNREAD else control
    period = timedelta(milliseconds=settings.RETENTION["GUARD_CONTROL_PERIOD_MS"])
    out["foreground_over"] = bool(
        row is not None and row.action == guard.FOREGROUND and now - row.stepped_at < 3 * period
    )
    if out["foreground_over"] and out["verdict"] in ("converges", "at risk", "unknown"):
        still = {
            "converges": "the backlog still converges",
            "at risk": "the backlog does not converge",
        }.get(out["verdict"], "whether the backlog converges is not known yet")
        out["explanation"] = (
            "admission closed: the foreground is over its budget on its own (no chunk in"
            f" flight); {still}: {out['explanation']}"
        )
    return out


def _measure(policy) -> dict:
    """The target table's oldest eligible row and a day's inflow (two index range reads),
    and the observed rate. The eligible count of the whole table is read apart
    (``_table_backlog``), only for a policy with no open run to take it from."""
    now = timezone.now()
    out = {
        "oldest_eligible_age_s": None, "overdue_s": None, "inflow_per_day": None,
        "rows_per_s": None, "version": None, "rollout": None,
    }  # fmt: skip
    version = policy.approved_version
    if version is None:
        return out
    out["version"] = version.pk
    spec = version.parsed
    out["rollout"] = spec.rollout
    if fleet.current() not in fleet.resolve(spec.targets):
        # its table lives in other databases: this database's table of that name, if any, is
        # not it (and its audit rows are in those databases' ledgers)
        out["elsewhere"] = True
        return out
    cutoff_now = spec.cutoff_for(now)  # wall-clock days, like a run's
    # what a run of this version started now deletes: a slice version's bound (bounds_now)
    where = P.eligible(spec, policy_id=policy.id, cutoff=bounds_now(spec, now)[1])
    # the oldest row by the column itself (its index), read as an instant (an epoch number or
    # a date becomes one: P.timestamp_instant)
    instant = P.timestamp_instant(spec)
    oldest = _one(
        P.Fragment(
            sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
                instant, P.table(spec), where.sql, P.col(spec.timestamp)
            ),
            where.params,
        )
    )
    if oldest is not None:
        out["oldest_eligible_age_s"] = round((now - oldest).total_seconds())
        out["overdue_s"] = round((cutoff_now - oldest).total_seconds())
    # inflow: rows that become eligible within a day — the eligibility predicate (keep rules,
    # holds, NULLs) under tomorrow's cutoff, minus what is eligible already
    tomorrow = P.eligible(
        spec, policy_id=policy.id, cutoff=spec.cutoff_for(now + timedelta(days=1))
    )
    # not eligible now: by its own period (an override's, a class's), not only the default's
    older_now = P.older_than(spec, cutoff_now)
    now_in_period = P.within_periods(spec, cutoff_now)
    day = P.Fragment(
        sql.SQL("{} AND NOT ({} AND {})").format(tomorrow.sql, older_now.sql, now_in_period.sql),
        [*tomorrow.params, *older_now.params, *now_in_period.params],
    )
    out["inflow_per_day"] = _one(P.count_where(spec, day))
    rate = observed_rate(policy, now)
    out["rows_per_s"] = round(rate, 1) if rate else None
    return out


def _table_backlog(policy, measured: dict, *, fresh: bool = False) -> int | None:
    """Rows of the target table eligible now (up to ten million; None: not counted within
    5 s), cached like the measurement (``measured["table_backlog"]`` when the caller read the
    cache for it). A whole-table count: read only where no open run knows its backlog, so a
    page never counts a table that a run is draining."""
    if measured.get("elsewhere"):
        return None  # its table is in other databases (``_measure``): nothing to read here
    key = _cache_key(policy, BACKLOG)
    counted = None if fresh else measured.get("table_backlog") or cache.get(key)
    if counted is None:
        version = policy.approved_version
        if version is None or DEFAULT not in version.parsed.targets:
            return None  # no version, or its table is in other databases (``_measure``)
        spec = version.parsed
        where = P.eligible(spec, policy_id=policy.id, cutoff=bounds_now(spec, timezone.now())[1])
        counted = {"rows": _one(P.count_where(spec, where, limit=10_000_000), timeout_ms=5000)}
        cache.set(key, counted, CACHE_SECONDS)
    return counted["rows"]


def _judge_counts(policy, out: dict, now) -> dict:
    """The verdict of a policy whose approved version only counts (``rollout = "count"``),
    judged before anything is deleted: the backlog is what its last count run found, the
    inflow what two successive count runs show (``runs.counts.count_inflow``), the rate the
    preview's (measured for the policy, or assumed) at the policy's workers."""
    last = last_counts(policy, limit=1)
    if not last:
        out["explanation"] = "count runs only: no count run has finished yet"
        return out
    backlog = rows_counted(last[0])
    out["backlog_rows"] = backlog
    spec = last[0].policy_version.parsed
    rate = (measured_rate(policy.slug) or ASSUMED_ROWS_PER_SECOND) * spec.policy_workers
    if spec.pace_rows_per_s:
        rate = min(rate, spec.pace_rows_per_s)
    out["rows_per_s"] = round(rate, 1)
    out["eta_s"] = round(backlog / rate) if rate else None
    inflow = count_inflow(policy)
    found = f"count runs (nothing deleted): {backlog:,} rows to delete"
    if inflow is None or inflow["inflow_per_day"] is None:
        out["explanation"] = f"{found}; a second count run shows the inflow"
        return out
    per_day = inflow["inflow_per_day"]
    out["inflow_per_day"] = per_day
    upcoming = out["next_tick"]
    window_s = None if upcoming is None else max(0.0, (upcoming - now).total_seconds())
    keeps_up = rate * 86400 >= per_day
    if keeps_up and (window_s is None or out["eta_s"] <= window_s):
        out["verdict"] = "converges"
        out["explanation"] = (
            f"{found}, {per_day:,} more a day; at ~{rate:,.0f}/s they clear in "
            f"{_human(out['eta_s'])}"
        )
    else:
        out["verdict"] = "at risk"
        why = (
            f"needs {_human(out['eta_s'])}, longer than the {_human(window_s)} to the next tick"
            if keeps_up
            else f"{per_day:,} rows/day become eligible, faster than {rate * 86400:,.0f}/day"
        )
        out["explanation"] = f"{found} at ~{rate:,.0f}/s: {why}"
    return out


def _armed_tick(policy):
    """The tick the policy's trigger schedule is armed for (what the pages show as "Next
    tick"); None when it has no schedule."""

    return (
        Schedule.objects.filter(name=schedule_name(policy))
        .values_list("next_run", flat=True)
        .first()
    )


def _judge(policy, measured: dict, now, progress: dict, known: dict, *, fresh=False) -> dict:
    """``{"backlog_rows", "pending_chunks", "oldest_eligible_age_s", "overdue_s",
    "inflow_per_day", "rows_per_s", "eta_s", "next_tick", "verdict":
    "converges"|"at risk"|"idle"|"paused"|"stopped"|"unknown", "explanation"}``."""
    out = {
        "backlog_rows": None, "pending_chunks": 0, "eta_s": None, "next_tick": None,
        "verdict": "unknown", "explanation": "",
        **{k: measured[k] for k in ("oldest_eligible_age_s", "overdue_s", "inflow_per_day", "rows_per_s")},
    }  # fmt: skip
    if measured["version"] is None:
        out["explanation"] = "no approved version"
        return out
    run = known["run"]
    if run is UNREAD:
        run = Run.objects.filter(policy=policy).order_by("-tick", "-id").first()
    if run is not None and not run.is_terminal:
        p = progress.get(run.pk) or progress_for([run.pk], now=now)[run.pk]
        out["pending_chunks"] = p.chunks[Chunk.State.PENDING]
        if p.rows_expected:  # the admission count, or (planned) what the chunks hold at most
            out["backlog_rows"] = max(0, p.rows_expected - p.rows_deleted)
        else:  # no total yet: the pending chunks' keys are an upper bound of their rows
            out["backlog_rows"] = p.rows_pending or _table_backlog(policy, measured, fresh=fresh)
    else:
        out["backlog_rows"] = _table_backlog(policy, measured, fresh=fresh)
    upcoming = _armed_tick(policy) if known["next_tick"] is UNREAD else known["next_tick"]
    out["next_tick"] = upcoming
    backlog, pending, rate = out["backlog_rows"], out["pending_chunks"], measured["rows_per_s"]
    waiting = (
        f"{pending:,} chunks pending (~{backlog:,} rows)"
        if pending
        else f"~{backlog or 0:,} rows eligible"
    )
    switch = known["kill_switch"]
    if switch is UNREAD:
        switch = KillSwitch.objects.filter(name="global").first()
    if not (pending or backlog):
        switch = None  # with nothing waiting, the switch holds nothing back
    open_run = run if run is not None and not run.is_terminal else None
    stopped = stopped_by(open_run, policy, switch)
    if stopped:
        out["verdict"] = stopped[0]
        out["explanation"] = f"{stopped[1]}; {waiting}"
        return out
    if measured.get("rollout") == "count":
        return _judge_counts(policy, out, now)
    if upcoming is None:
        window_s = None
        tick_text = "no tick is scheduled"
    else:
        window_s = max(0.0, (upcoming - now).total_seconds())
        tick_text = f"the next tick is in {_human(window_s)}"
    if backlog == 0 and not pending:
        out["verdict"], out["eta_s"] = "idle", 0
        out["explanation"] = "nothing eligible is waiting"
    elif backlog is None:
        out["explanation"] = "backlog could not be counted in time"
    elif not rate:
        out["explanation"] = f"{waiting}; no deletions in the last ten minutes to measure a rate"
    else:
        out["eta_s"] = round(backlog / rate)
        inflow = out["inflow_per_day"] or 0
        keeps_up = rate * 86400 >= inflow
        if keeps_up and (window_s is None or out["eta_s"] <= window_s):
            out["verdict"] = "converges"
            out["explanation"] = (
                f"{waiting} at {rate:,.0f}/s clear in {_human(out['eta_s'])}; {tick_text}"
            )
        else:
            out["verdict"] = "at risk"
            why = (
                f"needs {_human(out['eta_s'])} but {tick_text}"
                if keeps_up
                else f"{inflow:,} rows/day become eligible, faster than {rate * 86400:,.0f}/day are deleted"
            )
            out["explanation"] = f"{waiting} at {rate:,.0f}/s: {why}"
    return out
