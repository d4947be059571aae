"""One django-q2 Schedule per enabled policy, routed to the cleanup cluster.

django-q2 evaluates cron in one server timezone, so each policy's schedule is
a one-shot armed for the policy's next tick, computed here in the policy's own
timezone; the trigger task re-arms it for the tick after. django-q2's
``intended_date_kwarg`` hands the scheduled tick to the task, so the run's
period and cutoff come from the tick, not from when the task ran. Missed
ticks are the reconciler's job (one catch-up run), never django-q2's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone
from django_q.models import Schedule

from retention.models import Policy
from retention.schedule_math import is_tick, next_tick

TRIGGER_TASK = "runs.tasks.trigger_scheduled"
RECONCILE_TASK = "runs.tasks.reconcile"
CLUSTER = "cleanup"
# Every callable a schedule row may name; the database refuses any other (a CHECK
# constraint, runs/migrations/0010_schedule_callables.py — widen both together).
SCHEDULED_TASKS = (TRIGGER_TASK, RECONCILE_TASK, "demo.tasks.send_due_reminders")


def schedule_name(policy) -> str:
    return f"retention:trigger:{policy.slug}"


DUE_GRACE = timedelta(minutes=2)  # a firing this late is still on time (django-q2 polls ~30 s)


def arm(policy, *, after: datetime, version=None):
    """Set the policy's schedule to fire at its first tick after ``after``.

    Only a policy without an approved version loses its schedule here; a disabled one
    keeps it (its firings create nothing) — the enable/disable actions decide, not a
    firing that happens to see ``enabled`` off. ``version``: the policy's approved version as
    the caller read it (read here when not given)."""
    if (version or policy.approved_version) is None:
        Schedule.objects.filter(name=schedule_name(policy)).delete()
        return None
    schedule, _ = Schedule.objects.update_or_create(
        name=schedule_name(policy),
        defaults={
            "func": TRIGGER_TASK,
            "kwargs": repr({"policy_id": policy.pk}),
            "schedule_type": Schedule.ONCE,
            "repeats": 1,
            "next_run": next_tick(policy, after),
            "cluster": CLUSTER,
            "intended_date_kwarg": "tick",
        },
    )
    return schedule


def schedule_problem(policy, schedule, now: datetime) -> str:
    """Why the policy's schedule is not armed for its true next tick ('' when it is).

    A schedule that is due (its tick passed less than ``DUE_GRACE`` ago and django-q2 has
    not fired it yet) is left alone: re-arming it would lose that tick."""
    if schedule is None:
        return "missing"
    if schedule.func != TRIGGER_TASK or schedule.cluster != CLUSTER:
        return "not the policy's trigger"
    if schedule.repeats == 0:
        return "already fired and not re-armed"
    if schedule.next_run is None:
        return "no next run"
    if not is_tick(policy, schedule.next_run):
        return "armed for a time the policy's schedule does not have"
    if schedule.next_run <= now:
        return "" if now - schedule.next_run < DUE_GRACE else "armed for a time in the past"
    if schedule.next_run != next_tick(policy, now):
        return "armed for a later tick than the next one"
    return ""


def sync_policy_schedule(policy, *, now: datetime | None = None, version=None) -> str:
    """Create, repair or remove the policy's trigger schedule to match the policy: armed for
    its true next tick while it is enabled and approved, absent otherwise. Returns what was
    wrong ('' when nothing was). Missed ticks are the catch-up rule's, never re-fired here.
    ``version``: the policy's approved version as the caller read it (read here when not
    given)."""
    now = now or timezone.now()
    current = Schedule.objects.filter(name=schedule_name(policy)).first()
    version = version or (policy.approved_version if policy.enabled else None)
    if not policy.enabled or version is None:
        if current is not None:
            current.delete()
            return "removed"
        return ""
    problem = schedule_problem(policy, current, now)
    if problem:
        arm(policy, after=now, version=version)
    return problem


def ensure_system_schedules() -> None:
    """The reconciler every minute, and every policy's trigger schedule."""

    Schedule.objects.update_or_create(
        name="retention:reconciler",
        defaults={
            "func": RECONCILE_TASK,
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
            "cluster": CLUSTER,
            "next_run": timezone.now(),
        },
    )
    for policy in Policy.objects.all():
        sync_policy_schedule(policy)
