"""django-q2 entry points. They take ids, call the engine, and never fail from
django-q2's point of view because of a cleanup error: the ledger records it."""

from __future__ import annotations

import functools
import logging
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from core import timeouts
from retention.models import Policy
from runs.actions import ActionError
from runs.engine import dispatch, maintenance, schedules, worker
from runs.engine.worker import dead_letter
from runs.fleet import runs as fleet_runs
from runs.fleet.reconcile import reconcile_everywhere
from runs.models import Run
from targets import connections as fleet_connections

log = logging.getLogger(__name__)


def engine_task(func):
    """Every statement of the task waits for a lock at most ``timeouts.engine_lock_ms``
    (``timeouts.engine_session``)."""

    @functools.wraps(func)
    def run(*args, **kwargs):
        with timeouts.engine_session():
            return func(*args, **kwargs)

    return run


def _malformed(task: str, detail: str, payload: dict) -> str:
    dead_letter(chunk=None, run=None, error_class="malformed", sqlstate="", attempts=1,
                message=f"malformed {task} message: {detail}", extra={"payload": payload})  # fmt: skip
    return f"dead-lettered: {detail}"


@engine_task
def trigger_scheduled(policy_id=None, tick=None, **_ignored) -> str:
    """Fired by the policy's schedule; ``tick`` is django-q2's intended date of the firing."""
    try:
        tick_at = datetime.fromisoformat(tick) if isinstance(tick, str) else None
    except ValueError:
        tick_at = None
    if not isinstance(policy_id, int) or tick_at is None or tick_at.tzinfo is None:
        return _malformed("trigger", "needs an integer policy_id and an ISO tick with a timezone",
                          {"policy_id": repr(policy_id), "tick": repr(tick)})  # fmt: skip
    policy = Policy.objects.filter(pk=policy_id).first()
    if policy is None:
        return _malformed("trigger", f"policy {policy_id} not found", {"policy_id": policy_id})
    now = _now()
    with transaction.atomic():
        timeouts.set_local(timeouts.reconciler_budget()[1])
        try:
            if now - tick_at > schedules.DUE_GRACE:
                outcome = _late_firing(policy, tick_at, now)
            else:
                # one run per target of the policy (the control database's alone for a policy
                # without targets, as always)
                made = fleet_runs.trigger_everywhere(policy, tick=tick_at)
                outcome = "; ".join(
                    f"{note} run {run.run_key} ({run.state})" if run else f"{name}: {note}"
                    for name, run, note in made
                )
        except ActionError as exc:
            outcome = f"not triggered: {exc}"
        schedules.arm(policy, after=max(tick_at, now))
    return outcome


def _late_firing(policy, tick_at: datetime, now: datetime) -> str:
    """A firing long after its tick (the cluster was down) follows the policy's catch-up rule,
    exactly as the reconciler would: ``none`` runs nothing, ``latest`` one run for the newest
    missed tick with the older ones recorded on it — never a run for the oldest one as well —
    on every target of the policy."""
    version = policy.approved_version
    late = f"fired {int((now - tick_at).total_seconds())} s after its tick {tick_at.isoformat()}"
    if version is None or version.parsed.catch_up == "none":
        return f"{late}: skipped (catch_up = none)"
    made = fleet_runs.catch_up_everywhere(policy, now)
    if not any(run for _name, run, _note in made):
        notes = [f"{name}: {note}" for name, run, note in made if note != "nothing to catch up"]
        return f"{late}: nothing to catch up" + (f" ({'; '.join(notes)})" if notes else "")
    return f"{late}: " + "; ".join(
        f"caught up with run {run.run_key} ({len(run.skipped_ticks)} skipped)"
        if run
        else f"{name}: {note}"
        for name, run, note in made
    )


def _now():
    return timezone.now()


def on_target(func):
    """A message that names a target (``target=NAME``, runs.engine.dispatch) runs on it; an
    unreachable target is noted on its registry row and the message ends (the reconciler's
    pass over that target re-publishes its leases when it answers again)."""

    @functools.wraps(func)
    def run(*args, target=None, **kwargs):
        if target is None or target == fleet_connections.DEFAULT:
            return func(*args, **kwargs)
        if not isinstance(target, str) or not fleet_connections.valid_name(target):
            return _malformed("task", "target must be a target's name", {"target": repr(target)})
        try:
            with fleet_connections.on(target):
                result = func(*args, **kwargs)
        except fleet_connections.TargetError as exc:
            return {"stopped": str(exc), "continue": False}
        finally:
            fleet_connections.close_all()
        return result

    return run


@on_target
@engine_task
def drain_lease(run_id=None, slot=None, generation=None, *extra) -> dict | str:
    """One lease: drain chunks of the run for a time budget, then publish the next generation."""
    if extra or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (run_id, slot, generation)
    ):
        return _malformed("drain", "needs integer run_id, slot and generation",
                          {"args": repr((run_id, slot, generation, *extra))})  # fmt: skip

    try:
        stats = worker.drain(run_id, slot=slot, generation=generation)
        if stats.get("stopped") == "run not found":
            return _malformed("drain", f"run {run_id} not found", {"run_id": run_id})
        if stats["continue"]:
            dispatch.continue_lease(run_id, slot, generation)
    except DatabaseError as exc:
        # The database went away: the lease shows no heartbeat and the reconciler re-publishes it.
        connection.close()
        log.warning("lease %s/%s ended on a database error: %s", run_id, slot, exc)
        return {"stopped": f"database error: {exc.__class__.__name__}", "continue": False}
    return stats


@engine_task
def reconcile() -> dict:
    """One reconciler pass over the control database and then each target's ledger."""
    report = reconcile_everywhere()
    return {k: v for k, v in report.items() if v}


@on_target
@engine_task
def vacuum_target(run_id=None) -> str:
    """``VACUUM (ANALYZE)`` the target of a drained run (``runs.engine.maintenance.vacuum_target``:
    once, outside any transaction, bounded to fit the task timeout, its outcome recorded on
    the run)."""
    if not isinstance(run_id, int) or isinstance(run_id, bool):
        return _malformed("vacuum", "needs an integer run_id", {"run_id": repr(run_id)})
    if not Run.objects.filter(pk=run_id).exists():
        return _malformed("vacuum", f"run {run_id} not found", {"run_id": run_id})
    return maintenance.vacuum_target(run_id)
