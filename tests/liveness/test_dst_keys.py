"""Run keys are unique per tick across DST changes, and stay readable."""

from __future__ import annotations

from datetime import UTC, datetime

from retention.schedule_math import ticks_between
from runs.actions import run_key_for, trigger_run
from runs.models import Run
from tests.factories import approved_policy


def test_the_repeated_hour_of_a_fall_back_gets_its_own_runs(make_user, events):
    policy = approved_policy(
        make_user, slug="ny", table="public.rr_events", key="id", timestamp="occurred_at",
        retention="7 days", schedule="*/30 * * * *", timezone="America/New_York",
    )  # fmt: skip
    # 2026-11-01 01:00–02:00 happens twice in New York (EDT, then EST)
    ticks = list(
        ticks_between(
            policy,
            datetime(2026, 11, 1, 4, 50, tzinfo=UTC),
            datetime(2026, 11, 1, 7, 10, tzinfo=UTC),
        )
    )
    assert len(ticks) == 5
    keys = [run_key_for(policy, tick) for tick in ticks]
    assert keys == [
        "ny/2026-11-01T01:00-04:00",
        "ny/2026-11-01T01:30-04:00",
        "ny/2026-11-01T01:00-05:00",
        "ny/2026-11-01T01:30-05:00",
        "ny/2026-11-01T02:00",
    ]
    for tick in ticks:
        run, created = trigger_run(policy, tick=tick)
        assert created, run.run_key
    assert Run.objects.filter(policy=policy).count() == 5
    # an ordinary tick keeps its plain wall-clock key
    assert run_key_for(policy, datetime(2026, 11, 2, 8, 0, tzinfo=UTC)) == "ny/2026-11-02T03:00"
