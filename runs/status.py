"""A run's status, derived from its chunk and audit rows (no counters stored on the run)."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Max, Min
from django.utils import timezone

from runs.models import Chunk, DeadLetter, Run


def run_status(run: Run) -> dict:
    totals = run.chunk_totals()
    last = run.audit_records.aggregate(at=Max("committed_at"))["at"]
    oldest_open = Chunk.objects.filter(run=run, state=Chunk.State.PENDING).aggregate(
        at=Min("created_at")
    )["at"]
    now = timezone.now()
    throttled = (
        Chunk.objects.filter(run=run, state=Chunk.State.PENDING, not_before__gt=now)
        .exclude(throttle_reason="")
        .values_list("throttle_reason", flat=True)
        .first()
    )
    pending = totals[Chunk.State.PENDING]
    reference = last or run.started_at or run.created_at
    since_progress = (now - reference).total_seconds()
    if run.state != Run.State.ACTIVE:
        health = run.state
    elif throttled:
        health = "throttled"
    elif pending and (
        since_progress is None or since_progress > 3 * settings.RETENTION["LEASE_BUDGET_S"]
    ):
        health = "stuck"
    else:
        health = "progressing" if pending or not run.planner_done else "finishing"
    return {
        "run_key": run.run_key,
        "health": health,
        "state": run.state,
        "state_reason": run.state_reason,
        "policy": run.policy.slug,
        "policy_version": run.policy_version.number,
        "tick": run.tick.isoformat(),
        "cutoff": run.cutoff.isoformat(),
        "pass": run.pass_no,
        "planner_done": run.planner_done,
        "chunks": {state: totals[state] for state in Chunk.State.values},
        "rows_deleted": totals["rows_deleted"],
        "rows_planned": totals["planned_rows"],
        "expected_rows": run.expected_rows,
        "last_progress_at": last.isoformat() if last else None,
        "oldest_open_chunk_age_s": round((now - oldest_open).total_seconds(), 1)
        if oldest_open
        else None,
        "throttle_reason": throttled or "",
        "open_dead_letters": DeadLetter.objects.filter(
            run=run, resolution=DeadLetter.Resolution.OPEN
        ).count(),
        "skipped_ticks": len(run.skipped_ticks or []),
        "verification": run.verification,
        "drain_window": _window(run),
    }


def _window(run: Run) -> dict:
    from runs.forecast import drain_window

    window = drain_window(run.policy, fresh=True)
    return {k: window[k] for k in ("backlog_rows", "rows_per_s", "eta_s", "verdict", "explanation")}
