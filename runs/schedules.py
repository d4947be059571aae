"""One django-q2 Schedule per enabled policy, routed to the cleanup cluster.

django-q2 evaluates cron in one server timezone, so each policy's schedule is
a one-shot armed for the policy's next tick, computed here in the policy's own
timezone; the trigger task re-arms it for the tick after. django-q2's
``intended_date_kwarg`` hands the scheduled tick to the task, so the run's
period and cutoff come from the tick, not from when the task ran. Missed
ticks are the reconciler's job (one catch-up run), never django-q2's.
"""

from __future__ import annotations

from datetime import datetime

from croniter import croniter
from django.utils import timezone

from retention.schedule_math import next_tick

TRIGGER_TASK = "runs.tasks.trigger_scheduled"
RECONCILE_TASK = "runs.tasks.reconcile"
CLUSTER = "cleanup"


def schedule_name(policy) -> str:
    return f"retention:trigger:{policy.slug}"


def arm(policy, *, after: datetime):
    """Set the policy's schedule to fire at its first tick after ``after``."""
    from django_q.models import Schedule

    if not policy.enabled or policy.approved_version is None:
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


def _fits(policy, when: datetime) -> bool:
    import zoneinfo

    local = when.astimezone(zoneinfo.ZoneInfo(policy.timezone)).replace(tzinfo=None)
    return croniter.match(policy.schedule, local)


def sync_policy_schedule(policy) -> None:
    """Create, update or remove the policy's trigger schedule to match the policy."""
    from django_q.models import Schedule

    current = Schedule.objects.filter(name=schedule_name(policy)).first()
    if not policy.enabled or policy.approved_version is None:
        if current is not None:
            current.delete()
        return
    if current is None or current.repeats == 0 or not _fits(policy, current.next_run):
        arm(policy, after=timezone.now())


def ensure_system_schedules() -> None:
    """The reconciler every minute, and every policy's trigger schedule."""
    from django_q.models import Schedule

    from retention.models import Policy

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
