"""What a retention and a timestamp mean: hours are elapsed time, days and weeks are wall-clock
time in the policy's timezone; a ``timestamp without time zone`` column holds wall-clock time in
``timestamp_zone`` (default: the policy's timezone). Each case runs a real run on PostgreSQL
and checks exactly which rows went."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from retention.preview import preview
from retention.spec import SpecError
from runs.actions import trigger_run
from runs.engine import worker
from runs.models import Run
from tests.factories import approved_policy, events_spec
from tests.runs.conftest import count

pytestmark = pytest.mark.usefixtures("no_guard")

# (timezone, local noon on a day whose midnight-to-midnight is 23 or 25 hours)
DST_DAYS = [
    ("Europe/Berlin", datetime(2026, 3, 29, 12, 0)),  # spring forward: 23-hour day
    ("Europe/Berlin", datetime(2026, 10, 25, 12, 0)),  # fall back: 25-hour day
    ("America/New_York", datetime(2026, 3, 8, 12, 0)),
    ("America/New_York", datetime(2026, 11, 1, 12, 0)),
]


def _table(tick: datetime, *, column_type: str = "timestamptz", zone: str = "UTC") -> None:
    """``public.rr_times``: one row every 10 minutes from 30 to 18 hours before ``tick``.
    For a ``timestamp`` column the values are the wall-clock time in ``zone``."""
    value = "g" if column_type == "timestamptz" else "(g AT TIME ZONE %(zone)s)"
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS public.rr_times")
        cur.execute(
            f"CREATE TABLE public.rr_times (id bigint PRIMARY KEY, occurred_at {column_type} NOT NULL)"
        )
        cur.execute(
            f"""INSERT INTO public.rr_times
                SELECT row_number() OVER (ORDER BY g), {value}
                FROM generate_series(%(tick)s::timestamptz - interval '30 hours',
                                     %(tick)s::timestamptz - interval '18 hours',
                                     interval '10 minutes') AS g""",
            {"tick": tick, "zone": zone},
        )
        cur.execute("ANALYZE public.rr_times")


def _policy(make_user, **overrides):
    fields = events_spec(
        slug="times", table="rr_times", tenant=None, keep=[], chunk_size=10, **overrides
    )
    return approved_policy(make_user, **fields)


def _run(policy, tick: datetime) -> Run:
    run, _ = trigger_run(policy, tick=tick)
    worker.drain(run.pk, budget_s=60)
    run.refresh_from_db()
    assert run.state == Run.State.DRAINED, run.state_reason
    return run


def _instants_deleted(tick: datetime) -> int:
    """How many rows were deleted, read as the 10-minute steps the table was built from."""
    return 73 - count("rr_times")


def _steps_before(tick: datetime, cutoff: datetime) -> int:
    """Rows of ``_table(tick)`` strictly older than ``cutoff``."""
    first = tick - timedelta(hours=30)
    return sum(1 for i in range(73) if first + timedelta(minutes=10 * i) < cutoff)


@pytest.mark.parametrize(("zone", "local_noon"), DST_DAYS)
@pytest.mark.parametrize("retention", ["24 hours", "1 day"])
def test_hours_are_elapsed_time_and_days_are_wall_clock_on_dst_days(
    db, make_user, zone, local_noon, retention
):
    tz = zoneinfo.ZoneInfo(zone)
    tick = local_noon.replace(tzinfo=tz).astimezone(UTC)
    _table(tick)
    policy = _policy(make_user, retention=retention, timezone=zone)

    run = _run(policy, tick)

    elapsed = tick - timedelta(hours=24)
    wall_clock = (local_noon - timedelta(days=1)).replace(tzinfo=tz).astimezone(UTC)
    assert abs(wall_clock - elapsed) == timedelta(hours=1)  # it is a DST day
    expected = elapsed if retention == "24 hours" else wall_clock
    assert run.cutoff == expected
    assert _instants_deleted(tick) == _steps_before(tick, expected)


@pytest.mark.parametrize(("zone", "local_noon"), DST_DAYS[:2])
def test_a_timestamp_without_time_zone_is_wall_clock_time_in_the_policy_timezone(
    db, make_user, zone, local_noon
):
    tz = zoneinfo.ZoneInfo(zone)
    tick = local_noon.replace(tzinfo=tz).astimezone(UTC)
    _table(tick, column_type="timestamp", zone=zone)
    policy = _policy(make_user, retention="1 day", timezone=zone)
    spec = policy.approved_version.parsed

    run = _run(policy, tick)

    expected = (local_noon - timedelta(days=1)).replace(tzinfo=tz).astimezone(UTC)
    assert run.cutoff == expected
    # every row whose wall-clock time is before noon the day before went, and only those
    assert count("rr_times", "occurred_at < %s", [local_noon - timedelta(days=1)]) == 0
    assert _instants_deleted(tick) == _steps_before(tick, expected)
    # the preview reads the column the same way
    shown = preview(spec, policy_id=policy.pk, now=tick + timedelta(days=1))
    assert shown["eligible"] == count("rr_times", "occurred_at < %s", [local_noon])


def test_timestamp_zone_says_which_clock_a_timestamp_column_holds(db, make_user):
    tick = datetime(2026, 3, 29, 10, 0, tzinfo=UTC)  # noon in Berlin
    _table(tick, column_type="timestamp", zone="UTC")  # the application writes UTC
    policy = _policy(make_user, retention="1 day", timezone="Europe/Berlin", timestamp_zone="UTC")

    run = _run(policy, tick)

    assert run.cutoff == datetime(2026, 3, 28, 11, 0, tzinfo=UTC)
    assert _instants_deleted(tick) == _steps_before(tick, run.cutoff)


def test_timestamp_zone_is_refused_for_a_timestamptz_column(db, make_user):
    _table(datetime(2026, 3, 29, 10, 0, tzinfo=UTC))
    with pytest.raises(SpecError, match="timestamp_zone .* timestamp with time zone"):
        _policy(make_user, retention="1 day", timestamp_zone="Europe/Berlin")


def test_timestamp_zone_must_be_a_known_zone(db, make_user):
    _table(datetime(2026, 3, 29, 10, 0, tzinfo=UTC), column_type="timestamp")
    with pytest.raises(SpecError, match="timestamp_zone 'Mars/Olympus' is not a known"):
        _policy(make_user, retention="1 day", timestamp_zone="Mars/Olympus")
