"""A run's status, derived from its chunk and audit rows (no counters stored on the run)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from core import timeouts
from retention.models import KillSwitch
from runs.counts import count_totals
from runs.engine import guard
from runs.evidence import archives
from runs.forecast import drain_window
from runs.models import Chunk, DeadLetter, Run
from runs.progress import RunProgress, progress_for, stopped_by

UNREAD = object()


def run_status(run: Run) -> dict:
    now = timezone.now()
    p = progress_for([run.pk], now=now)[run.pk]
    last = p.last_commit
    health, waiting_reason, throttled = health_of(run, p, now)
    return {
        "run_key": run.run_key,
        "health": health,
        "waiting_reason": waiting_reason,
        "state": run.state,
        "state_reason": run.state_reason,
        "policy": run.policy.slug,
        "policy_version": run.policy_version.number,
        "tick": run.tick.isoformat(),
        "cutoff": run.cutoff.isoformat(),
        **rollout_facts(run),
        "pass": run.pass_no,
        "planner_done": run.planner_done,
        **p.as_dict(),
        # rows written to archive objects before they were deleted (docs/policies.md,
        # "Archiving before deleting"); 0 for a policy that does not archive
        "archived_rows": archives.archived_rows(run.pk),
        "admission_count": run.expected_rows,
        "last_progress_at": last.isoformat() if last else None,
        "oldest_open_chunk_age_s": round(p.queue_age_s, 1) if p.queue_age_s is not None else None,
        "throttle_reason": throttled,
        "open_dead_letters": DeadLetter.objects.filter(
            run=run, resolution=DeadLetter.Resolution.OPEN
        ).count(),
        "skipped_ticks": len(run.skipped_ticks or []),
        "verification": run.verification,
        # what the run left for VACUUM and what was done about it (runs.engine.maintenance)
        "vacuum": (run.verification or {}).get("vacuum_note"),
        "drain_window": _window(run),
        # the guard's latency controller for the run's policy (runs.engine.guard)
        "guard_control": _control(run),
        # and its steps while this run drained: whether the run kept the foreground's budget
        "guard_over_run": guard.run_budget(run),
    }


def _control(run: Run) -> dict | None:
    control = guard.control_summary(run.policy, run.policy_version.parsed)
    if control is None:
        return None
    return {**control, "stepped_at": control["stepped_at"].isoformat()}


def rollout_facts(run: Run) -> dict:
    """What the run's rollout stage says (docs/policies.md, "Rolling out a policy"): the stage;
    a slice run's bound; a count run's ``rows_counted`` (what a full run of its cutoff would
    delete) and the rest of its counts (``runs.counts``)."""
    out: dict = {"rollout": run.rollout}
    if run.slice_bound is not None:
        out["slice_bound"] = run.slice_bound.isoformat()
    if run.counts_only:
        totals = count_totals(run)
        out["rows_counted"] = totals["rows"]
        out["counts"] = {
            "kept": totals["kept"],
            "held": totals["held"],
            "deferred_by_cascades": totals["cascade"],
            "chunks": totals["chunks"],
            "tenants": totals["tenants"],
            "months": totals["ages"],
        }
    return out


def health_of(run: Run, p: RunProgress, now, *, switch=UNREAD) -> tuple[str, str, str]:
    """(health, why it is not progressing, throttle reason). An active run that an operator
    decision stops (its policy paused, the global kill switch on: ``progress.stopped_by``)
    says so first, whatever else is true ("paused" or "stopped"); ``switch`` is the caller's
    reading of the kill switch row (read here when not given). "progressing" means a chunk
    committed within the guard window (``RETENTION_GUARD_DUTY_WINDOW_S``) or one is in flight
    (claimed, its outcome not recorded yet, within the longest a chunk may take). An active
    run with no admitted chunk for longer always says why: throttled by the guard (the
    latest throttled chunk's reason, or the guard holding the partition step back), waiting
    for a reason the lease recorded on the run (planning postponed, ceilings full, a
    partition backing off: ``worker.note_idle``), blocked on a lock or retrying after an
    error, no worker alive, or workers alive that admitted nothing.

    The throttle reason is the progress model's (``runs.progress``: the latest reason of a
    pending chunk throttled within one lease budget)."""
    recent = timedelta(seconds=settings.RETENTION["LEASE_BUDGET_S"])
    window = timedelta(seconds=settings.RETENTION["GUARD_DUTY_WINDOW_S"])
    last = p.last_commit
    pending_chunks = Chunk.objects.pending().filter(run=run)
    throttled = p.throttle_reason
    if run.state != Run.State.ACTIVE:
        return run.state, run.state_reason, throttled
    if switch is UNREAD:
        switch = KillSwitch.objects.filter(name="global").first()
    stopped = stopped_by(run, run.policy, switch)
    if stopped:
        return stopped[0], stopped[1], throttled
    pending = p.chunks[Chunk.State.PENDING]
    if last is not None and now - last <= window:
        return "progressing", "", throttled
    spec = run.policy_version.parsed
    in_flight = timedelta(
        milliseconds=timeouts.chunk_worst_ms(spec.lock_timeout_ms, spec.statement_timeout_ms)
    )
    if pending and pending_chunks.filter(claimed_at__gt=now - in_flight).exists():
        return "progressing", "", throttled  # a chunk transaction is under way
    if run.planner_done and not pending:
        return "finishing", "", throttled
    started = run.started_at or run.created_at
    if throttled:
        return "throttled", f"throttled: {throttled}", throttled
    idle = (
        run.idle_reason
        if run.idle_since is not None
        and now - run.idle_since <= recent
        and (last is None or run.idle_since > last)
        else ""
    )
    if idle:
        return ("throttled" if idle.startswith("throttled") else "waiting"), idle, throttled
    failing = (
        pending_chunks.filter(attempts__gt=0)
        .exclude(last_error="")
        .order_by("-not_before")
        .values_list("last_error", flat=True)
        .first()
    )
    if failing:
        kind = "blocked on a lock" if "lock" in failing.lower() else "retrying after an error"
        return "waiting", f"{kind}: {failing}", throttled
    if now - started <= recent:
        return "starting", "", throttled
    beat = run.leases.aggregate(at=Max("heartbeat_at"))["at"]
    since = f"since {last:%H:%M:%S}" if last else "yet"
    if beat is None or now - beat > 3 * recent:
        return "stuck", f"no worker alive: no lease heartbeat {since}", throttled
    return (
        "waiting",
        f"a worker is alive but admitted no chunk {since}: concurrency ceilings full or an "
        "operator decision in progress",
        throttled,
    )


def _window(run: Run) -> dict:
    window = drain_window(run.policy, fresh=True)
    return {k: window[k] for k in ("backlog_rows", "rows_per_s", "eta_s", "verdict", "explanation")}
