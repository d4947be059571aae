"""What the dashboard pages show: the per-policy overview and a run's page.

Everything is read with a fixed number of aggregate queries per page (grouped in
SQL, never per chunk or per audit row in Python), plus one call per policy to the
guard and drain-window interfaces, so the pages stay fast with millions of rows.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, Sum
from django.utils import timezone

from core.filters import QueryFilters
from retention.models import KillSwitch, Policy, PolicyVersion
from retention.schedule_math import period_label
from retention.spec import parse_retention
from runs import forecast, guard
from runs.models import AuditRecord, Chunk, DeadLetter, Lease, Run
from runs.schedules import schedule_name

# Policy states as the overview names them (and colours them: see app.css .state-*).
ACTIVE, PAUSED, AWAITING, ATTENTION, DISABLED = (
    "active",
    "paused",
    "awaiting approval",
    "needs attention",
    "disabled",
)


def human_duration(seconds: float | None) -> str:
    """``93784`` → ``1d 2h``; ``None`` → ``—``."""
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {s:02d}s" if minutes < 10 else f"{minutes}m"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d {h}h"


def _age(now: datetime, then: datetime | None) -> float | None:
    return (now - then).total_seconds() if then else None


def broker_queue(now: datetime | None = None) -> dict:
    """Messages waiting in django-q2's ORM queue (lock in the past = not yet taken)."""
    from django_q.models import OrmQ

    now = now or timezone.now()
    row = OrmQ.objects.filter(lock__lte=now).aggregate(n=Count("id"), oldest=Min("lock"))
    age = _age(now, row["oldest"])
    return {"waiting": row["n"], "oldest_age_s": age, "oldest_age": human_duration(age)}


def _current_and_latest_runs(policy_ids: list[int]) -> tuple[dict[int, Run], dict[int, Run]]:
    """Per policy: the open run being worked (oldest open tick) and the latest run."""
    runs = Run.objects.filter(policy_id__in=policy_ids)
    latest = {
        r.policy_id: r
        for r in runs.order_by("policy_id", "-tick", "-id")
        .distinct("policy_id")
        .select_related("policy_version")
    }
    current = {
        r.policy_id: r
        for r in runs.filter(state__in=Run.OPEN)
        .exclude(state=Run.State.WAITING)
        .order_by("policy_id", "tick", "id")
        .distinct("policy_id")
        .select_related("policy_version")
    }
    for policy_id, run in latest.items():
        current.setdefault(policy_id, run)
    return current, latest


def run_progress(run_ids: list[int], now: datetime) -> dict[int, dict]:
    """Chunk counts, rows deleted, retries, queue age and throttle reason of each run."""
    progress: dict[int, dict] = {
        rid: {
            "chunks": {s: 0 for s in Chunk.State.values},
            "planned_rows": 0,
            "retries": 0,
            "oldest_pending": None,
            "rows_deleted": 0,
            "last_commit": None,
            "throttle_reason": "",
        }
        for rid in run_ids
    }
    if not run_ids:
        return progress
    for row in (
        Chunk.objects.filter(run_id__in=run_ids)
        .values("run_id", "state")
        .annotate(
            n=Count("id"),
            planned=Sum("planned_rows"),
            retries=Sum(F("attempts") - 1, filter=Q(attempts__gt=1)),
            oldest=Min("created_at"),
        )
        .order_by()
    ):
        p = progress[row["run_id"]]
        p["chunks"][row["state"]] = row["n"]
        if row["state"] != Chunk.State.SPLIT:
            p["planned_rows"] += row["planned"] or 0
        p["retries"] += row["retries"] or 0
        if row["state"] == Chunk.State.PENDING:
            p["oldest_pending"] = row["oldest"]
    for row in (
        AuditRecord.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(rows=Sum("rows_deleted"), last=Max("committed_at"))
        .order_by()
    ):
        progress[row["run_id"]]["rows_deleted"] = row["rows"] or 0
        progress[row["run_id"]]["last_commit"] = row["last"]
    for run_id, reason in (
        Chunk.objects.filter(run_id__in=run_ids, state=Chunk.State.PENDING, not_before__gt=now)
        .exclude(throttle_reason="")
        .order_by("run_id", "-not_before")
        .distinct("run_id")
        .values_list("run_id", "throttle_reason")
    ):
        progress[run_id]["throttle_reason"] = reason
    for p in progress.values():
        p["queue_age_s"] = _age(now, p["oldest_pending"])
        p["queue_age"] = human_duration(p["queue_age_s"])
        p["last_commit_age"] = human_duration(_age(now, p["last_commit"]))
        counted = sum(n for s, n in p["chunks"].items() if s not in (Chunk.State.SPLIT,))
        p["chunks_total"] = counted
        p["chunks_done"] = p["chunks"][Chunk.State.DONE]
    return progress


def _percent(run: Run, p: dict) -> int:
    if run.state == Run.State.DRAINED:
        return 100
    target = run.expected_rows or p["planned_rows"]
    if target:
        return max(0, min(100, round(100 * p["rows_deleted"] / target)))
    if p["chunks_total"]:
        return round(100 * p["chunks_done"] / p["chunks_total"])
    return 0


def _eta_s(run: Run, p: dict, window: dict, now: datetime) -> float | None:
    """The drain-window forecast's ETA; failing that, this run's own rate so far."""
    if window.get("eta_s") is not None:
        return window["eta_s"]
    if run.is_terminal or not run.started_at or not p["rows_deleted"] or not run.expected_rows:
        return None
    elapsed = ((p["last_commit"] or now) - run.started_at).total_seconds()
    if elapsed <= 0:
        return None
    remaining = max(0, run.expected_rows - p["rows_deleted"])
    return remaining / (p["rows_deleted"] / elapsed)


def policy_state(policy: Policy, run: Run | None, dead_letters: int, guard_level: str) -> str:
    if not policy.enabled:
        return DISABLED
    if not policy.has_approved:
        return AWAITING
    if (
        dead_letters
        or guard_level == "critical"
        or (run and run.state in (Run.State.ATTENTION, Run.State.CONFIRM))
    ):
        return ATTENTION
    if policy.paused or (run and run.state == Run.State.PAUSED):
        return PAUSED
    return ACTIVE


def overview_context(request) -> dict:
    now = timezone.now()
    read = QueryFilters(request.GET)
    slug = read.text("policy")
    policies_qs = Policy.objects.annotate(
        has_approved=Exists(
            PolicyVersion.objects.filter(policy=OuterRef("pk"), state=PolicyVersion.State.APPROVED)
        ),
        has_submitted=Exists(
            PolicyVersion.objects.filter(policy=OuterRef("pk"), state=PolicyVersion.State.SUBMITTED)
        ),
    )
    if slug:
        policies_qs = policies_qs.filter(slug=slug)
    if read.errors:
        policies_qs = policies_qs.none()
    policies = list(policies_qs)
    ids = [p.id for p in policies]
    current, latest = _current_and_latest_runs(ids)
    progress = run_progress([r.pk for r in current.values()], now)
    dead = dict(
        DeadLetter.objects.filter(resolution=DeadLetter.Resolution.OPEN, run__policy_id__in=ids)
        .values_list("run__policy_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    slos = dict(
        PolicyVersion.objects.filter(policy_id__in=ids, state=PolicyVersion.State.APPROVED)
        .exclude(spec__max_backlog_age=None)
        .values_list("policy_id", "spec__max_backlog_age")
    )  # one query for every policy's backlog SLO
    from django_q.models import Schedule

    next_runs = dict(
        Schedule.objects.filter(name__in=[schedule_name(p) for p in policies]).values_list(
            "name", "next_run"
        )
    )
    rows = []
    for policy in policies:
        run = current.get(policy.id)
        p = progress.get(run.pk) if run else None
        window = forecast.drain_window(policy)
        guard_state = guard.current_state(policy)
        dead_n = dead.get(policy.id, 0)
        eta = _eta_s(run, p, window, now) if run else window.get("eta_s")
        backlog_age = window.get("oldest_eligible_age_s")
        throttle = (p or {}).get("throttle_reason") or "; ".join(guard_state.get("reasons") or [])
        rows.append(
            {
                "policy": policy,
                "state": policy_state(policy, run, dead_n, guard_state.get("level", "ok")),
                "run": run,
                "last_run": latest.get(policy.id),
                "progress": p,
                "percent": _percent(run, p) if run else 0,
                "eta": human_duration(eta) if eta is not None else "—",
                "next_run": next_runs.get(schedule_name(policy)),
                "window": window,
                "backlog_age": human_duration(backlog_age),
                "slo": backlog_slo(slos.get(policy.id), window),
                "guard": guard_state,
                "throttle_reason": throttle,
                "dead_letters": dead_n,
            }
        )
    switch = KillSwitch.objects.filter(name="global").first()
    return {
        "policy_rows": rows,
        "policy_filter": slug,
        "filter_errors": read.errors,
        "kill_switch": switch,
        "kill_switch_on": bool(switch and switch.on),
        "broker": broker_queue(now),
        "now": now,
    }


def backlog_slo(max_backlog_age: str | None, window: dict) -> dict | None:
    """The policy's backlog SLO against how long its oldest eligible row is overdue
    (None when the approved version sets no SLO)."""
    if not max_backlog_age:
        return None
    limit = parse_retention(max_backlog_age).total_seconds()
    overdue = window.get("overdue_s")
    return {
        "limit": max_backlog_age,
        "overdue": human_duration(max(0, overdue)) if overdue is not None else "—",
        "met": overdue is None or overdue <= limit,
    }


# ---------------------------------------------------------------- run page

CHART_BUCKETS = 60


def chunk_breakdown(run: Run, now: datetime) -> tuple[dict, list[dict], int]:
    """One scan of the run's chunks, grouped by (tenant, state): the run's progress numbers
    (as ``run_progress``), per-tenant progress, and how many chunks are admissible now."""
    p = {
        "chunks": {s: 0 for s in Chunk.State.values},
        "planned_rows": 0,
        "retries": 0,
        "oldest_pending": None,
    }
    tenants: dict[str, dict] = {}
    admissible = 0
    for row in (
        Chunk.objects.filter(run=run)
        .values("tenant", "state")
        .annotate(
            n=Count("id"),
            planned=Sum("planned_rows"),
            retries=Sum(F("attempts") - 1, filter=Q(attempts__gt=1)),
            oldest=Min("created_at"),
            ready=Count("id", filter=Q(not_before__lte=now)),
        )
        .order_by()
    ):
        state = row["state"]
        p["chunks"][state] += row["n"]
        p["retries"] += row["retries"] or 0
        if state == Chunk.State.PENDING:
            admissible += row["ready"]
            if p["oldest_pending"] is None or row["oldest"] < p["oldest_pending"]:
                p["oldest_pending"] = row["oldest"]
        if state == Chunk.State.SPLIT:
            continue
        p["planned_rows"] += row["planned"] or 0
        t = tenants.setdefault(
            row["tenant"],
            {"tenant": row["tenant"], "chunks": 0, "done": 0, "dead": 0, "planned": 0},
        )
        t["chunks"] += row["n"]
        t["planned"] += row["planned"] or 0
        if state == Chunk.State.DONE:
            t["done"] += row["n"]
        elif state == Chunk.State.DEAD:
            t["dead"] += row["n"]
    p["chunks_total"] = sum(n for s, n in p["chunks"].items() if s != Chunk.State.SPLIT)
    p["chunks_done"] = p["chunks"][Chunk.State.DONE]
    p["queue_age_s"] = _age(now, p["oldest_pending"])
    p["queue_age"] = human_duration(p["queue_age_s"])
    for t in tenants.values():
        t["rows_deleted"] = 0
        t["percent"] = round(100 * t["done"] / t["chunks"]) if t["chunks"] else 100
    return p, sorted(tenants.values(), key=lambda t: t["tenant"]), admissible


def audit_breakdown(run: Run, buckets: int = CHART_BUCKETS) -> dict:
    """One scan of the run's audit rows: rows deleted per tenant and per time bucket (for the
    rows/s chart: at most ``buckets`` buckets of at least one second), first and last commit."""
    sql = """
        WITH a AS MATERIALIZED (
            SELECT tenant, rows_deleted, committed_at FROM runs_auditrecord WHERE run_id = %(run)s
        ), span AS (
            SELECT min(committed_at) AS lo, max(committed_at) AS hi,
                   greatest(extract(epoch FROM max(committed_at) - min(committed_at)) / %(n)s,
                            1.0)::float8 AS width
            FROM a
        )
        SELECT span.lo, span.hi, span.width, GROUPING(a.tenant) AS by_bucket, a.tenant,
               least(floor(extract(epoch FROM a.committed_at - span.lo) / span.width)::int,
                     %(n)s - 1) AS bucket,
               sum(a.rows_deleted), count(*)
        FROM a CROSS JOIN span
        GROUP BY span.lo, span.hi, span.width, GROUPING SETS ((a.tenant), (bucket))
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"run": run.pk, "n": buckets})
        rows = cur.fetchall()
    out = {"points": [], "lo": None, "hi": None, "bucket_s": 0, "peak": 0, "by_tenant": {}}
    if not rows:
        out["rows_deleted"] = 0
        return out
    lo, hi, width = rows[0][0], rows[0][1], float(rows[0][2])
    by_bucket: dict[int, tuple[int, int]] = {}
    for _, _, _, is_bucket_row, tenant, bucket, deleted, n in rows:
        if is_bucket_row:
            by_bucket[bucket] = (deleted, n)
        else:
            out["by_tenant"][tenant] = deleted
    used = min(buckets, int((hi - lo).total_seconds() // width) + 1)
    for b in range(used):
        deleted, n = by_bucket.get(b, (0, 0))
        out["points"].append({"bucket": b, "rate": float(deleted) / width, "chunks": n})
    out.update(
        lo=lo,
        hi=hi,
        bucket_s=width,
        peak=max(pt["rate"] for pt in out["points"]),
        rows_deleted=sum(out["by_tenant"].values()),
    )
    return out


def svg_bars(values: list[float], *, width: int = 600, height: int = 140) -> list[dict]:
    """Rectangles for a bar chart of ``values`` scaled to the tallest one."""
    if not values:
        return []
    peak = max(values) or 1
    step = width / len(values)
    bars = []
    for i, value in enumerate(values):
        h = round(height * value / peak, 1)
        bars.append(
            {"x": round(i * step, 1), "y": round(height - h, 1), "w": max(1, step - 1), "h": h}
        )
    return bars


def run_page_context(run: Run) -> dict:
    now = timezone.now()
    p, tenants, admissible = chunk_breakdown(run, now)
    rates = audit_breakdown(run)
    p["rows_deleted"] = rates["rows_deleted"]
    p["last_commit"] = rates["hi"]
    p["throttle_reason"] = (
        Chunk.objects.filter(run=run, state=Chunk.State.PENDING, not_before__gt=now)
        .exclude(throttle_reason="")
        .order_by("-not_before")
        .values_list("throttle_reason", flat=True)
        .first()
        or ""
    )
    for t in tenants:
        t["rows_deleted"] = rates["by_tenant"].get(t["tenant"], 0)
    window = forecast.drain_window(run.policy)
    guard_state = guard.current_state(run.policy)
    last = (
        AuditRecord.objects.filter(run=run)
        .order_by("-chain_seq")
        .values(
            "chain_seq", "chunk_id", "tenant", "key_from", "key_to", "rows_deleted", "committed_at"
        )
        .first()
    )
    histogram_states = [s for s in Chunk.State.values if s != Chunk.State.SPLIT] + ["split"]
    counts = [p["chunks"][s] for s in histogram_states]
    hist_bars = svg_bars([float(c) for c in counts], width=400, height=100)
    histogram = [
        {"state": s, "count": c, "bar": b}
        for s, c, b in zip(histogram_states, counts, hist_bars, strict=True)
    ]
    troubled = list(
        Chunk.objects.filter(run=run)
        .filter(Q(attempts__gt=1) | ~Q(throttle_reason="") | ~Q(last_error=""))
        .order_by("-not_before")
        .values(
            "id", "tenant", "key_from", "key_to", "state", "attempts", "not_before",
            "throttle_reason", "last_error", "last_sqlstate",
        )[:50]
    )  # fmt: skip
    letters = list(
        DeadLetter.objects.filter(run=run, resolution=DeadLetter.Resolution.OPEN).order_by(
            "-created_at"
        )[:20]
    )
    leases = list(Lease.objects.filter(run=run).order_by("slot"))
    for lease in leases:
        lease.enqueued_age = human_duration(_age(now, lease.enqueued_at))
        lease.heartbeat_age = human_duration(_age(now, lease.heartbeat_at))
    eta = _eta_s(run, p, window, now)
    return {
        "run": run,
        "period": period_label(run.policy, run.tick),
        "progress": p,
        "percent": _percent(run, p),
        "eta": human_duration(eta) if eta is not None else "—",
        "window": window,
        "guard": guard_state,
        "last": last,
        "last_age": human_duration(_age(now, last["committed_at"])) if last else "—",
        "histogram": histogram,
        "rates": rates,
        "rate_bars": svg_bars([pt["rate"] for pt in rates["points"]]),
        "peak_rate": round(rates["peak"]),
        "troubled": troubled,
        "letters": letters,
        "leases": leases,
        "admissible": admissible,
        "tenants": tenants,
        "broker": broker_queue(now),
        "now": now,
    }
