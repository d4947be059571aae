from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.actions import run_key_for, trigger_run
from runs.models import Lease, Run
from tests.runs.conftest import NOW


def test_a_trigger_creates_one_run_with_the_cutoff_derived_from_the_tick(events_policy):
    tick = NOW.replace(hour=3, minute=0)
    run, created = trigger_run(events_policy, tick=tick)
    assert created
    assert run.run_key == "events/2026-11-30T03:00"
    assert run.cutoff == tick - timedelta(days=20)
    assert run.policy_version == events_policy.approved_version
    assert run.state == Run.State.ACTIVE


def test_duplicate_triggers_converge_on_one_run(events_policy, make_user):
    tick = NOW.replace(hour=3, minute=0)
    first, created_first = trigger_run(events_policy, tick=tick)
    oncall = make_user("olga", "oncall")
    second, created_second = trigger_run(events_policy, tick=tick, source="manual", actor=oncall)
    assert (created_first, created_second) == (True, False)
    assert first.pk == second.pk
    assert Run.objects.count() == 1


def test_starting_a_run_publishes_one_lease_per_allowed_worker(events_policy):
    from django_q.models import OrmQ

    run, _ = trigger_run(events_policy, tick=NOW)
    assert Lease.objects.filter(run=run).count() == 2
    assert OrmQ.objects.count() == 2  # the ledger is the outbox: same transaction


def test_a_second_run_waits_while_the_first_is_active(events_policy):
    first, _ = trigger_run(events_policy, tick=NOW - timedelta(days=1))
    second, _ = trigger_run(events_policy, tick=NOW)
    second.refresh_from_db()
    assert first.state == Run.State.ACTIVE
    assert second.state == Run.State.WAITING
    assert first.run_key in second.state_reason


def test_the_cutoff_keeps_its_wall_clock_across_a_dst_change(make_user, events):
    from tests.factories import approved_policy

    policy = approved_policy(
        make_user, slug="berlin", table="public.rr_events", key="id", timestamp="occurred_at",
        retention="7 days", schedule="0 2 * * *", timezone="Europe/Berlin",
    )  # fmt: skip
    # 2026-03-29 is the spring-forward day in Berlin; a week earlier was winter time.
    tick = datetime(2026, 3, 30, 0, 0, tzinfo=UTC)  # 02:00 CEST
    run, _ = trigger_run(policy, tick=tick)
    assert run.run_key == "berlin/2026-03-30T02:00"
    assert run.cutoff == datetime(2026, 3, 23, 1, 0, tzinfo=UTC)  # 02:00 CET a week earlier


def test_run_keys_are_the_tick_in_the_policy_timezone(events_policy):
    events_policy.timezone = "America/New_York"
    tick = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert run_key_for(events_policy, tick) == "events/2026-11-30T03:00"


def test_a_policy_without_an_approved_version_cannot_run(db):
    from retention.models import Policy
    from runs.actions import ActionError

    policy = Policy.objects.create(slug="draft-only", name="draft", schedule="0 3 * * *")
    with pytest.raises(ActionError, match="no approved version"):
        trigger_run(policy, tick=NOW)
    assert Run.objects.count() == 0


def test_a_run_far_larger_than_its_preview_is_held_for_confirmation(events_policy, make_user):
    from django.db import connection

    from runs.actions import confirm_run

    baseline = events_policy.approved_version.preview["eligible"]
    with connection.cursor() as cur:  # a burst of old rows arrives after approval
        cur.execute(
            "INSERT INTO public.rr_events SELECT 100000 + g, 2, %s, 'closed', 'x'"
            " FROM generate_series(1, %s) AS g",
            [NOW - timedelta(days=30), max(10_001, baseline * 4)],
        )
    run, _ = trigger_run(events_policy, tick=NOW)
    assert run.state == Run.State.CONFIRM
    assert "held for confirmation" in run.state_reason
    assert not Lease.objects.filter(run=run).exists()
    confirm_run(run, actor=make_user("oscar", "oncall"), reason="expected: backfill of old events")
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE
    assert Lease.objects.filter(run=run).count() == 2


def test_a_run_within_its_preview_starts_at_once_and_knows_its_size(events_policy):
    from tests.runs.conftest import count

    run, _ = trigger_run(events_policy, tick=NOW)
    assert run.state == Run.State.ACTIVE
    # rows whose keep rule is undecidable (status NULL) are kept too
    expected = count("rr_events", "occurred_at < %s AND status <> 'disputed'", [run.cutoff])
    assert run.expected_rows == expected


def test_a_days_period_is_accepted_once_that_days_tick_has_passed():
    """``--period 2026-12-01`` at 23:40 names that day's 03:00 tick, which has passed; before
    03:00 no tick of the day has, and the refusal says when the first one comes."""
    from zoneinfo import ZoneInfo

    from retention.schedule_math import tick_for_period
    from retention.spec import PolicySpec

    berlin = ZoneInfo("Europe/Berlin")
    spec = PolicySpec.parse(
        {"slug": "p", "table": "t", "key": "id", "timestamp": "at", "retention": "30 days",
         "schedule": "0 3 * * *", "timezone": "Europe/Berlin"}
    )  # fmt: skip
    late = datetime(2026, 12, 1, 23, 40, tzinfo=berlin)
    assert tick_for_period(spec, "2026-12-01", late) == datetime(2026, 12, 1, 3, tzinfo=berlin)
    assert tick_for_period(spec, "2026-11-30", late) == datetime(2026, 11, 30, 3, tzinfo=berlin)
    early = datetime(2026, 12, 1, 2, 30, tzinfo=berlin)
    with pytest.raises(ValueError) as refused:
        tick_for_period(spec, "2026-12-01", early)
    assert str(refused.value) == (
        "no tick of 2026-12-01 has passed yet: the first is at 03:00 (Europe/Berlin); "
        "give an earlier period or trigger after it"
    )
    with pytest.raises(ValueError, match="^the period is in the future"):
        tick_for_period(spec, "2026-12-02", late)
