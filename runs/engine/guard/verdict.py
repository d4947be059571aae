"""The verdict: may a chunk start now, and if not, why (``evaluate`` of a sample,
``admission`` per chunk with the controller's settings), and the pacing under the duty cycle."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone
from psycopg import sql

from retention import actions as policy_actions
from runs.engine import prometheus
from runs.engine.guard.common import (
    BASELINE_WINDOW_S,
    _fmt,
    _rows,
    controlled,
)
from runs.engine.guard.controller import (
    FLOOR,
    FOREGROUND,
    HOLD,
    _clamped,
    _due,
    ceilings_of,
    control_step,
    io_thresholds,
)
from runs.engine.guard.limit import limit_of
from runs.engine.guard.signals import (
    admission_fresh_s,
    idle_baseline,
    probe_percentiles,
    sample,
)
from runs.models import GuardSample
from targets import connections as fleet_connections

log = logging.getLogger(__name__)


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


# Each is kept per target (``targets.connections.current``): a target's samples, controller
# and policy ids live in its own ledger, where another target's may have the same ids.
_last_verdict: dict = {}  # the verdict for the latest sample, per process
# the controller's chunk target per (target, policy) as this process's last admission read it
_chunk_ms: dict[tuple[str, int], int] = {}
# policies whose duty cycle the controller had lowered at this process's last admission: their
# next admission reads the busy seconds in its one statement
_lowered: dict[tuple[str, int], bool] = {}


def forget_readings() -> None:
    """Drop what this process remembers of its last admissions (the verdict, the controller's
    chunk target and lowered duty cycles per policy): its next admission reads them afresh."""
    _last_verdict.clear()
    _chunk_ms.clear()
    _lowered.clear()


def _relative_probe(p95, baseline: dict, lim) -> tuple[float | None, str]:
    """The probe's limit from its idle baseline (``lim``: the policy's ``Limit``, its
    inflation and margin), and the reason when ``p95`` is over it."""
    base = baseline.get("p95")
    if base is None:
        return None, ""
    ratio, margin = lim.inflation, lim.margin_ms
    limit = lim.relative_ms(base)
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
            # with the controller on, the limit in ms is the one latency measure: the read's
            # absolute threshold no longer stops chunks by itself (its critical one still
            # pauses the policy)
            None if controlled(spec) else g["probe_p95_ms"],
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
    relative_limit, relative = _relative_probe(p.get("p95"), baseline, limit_of(spec))
    if controlled(spec):
        # one latency measure: with the controller on, the foreground's latency is judged by
        # its step alone — the signal's p99 over the period against the limit in ms — which
        # the reason, the badge (``current_state``) and the knobs all read
        relative_limit, relative = None, ""
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
    if not controlled(spec):
        shown["probe_p95_vs_idle"] = {
            "value": p.get("p95"),
            "threshold": relative_limit,
            "unit": "ms",
        }
    # the I/O signals the controller backs off on (``control_step``), with their thresholds
    pressure_max, fsync_max = io_thresholds(spec)
    shown["io_pressure"] = {"value": v.get("io_pressure"), "threshold": pressure_max, "unit": ""}
    shown["wal_fsync_ms"] = {"value": v.get("wal_fsync_ms"), "threshold": fsync_max, "unit": "ms"}
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
    here = fleet_connections.current()
    rest = (
        here,
        spec.qualified_table,
        tuple(sorted(spec.guard.items())),
        prometheus.source_of(spec),
        limit_of(spec),
        controlled(spec),
    )
    kept = next(((k[0], v) for k, v in _last_verdict.items() if k[1:] == rest), None)
    clock = now or timezone.now()
    paced = (kept is not None and kept[1].paced) or _lowered.get((here, run.policy_id), False)
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
        static = settings.RETENTION.get("GUARD_STATIC")
        if static is not None:
            # held where the setting says (the bench's frontier), not stepped
            knobs = (*static, None, None, HOLD, "")
        elif knobs is None or timezone.now() - knobs[3] >= _due(knobs[5], period):
            stepped = control_step(run.policy_id, spec)
            if stepped is not None:
                knobs = (
                    stepped.concurrency,
                    stepped.chunk_ms,
                    stepped.duty_cycle,
                    stepped.stepped_at,
                    stepped.quiet_until,
                    stepped.action,
                    stepped.reason,
                )
        if knobs is not None:
            concurrency, chunk_ms, duty = _clamped(spec, *knobs[:3])
            _chunk_ms[here, run.policy_id] = chunk_ms
            _lowered[here, run.policy_id] = duty < ceilings_of(spec).duty_cycle
            verdict = replace(verdict, concurrency=concurrency, duty_cycle=duty)
            if knobs[4] is not None and knobs[4] > clock and knobs[5] == FLOOR:
                return replace(
                    verdict,
                    admit=False,
                    paced=False,
                    reason=(
                        "over the budget at the controller's minimum: the policy's chunks wait"
                        f" until {timezone.localtime(knobs[4]).time().isoformat('milliseconds')}"
                        " to see whether the foreground is over it on its own"
                    ),
                )
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
            if knobs[5] == FOREGROUND:
                # the foreground is over its limit with none of our chunks in flight: not
                # cleanup's doing, but admission stays closed until a period within it
                return replace(verdict, admit=False, paced=False, reason=knobs[6])
            if verdict.admit and duty < ceilings_of(spec).duty_cycle:
                # the controller has lowered the duty cycle: it applies whatever the probe reads
                verdict = replace(verdict, paced=True)
    if verdict.paced:  # the duty cycle is judged per chunk, not per sample
        return _pace(spec, verdict, clock, busy=busy)
    return verdict


def target_chunk_ms(policy_id: int, spec) -> int:
    """The chunk transaction's target duration for the policy's next chunks: the controller's
    setting as this process's last admission read it, else the policy's ``target_chunk_ms``."""
    if not controlled(spec):
        return spec.target_chunk_ms
    key = (fleet_connections.current(), policy_id)
    return min(spec.target_chunk_ms, _chunk_ms.get(key, spec.target_chunk_ms))


_HEAD = (
    "SELECT s.id, s.taken_at, {busy}, c.concurrency, c.chunk_ms, c.duty_cycle, c.stepped_at,"
    " c.quiet_until, c.action, c.reason"
    " FROM (SELECT 1) AS one LEFT JOIN LATERAL"
    " (SELECT id, taken_at FROM runs_guardsample ORDER BY taken_at DESC LIMIT 1) AS s ON true"
    " LEFT JOIN runs_guardcontrol c ON c.policy_id = %s"
)


def _head(spec, policy_id: int, busy_at) -> tuple:
    """(id, taken_at) of the latest sample (Nones: no sample), with ``busy_at`` the policy's
    busy seconds of the duty window ending then (else None), and the controller's knobs
    (concurrency, chunk_ms, duty_cycle, stepped_at, quiet_until, action, reason; None before its first
    step):
    one statement."""
    if busy_at is None:
        row = _rows(sql.SQL(_HEAD).format(busy=sql.SQL("NULL")), [policy_id])[0]
    else:
        query = sql.SQL(_HEAD).format(busy=sql.SQL("({})").format(sql.SQL(_BUSY)))
        row = _rows(query, [*_busy_params(spec, busy_at), policy_id])[0]
    knobs = tuple(row[3:]) if row[3] is not None else None
    return row[0], row[1], row[2], knobs


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
