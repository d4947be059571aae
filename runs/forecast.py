"""Drain window: will a policy's backlog clear before the next retention boundary?

Everything is derived at read time from the target table (through its timestamp
index) and the audit trail; nothing is stored.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Max, Min, Sum
from django.utils import timezone
from psycopg import sql

from core import timeouts
from core.formatting import duration as _human
from retention import predicate as P
from retention.schedule_math import next_tick
from runs.models import AuditRecord, Run
from runs.progress import progress_for

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


def drain_window(policy, *, fresh: bool = False) -> dict:
    """The policy's drain window, computed at most every CACHE_SECONDS (the overview polls it;
    the counts behind it read the target table). ``fresh`` bypasses the cache."""
    from django.core.cache import cache

    key = f"retention:drain-window:{policy.pk}:{policy.created_at.timestamp()}"
    if not fresh:
        cached = cache.get(key)
        if cached is not None:
            return cached
    result = _drain_window(policy)
    cache.set(key, result, CACHE_SECONDS)
    return result


def _drain_window(policy) -> dict:
    """``{"backlog_rows", "oldest_eligible_age_s", "overdue_s", "inflow_per_day", "rows_per_s", "eta_s",
    "next_tick", "verdict": "converges"|"at risk"|"idle"|"unknown", "explanation"}``."""
    now = timezone.now()
    out = {
        "backlog_rows": None, "oldest_eligible_age_s": None, "overdue_s": None, "inflow_per_day": None,
        "rows_per_s": None, "eta_s": None, "next_tick": None, "verdict": "unknown", "explanation": "",
    }  # fmt: skip
    version = policy.approved_version
    if version is None:
        out["explanation"] = "no approved version"
        return out
    spec = version.parsed
    cutoff_now = spec.cutoff_for(now)  # wall-clock days, like a run's
    where = P.eligible(spec, policy_id=policy.id, cutoff=cutoff_now)
    ts = P.col(spec.timestamp)
    oldest = _one(
        P.Fragment(
            sql.SQL("SELECT min({}) FROM {} WHERE {}").format(ts, P.table(spec), where.sql),
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
    day = P.Fragment(
        sql.SQL("{} AND {} >= %s").format(tomorrow.sql, ts), [*tomorrow.params, cutoff_now]
    )
    out["inflow_per_day"] = _one(P.count_where(spec, day))
    run = Run.objects.filter(policy=policy).order_by("-tick", "-id").first()
    if (
        run is not None
        and not run.is_terminal
        and (run.planner_done or run.expected_rows is not None)
    ):
        p = progress_for([run.pk], now=now)[run.pk]
        out["backlog_rows"] = max(0, p.rows_expected - p.rows_deleted)
    else:
        out["backlog_rows"] = _one(P.count_where(spec, where, limit=10_000_000), timeout_ms=5000)
    rate = observed_rate(policy, now)
    out["rows_per_s"] = round(rate, 1) if rate else None
    upcoming = next_tick(policy, now)
    out["next_tick"] = upcoming
    window_s = (upcoming - now).total_seconds()
    backlog = out["backlog_rows"]
    if backlog == 0:
        out["verdict"], out["eta_s"] = "idle", 0
        out["explanation"] = "nothing eligible is waiting"
    elif backlog is None:
        out["explanation"] = "backlog could not be counted in time"
    elif not rate:
        out["explanation"] = "no deletions in the last ten minutes to measure a rate"
    else:
        out["eta_s"] = round(backlog / rate)
        inflow = out["inflow_per_day"] or 0
        keeps_up = rate * 86400 >= inflow
        if out["eta_s"] <= window_s and keeps_up:
            out["verdict"] = "converges"
            out["explanation"] = (
                f"{backlog:,} rows at {rate:,.0f}/s clear in {_human(out['eta_s'])}, before the next tick in {_human(window_s)}"
            )
        else:
            out["verdict"] = "at risk"
            why = (
                f"needs {_human(out['eta_s'])} but the next tick is in {_human(window_s)}"
                if keeps_up
                else f"{inflow:,} rows/day become eligible, faster than {rate * 86400:,.0f}/day are deleted"
            )
            out["explanation"] = f"{backlog:,} rows at {rate:,.0f}/s: {why}"
    return out
