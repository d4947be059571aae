"""Cutoffs and schedule ticks around the calendar's edges: DST gaps that are not an hour long
(Lord Howe's 30 minutes, Troll's two hours), a whole skipped day (Apia, 2011), negative DST
(Dublin), repeated hours, and cron times that fall into a skipped or repeated hour.

A wall-clock cutoff that lands on a local time that does not exist, or exists twice, is read
the way PostgreSQL reads such a ``timestamp`` (docs/policies.md, "Time"): compared here with
the server itself for thousands of instants."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from retention.schedule_math import latest_tick, next_tick, ticks_before, ticks_between
from retention.spec import PolicySpec
from tests.factories import events_spec

ZONES = (
    "Australia/Lord_Howe",  # a 30-minute DST change
    "Pacific/Apia",  # skipped 2011-12-30 whole
    "Europe/Dublin",  # negative DST in the tz database (winter is the "daylight" time)
    "America/New_York",
    "Europe/Berlin",
    "Antarctica/Troll",  # a two-hour DST change
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Santiago",
)


def spec_in(zone: str, retention: str = "20 days", schedule: str = "0 3 * * *") -> PolicySpec:
    return PolicySpec.parse(events_spec(timezone=zone, retention=retention, schedule=schedule))


def at(zone: str, text: str) -> datetime:
    """An instant written as local wall-clock time that exists once."""
    return datetime.fromisoformat(text).replace(tzinfo=zoneinfo.ZoneInfo(zone)).astimezone(UTC)


def transitions(zone: str, start: int, end: int) -> list[datetime]:
    """The instants the zone's UTC offset changed, between the two years (to the minute)."""
    tz = zoneinfo.ZoneInfo(zone)
    out = []
    t = datetime(start, 1, 1, tzinfo=UTC)
    stop = datetime(end, 1, 1, tzinfo=UTC)
    step = timedelta(hours=6)
    while t < stop:
        if t.astimezone(tz).utcoffset() != (t + step).astimezone(tz).utcoffset():
            lo, hi = t, t + step
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(tz).utcoffset() == lo.astimezone(tz).utcoffset():
                    lo = mid
                else:
                    hi = mid
            out.append(hi.replace(second=0, microsecond=0))
        t += step
    return out


def test_a_day_based_cutoff_in_lord_howes_half_hour_gap_reads_the_time_before_the_change():
    spec = spec_in("Australia/Lord_Howe")
    # 2026-10-04 02:00 +10:30 → 02:30 +11:00: 20 days before 02:15 on the 24th does not exist
    tick = at("Australia/Lord_Howe", "2026-10-24T02:15")
    cutoff = spec.cutoff_for(tick)
    assert cutoff == datetime(2026, 10, 3, 15, 45, tzinfo=UTC)  # 02:15+10:30 = 02:45+11:00
    assert cutoff.astimezone(zoneinfo.ZoneInfo("Australia/Lord_Howe")).isoformat() == (
        "2026-10-04T02:45:00+11:00"
    )


def test_a_cutoff_on_apias_skipped_day_is_never_after_the_tick():
    spec = spec_in("Pacific/Apia", retention="1 day")
    # 2011-12-29 23:59:59 -10:00 was followed by 2011-12-31 00:00 +14:00
    tick = at("Pacific/Apia", "2011-12-31T03:00")
    assert spec.cutoff_for(tick) == datetime(2011, 12, 30, 13, 0, tzinfo=UTC)  # 03:00 -10:00
    assert spec.cutoff_for(tick) <= tick
    week = spec_in("Pacific/Apia", retention="1 week")
    assert week.cutoff_for(at("Pacific/Apia", "2012-01-06T03:00")) == datetime(
        2011, 12, 30, 13, 0, tzinfo=UTC
    )


def test_a_cutoff_in_a_repeated_hour_takes_the_instant_after_the_change_as_postgresql_does():
    spec = spec_in("America/New_York", retention="1 day")
    # 2026-11-01 01:30 happened at -04:00 and again at -05:00
    tick = at("America/New_York", "2026-11-02T01:30")
    assert spec.cutoff_for(tick) == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)  # 01:30 -05:00


def test_wall_clock_cutoffs_match_postgresql_for_every_instant_around_each_dst_change(db):
    """For each zone's offset changes from 2011 to 2027, ticks every quarter of an hour from three
    hours before to three hours after the change, a whole number of days later: the cutoff
    lands before, in, and after each gap or repeated interval."""
    cases = []
    for zone in ZONES:
        for change in transitions(zone, 2011, 2028):
            for days in (1, 7, 20):
                for quarter in range(-12, 13):
                    cases.append((change + timedelta(days=days, minutes=15 * quarter), zone, days))
    assert len(cases) > 5000
    with connection.cursor() as cur:
        cur.execute(
            "SELECT ((c.tick AT TIME ZONE c.zone) - make_interval(days => c.days))"
            " AT TIME ZONE c.zone FROM unnest(%s::timestamptz[], %s::text[], %s::int[])"
            " WITH ORDINALITY AS c(tick, zone, days, n) ORDER BY c.n",
            [[c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]],
        )
        expected = [row[0] for row in cur.fetchall()]
    specs = {}
    wrong = []
    for (tick, zone, days), pg in zip(cases, expected, strict=True):
        spec = specs.setdefault((zone, days), spec_in(zone, retention=f"{days} days"))
        ours = spec.cutoff_for(tick)
        if ours != pg:
            wrong.append(f"{zone} tick {tick.isoformat()} − {days} d: ours {ours}, PostgreSQL {pg}")
    assert not wrong, f"{len(wrong)} of {len(cases)} differ:\n" + "\n".join(wrong[:20])


# -- schedule ticks: one firing per wall-clock time per day, as cron does ------------------


@pytest.mark.parametrize(
    "zone, day",
    [
        ("Europe/Dublin", "2026-10-25"),
        ("America/New_York", "2026-11-01"),
        ("Europe/Berlin", "2026-10-25"),
        ("Australia/Lord_Howe", "2026-04-05"),
    ],
)
def test_a_daily_cron_fires_once_on_the_day_its_hour_is_repeated(zone, day):
    # Lord Howe repeats 01:30–02:00 (a 30-minute change): "45 1 * * *" falls in it
    schedule = "45 1 * * *" if zone == "Australia/Lord_Howe" else "30 1 * * *"
    spec = spec_in(zone, schedule=schedule)
    start = at(zone, f"{day}T00:00") - timedelta(days=1)
    ticks = list(ticks_between(spec, start, start + timedelta(days=3)))
    local = [t.astimezone(zoneinfo.ZoneInfo(zone)).date().isoformat() for t in ticks]
    assert len(local) == len(set(local)) == 3, [t.isoformat() for t in ticks]
    on_the_day = next(
        t for t in ticks if t.astimezone(zoneinfo.ZoneInfo(zone)).date().isoformat() == day
    )
    # the first of the two instants, as cron runs it (and never again an hour later)
    tz = zoneinfo.ZoneInfo(zone)
    wall = datetime.fromisoformat(f"{day}T{schedule.split()[1]:0>2}:{schedule.split()[0]:0>2}")
    assert on_the_day == wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    assert next_tick(spec, on_the_day) > on_the_day + timedelta(hours=12)
    assert latest_tick(spec, on_the_day + timedelta(hours=1)) == on_the_day


@pytest.mark.parametrize(
    "zone, day, schedule, fires_at",
    [
        # 02:00 EST → 03:00 EDT: a 02:30 job runs when the clock jumps, as cron does
        ("America/New_York", "2026-03-08", "30 2 * * *", "2026-03-08T03:00"),
        ("Europe/Berlin", "2026-03-29", "15 2 * * *", "2026-03-29T03:00"),
        # 02:00 +10:30 → 02:30 +11:00
        ("Australia/Lord_Howe", "2026-10-04", "15 2 * * *", "2026-10-04T02:30"),
        ("Antarctica/Troll", "2026-03-29", "30 2 * * *", "2026-03-29T03:00"),
    ],
)
def test_a_cron_time_in_a_skipped_interval_fires_once_when_the_clock_jumps(
    zone, day, schedule, fires_at
):
    spec = spec_in(zone, schedule=schedule)
    start = at(zone, f"{day}T00:00") - timedelta(days=2)
    ticks = list(ticks_between(spec, start, start + timedelta(days=4)))
    jump = at(zone, fires_at)
    assert jump in ticks, [t.isoformat() for t in ticks]
    assert latest_tick(spec, jump + timedelta(minutes=5)) == jump
    assert next_tick(spec, jump - timedelta(minutes=1)) == jump


def test_apias_skipped_day_is_a_change_of_clock_that_daily_ticks_follow():
    """A day skipped by a change of the zone's clock (24 hours, beyond cron's three) has no
    tick of its own; the days around it keep their wall-clock time."""
    spec = spec_in("Pacific/Apia", schedule="0 3 * * *")
    start = at("Pacific/Apia", "2011-12-28T12:00")
    ticks = list(ticks_between(spec, start, at("Pacific/Apia", "2011-12-31T12:00")))
    assert ticks == [at("Pacific/Apia", "2011-12-29T03:00"), at("Pacific/Apia", "2011-12-31T03:00")]
    assert ticks[1] - ticks[0] == timedelta(hours=24)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York", "Europe/Dublin"])
def test_a_half_hourly_cron_follows_elapsed_time_through_both_dst_changes(zone):
    """A schedule whose minute or hour is a wildcard runs by the clock as it goes, as cron
    does: every half hour of the repeated hour, none of the skipped one."""
    spec = spec_in(zone, schedule="*/30 * * * *")
    for year_start in (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)):
        ticks = list(ticks_between(spec, year_start, year_start + timedelta(days=40), limit=5000))
        gaps = {b - a for a, b in zip(ticks, ticks[1:], strict=False)}
        assert gaps <= {timedelta(minutes=30)}, sorted(gaps)
        assert len(ticks) == 40 * 48


@pytest.mark.parametrize(
    "schedule, days", [("*/30 * * * *", 1), ("30 1,2 * * *", 3), ("45 1 * * *", 3)]
)
def test_the_ticks_before_a_tick_are_the_latest_ticks_asked_one_after_another(schedule, days):
    """``ticks_before`` (a catch-up's skipped ticks) walks the wall-clock times once; it names
    the same ticks, in the same order, as ``latest_tick`` asked again before each one — in the
    ``days`` before a tick half a day after every DST change of each zone in 2026 and Apia's
    skipped day, and when ``limit`` cuts it short."""
    for zone in ZONES:
        spec = spec_in(zone, schedule=schedule)
        year = 2011 if zone == "Pacific/Apia" else 2026
        for change in transitions(zone, year, year + 1):
            newest = latest_tick(spec, change + timedelta(hours=12))
            after = newest - timedelta(days=days)
            expected, tick = [], newest
            while True:
                tick = latest_tick(spec, tick - timedelta(microseconds=1))
                if tick <= after:
                    break
                expected.append(tick)
            assert expected, (zone, change.isoformat())
            got = ticks_before(spec, newest, after=after, limit=500)
            assert got == expected, (zone, change.isoformat())
            assert ticks_before(spec, newest, after=after, limit=7) == expected[:7]
