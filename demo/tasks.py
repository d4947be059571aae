"""The demo's deadline-bound job: renewal reminders must go out on time, whatever cleanup does.

It runs on its own django-q2 cluster ("deadline"), so a saturated cleanup lane
cannot delay it; each firing reports how late it started.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone
from django_q.models import Schedule

DEADLINE_CLUSTER = "deadline"
BATCH = 500


def send_due_reminders(due=None, **_ignored) -> dict:
    """Mark up to BATCH pending reminders that are due as sent. ``due`` is the moment the
    job was meant to run (the schedule's intended date, or the enqueuer's clock)."""
    started = timezone.now()
    due_at = datetime.fromisoformat(due) if isinstance(due, str) else started
    sent = 0
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT to_regclass('marketplace.renewal_reminders') IS NOT NULL")
        if cur.fetchone()[0]:
            cur.execute(
                "UPDATE marketplace.renewal_reminders SET state = 'sent', sent_at = now()"
                " WHERE id IN (SELECT id FROM marketplace.renewal_reminders"
                " WHERE state = 'pending' AND due_at <= now() ORDER BY due_at LIMIT %s"
                " FOR UPDATE SKIP LOCKED)",
                [BATCH],
            )
            sent = cur.rowcount
    return {"sent": sent, "lateness_s": round((started - due_at).total_seconds(), 3)}


def ensure_schedule() -> None:
    """Every minute on the deadline cluster."""
    Schedule.objects.update_or_create(
        name="demo:send-due-reminders",
        defaults={
            "func": "demo.tasks.send_due_reminders",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
            "cluster": DEADLINE_CLUSTER,
            "intended_date_kwarg": "due",
            "next_run": timezone.now(),
        },
    )
