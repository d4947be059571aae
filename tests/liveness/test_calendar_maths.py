"""Cutoffs and schedule ticks around the calendar's edges: DST gaps that are not an hour long
(Lord Howe's 30 minutes, Troll's two hours), a whole skipped day (Apia, 2011), negative DST
(Dublin), repeated hours, and cron times that fall into a skipped or repeated hour.

A wall-clock cutoff that lands on a local time that does not exist, or exists twice, is read
the way PostgreSQL reads such a ``timestamp`` (docs/policies.md, "Time"): compared here with
the server itself for thousands of instants."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

from django.db import connection

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
