from __future__ import annotations

from datetime import UTC, datetime

from django_q.models import Schedule

from retention.schedule_math import latest_tick, next_tick
from runs import tasks
from runs.engine import schedules
from runs.models import DeadLetter, Run
from tests.factories import approved_policy


def test_approving_a_policy_arms_its_schedule_on_the_cleanup_cluster(events_policy):
    schedule = Schedule.objects.get(name=schedules.schedule_name(events_policy))
    assert schedule.cluster == "cleanup"
    assert schedule.intended_date_kwarg == "tick"
    assert schedule.repeats == 1
    assert schedule.next_run.astimezone(UTC).strftime("%H:%M") == "03:00"


def test_a_scheduled_firing_creates_the_run_of_its_tick_and_rearms_for_the_next(
    events_policy, monkeypatch
):
    from datetime import timedelta

    tick = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    monkeypatch.setattr(tasks, "_now", lambda: tick + timedelta(seconds=30))  # on time
    outcome = tasks.trigger_scheduled(policy_id=events_policy.pk, tick=tick.isoformat())
    assert "created run events/2026-11-29T03:00" in outcome
    run = Run.objects.get()
    assert run.tick == tick
    schedule = Schedule.objects.get(name=schedules.schedule_name(events_policy))
    assert schedule.repeats == 1 and schedule.next_run > tick


def test_a_malformed_trigger_message_is_dead_lettered_not_raised(db):
    outcome = tasks.trigger_scheduled(policy_id="1; DROP TABLE runs_run", tick="yesterday")
    assert outcome.startswith("dead-lettered")
    letter = DeadLetter.objects.get()
    assert letter.error_class == "malformed"
    assert Run.objects.count() == 0


def test_a_malformed_drain_message_is_dead_lettered_not_raised(db):
    outcome = tasks.drain_lease("x", None, 1)
    assert outcome.startswith("dead-lettered")
    assert DeadLetter.objects.get().error_class == "malformed"


def test_daily_ticks_keep_their_wall_clock_across_dst(make_user, events):
    policy = approved_policy(
        make_user, slug="ny", table="public.rr_events", key="id", timestamp="occurred_at",
        retention="7 days", schedule="30 2 * * *", timezone="America/New_York",
    )  # fmt: skip
    # 2026-11-01: clocks fall back at 02:00 EDT -> 01:00 EST
    first = next_tick(policy, datetime(2026, 10, 30, 12, 0, tzinfo=UTC))
    second = next_tick(policy, first)
    third = next_tick(policy, second)
    assert first == datetime(2026, 10, 31, 6, 30, tzinfo=UTC)  # 02:30 EDT
    assert second == datetime(2026, 11, 1, 7, 30, tzinfo=UTC)  # 02:30 EST, 25 hours later
    assert third == datetime(2026, 11, 2, 7, 30, tzinfo=UTC)
    assert latest_tick(policy, second) == second
    assert latest_tick(policy, datetime(2026, 11, 1, 7, 29, tzinfo=UTC)) == first


def test_the_reconciler_keeps_guard_samples_and_queue_results_bounded(db):
    from datetime import timedelta

    from django.utils import timezone

    from runs.engine.reconciler import prune_own_tables
    from runs.models import GuardSample

    old = GuardSample.objects.create(values={}, tables={})
    GuardSample.objects.filter(pk=old.pk).update(taken_at=timezone.now() - timedelta(days=2))
    fresh = GuardSample.objects.create(values={}, tables={})
    report = prune_own_tables(timezone.now())
    assert report["GuardSample"] == 1
    assert list(GuardSample.objects.values_list("pk", flat=True)) == [fresh.pk]
