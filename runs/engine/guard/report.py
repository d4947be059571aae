"""The guard as the pages, ``retention status`` and /metrics show it: the controller's summary,
its report over a run and the current state of a policy."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Count, F, Max, Q
from django.utils import timezone
from psycopg import sql

from runs.engine.guard.common import (
    UNREAD,
    _fmt,
    _rows,
)
from runs.engine.guard.controller import (
    DECREASE,
    FLOOR,
    FOREGROUND,
    _clamped,
    _readings,
    ceilings_of,
)
from runs.engine.guard.limit import (
    budget_of,
    limit_of,
)
from runs.engine.guard.signals import (
    idle_baseline,
    latest_sample,
)
from runs.engine.guard.verdict import (
    evaluate,
)
from runs.models import GuardControl, GuardControlStep

log = logging.getLogger(__name__)


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
        # the one latency measure: the signal's p99 over the last period and the limit in ms
        # it was judged against (the step's own, as the controller judged it)
        "p99_ms": row.probe_p99_ms,
        "limit_ms": row.limit_ms,
        "signal": limit_of(spec).signal if spec is not None else "probe",
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
    judged_q = Q(inflation__isnull=False) | Q(limit_ms__isnull=False, probe_p99_ms__isnull=False)
    # against the limit in ms the step judged by; a step recorded before limits were in ms,
    # against its budget itself
    over_q = (Q(limit_ms__isnull=False) & Q(probe_p99_ms__gt=F("limit_ms"))) | (
        Q(limit_ms__isnull=True) & (Q(inflation__gt=F("budget")) | Q(action__in=(DECREASE, FLOOR)))
    )
    counts = steps.aggregate(
        steps=Count("id"),
        judged=Count("id", filter=judged_q),
        # the foreground over its limit on its own (no chunk in flight) is not counted as the
        # run's: it is counted apart
        over=Count("id", filter=judged_q & over_q & ~Q(action=FOREGROUND)),
        on_its_own=Count("id", filter=Q(action=FOREGROUND)),
        at_floor=Count("id", filter=judged_q & Q(action=FLOOR)),
        worst=Max("inflation"),
        worst_ms=Max("probe_p99_ms", filter=~Q(action=FOREGROUND)),
    )
    if not counts["steps"]:
        return None
    budget, limit_ms = steps.order_by("-taken_at", "-id").values_list("budget", "limit_ms").first()
    over, at_floor, worst, n = counts["over"], counts["at_floor"], counts["worst"], counts["judged"]
    spec = run.policy_version.parsed
    lim = limit_of(spec)
    pooled = _pooled(spec.qualified_table, run.started_at, end)
    if pooled is not None:
        pooled["limit_ms"] = lim.ms(pooled["baseline_ms"])
    pooled_over = pooled is not None and pooled["p99_ms"] > pooled["limit_ms"]
    worst_text = (
        f"worst {_fmt(worst)} × idle, budget {_fmt(budget)} ×"
        if worst is not None and not lim.absolute
        else f"worst p99 {_fmt(counts['worst_ms'])} ms, limit {_fmt(limit_ms)} ms"
    )
    judged_text = f"the {n} period judged" if n == 1 else f"{n} periods judged"
    if not n:
        verdict = "the controller judged no period of this run (it ended before its first)"
    elif at_floor:
        verdict = (
            f"over the budget at the controller's minimum in {at_floor} of {judged_text}"
            f" ({worst_text}): the foreground's budget"
            " and this run's progress could not both be had"
            + (f"; over it in {over} periods in all" if over > at_floor else "")
        )
    elif over:
        verdict = (
            f"over the budget in {over} of {judged_text} ({worst_text}); never at the"
            " controller's minimum"
        )
    elif pooled_over:
        verdict = (
            f"over the budget over the run as a whole, though within it in"
            f" {'all ' if n > 1 else ''}{judged_text} ({worst_text.split(', ')[0]})"
        )
    else:
        verdict = f"within the budget in {'all ' if n > 1 else ''}{judged_text} ({worst_text})"
    if pooled is not None:
        verdict += (
            f"; the run as a whole: probe p99 of {pooled['readings']} readings"
            f" {_fmt(pooled['p99_ms'])} ms = {_fmt(pooled['inflation'])} × idle"
            f" p{pooled['rank']} {_fmt(pooled['baseline_ms'])} ms"
            + (
                f" > limit {_fmt(pooled['limit_ms'])} ms"
                if pooled_over
                else f", within the limit of {_fmt(pooled['limit_ms'])} ms"
            )
        )
    if counts["on_its_own"]:
        verdict += (
            f"; the foreground was over its budget on its own (no chunk in flight) in"
            f" {counts['on_its_own']} period{'s' if counts['on_its_own'] != 1 else ''},"
            " admission closed"
        )
    return {
        "steps": counts["steps"],
        "judged": n,
        "over_budget": over,
        "over_at_minimum": at_floor,
        "worst_inflation": worst,
        "budget": budget,
        "limit_ms": limit_ms,
        "over_on_its_own": counts["on_its_own"],
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


def control_of(policy) -> GuardControl | None:
    """The policy's controller row as loaded with it (``select_related("guard_control")``),
    None when it has none."""
    try:
        return policy.guard_control
    except GuardControl.DoesNotExist:
        return None


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
    latency = None
    judged = dict(signals)  # what the badge is judged on: the sample's, a recent step's
    if control is not None:
        signals.update(control_signals(control))
        period_s = settings.RETENTION["GUARD_CONTROL_PERIOD_MS"] / 1000
        recent = (timezone.now() - control["stepped_at"]).total_seconds() < 3 * period_s
        over = (
            control["p99_ms"] is not None
            and control["limit_ms"] is not None
            and control["p99_ms"] > control["limit_ms"]
        )
        if recent:
            # a step older than three periods measured a foreground no run loads now (the
            # run drained): its figures stay in the table but no longer throttle the badge
            judged.update(control_signals(control))
            latency = {
                "p99_ms": control["p99_ms"],
                "limit_ms": control["limit_ms"],
                "signal": control["signal"],
                "over": over,
                "on_its_own": control["action"] == FOREGROUND,
            }
        if recent and (control["action"] in (FLOOR, FOREGROUND) or over):
            reasons.append(control["reason"])
            if level == "ok":
                level = "throttled"
    if level == "ok":
        # the badge never says "ok" while a current signal is over its threshold
        over_signals = _over_thresholds(judged)
        if over_signals:
            level = "throttled"
            reasons.extend(over_signals)
    return {
        "level": level,
        "reasons": reasons,
        "signals": signals,
        "sampled_at": latest.taken_at,
        "latency": latency,
    }


# signals whose threshold is a floor (under it is pressure) or a ceiling the controller sets
# (at it is the policy's own setting, not pressure)
_AT_MOST = {"connections_free"}
_NOT_PRESSURE = {
    "control_concurrency",
    "control_chunk_ms",
    "control_duty_cycle",
    # the ratio is shown beside the limit; the limit in ms (``fg_p99_ms``) is what is judged
    "probe_p99_inflation",
}


def _over_thresholds(signals: dict) -> list[str]:
    """The shown signals over (a floor: under) their thresholds, in words."""
    out = []
    for name, s in signals.items():
        value, threshold = s.get("value"), s.get("threshold")
        if name in _NOT_PRESSURE or not isinstance(value, int | float) or threshold is None:
            continue
        if isinstance(value, bool):
            continue
        if (value < threshold) if name in _AT_MOST else (value > threshold):
            sign = "<" if name in _AT_MOST else ">"
            out.append(
                f"{name} {_fmt(float(value))} {sign} {_fmt(float(threshold))}{s.get('unit') and ' ' + s['unit'] or ''}"
            )
    return out


def control_signals(control: dict) -> dict:
    """The controller's figures as guard signals (value, threshold, unit): the inflation
    against the budget, and each setting against its ceiling."""
    return {
        "fg_p99_ms": {
            "value": control["p99_ms"],
            "threshold": control["limit_ms"],
            "unit": "ms",
        },
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
